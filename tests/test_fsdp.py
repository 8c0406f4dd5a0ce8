"""distributed=fsdp (gpt/training/parallel.py): two CPU processes under torchrun (gloo), each
holding half of every weight, gradient and optimizer moment, train like one process with twice
the batch; each writes its own shards of the step checkpoints (gpt/checkpoints/shards.py), which
resume at 2, 1 and 4 processes and after a kill -9, sample and export.
Run: pytest tests/test_fsdp.py"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt.checkpoints import checkpoint, loading, runs
from gpt.config.model import RNNConfig
from helpers import NCCL_RULES, REPO, STEP_COUNTER, hooked_pythonpath, llama_folder, run_script, worker_pids

# fp32 training and Newton-Schulz: the comparison is of the sharding, not of bf16's rounding
EXACT = ["dtype=float32", "device=cpu", "threads=1"]
MUON = ["optim=muon", "optim.ns_dtype=float32"]
SMALL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=16"]
SHAPES = {"gpt2-block": ["model=gpt-micro", *SMALL], "llama": ["model=llama-nano", *SMALL, "model.mlp_hidden=64"]}


def _torchrun(n: int, args: list[str], cwd, root, **env_extra) -> subprocess.CompletedProcess:
    """`n` processes of train.py under torchrun, their collectives held to NCCL's rules (helpers.NCCL_RULES)."""
    strict = hooked_pythonpath(Path(cwd) / ".nccl-rules", NCCL_RULES)
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": strict}
    env.update(env_extra)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(REPO / "train.py")]
    return subprocess.run([*launch, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _metrics(run_dir, kind) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r["kind"] == kind}


def _losses(run_dir) -> dict[int, float]:
    return {s: r["loss"] for s, r in _metrics(run_dir, "train").items()}


def _max_diff(a: dict, b: dict, key: str) -> float:
    assert sorted(a) == sorted(b)
    return max(abs(a[s][key] - b[s][key]) for s in a)


def test_fsdp_in_one_process_says_so_once_and_trains(tmp_path, data_root):
    root, data = data_root
    proc = run_script("train.py", ["debug=tiny", *data, "distributed=fsdp", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("notice: distributed=fsdp shards the model over the processes torchrun starts") == 1
    assert runs.latest(tmp_path / "run") is not None


def test_a_recurrent_model_from_a_checkpoint_is_refused_in_one_line():
    """(model=lstm distributed=fsdp is refused before anything runs; a recurrent model can still
    arrive through init_from or a resume, and is refused where it would be sharded.)"""
    from gpt.errors import TinyGPTError
    from gpt.model.rnn import RecurrentLM
    from gpt.runtime import devices
    from gpt.training import parallel

    model = RecurrentLM(RNNConfig(arch="lstm", vocab_size=16))
    with pytest.raises(TinyGPTError, match="this run's model is recurrent: use distributed=ddp"):
        parallel.shard(model, devices.Runtime(torch.device("cpu"), torch.float32, compile=False))


def test_cpu_offload_puts_every_unit_under_torchs_offload_policy(tmp_path):
    """parallel.shard(offload=True): the blocks and the root each offload their shards (in one
    process of a gloo group, where FSDP2 runs without torchrun)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    from gpt.model import GPT, GPTConfig
    from gpt.runtime import devices
    from gpt.training import parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        rt = devices.Runtime(torch.device("cpu"), torch.float32, compile=False)
        for offload in (False, True):
            model = parallel.shard(GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16)), rt, offload)
            units = [m for m in model.modules() if isinstance(m, FSDPModule)]
            policies = [type(u._get_fsdp_state()._fsdp_param_group.offload_policy) for u in units]
            assert len(units) == 3 and all((p is CPUOffloadPolicy) == offload for p in policies)
            assert not any(u._get_fsdp_state()._mp_policy.cast_forward_inputs for u in units)  # (mixed_precision's)
    finally:
        dist.destroy_process_group()


def test_under_a_bf16_policy_the_rope_tables_reach_attention_in_fp32(tmp_path):
    """FSDP2 with bf16 weights (parallel.mixed_precision, as on CUDA) in one process of a gloo
    group: the blocks' inputs are not cast, so RoPE's cos and sin enter every attention layer in
    fp32 while the residual stream is bf16."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from gpt.model import GPT, GPTConfig
    from gpt.runtime import devices
    from gpt.training import parallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        rt = devices.Runtime(torch.device("cpu"), torch.float32, compile=False)
        policy = parallel.mixed_precision(rt, param_dtype=torch.bfloat16)
        model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16, pos_encoding="rope"))
        seen = []
        for block in model.transformer.h:
            block.attn.register_forward_pre_hook(lambda m, args: seen.append((args[0].dtype, args[3][0].dtype, args[3][1].dtype)))
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        logits, _ = model(torch.randint(0, 16, (2, 8)))
        assert seen == [(torch.bfloat16, torch.float32, torch.float32)] * 2 and torch.isfinite(logits).all()
    finally:
        dist.destroy_process_group()


def _sample_sharded(rank: int, store: str, out: str) -> None:
    """One of two gloo processes: the same GPT, sharded, sampled with a seed of this rank's own."""
    import torch.distributed as dist

    from gpt.config import SamplingSettings
    from gpt.generation import generate
    from gpt.model import GPT, GPTConfig
    from gpt.runtime import devices
    from gpt.tokenizers.char import CharTokenizer
    from gpt.training import parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, n_embd=16))
        model = parallel.shard(model, devices.Runtime(torch.device("cpu"), torch.float32, compile=False), False)
        tokenizer = CharTokenizer(list("abcdefghijklmnop"))
        texts = generate(
            model, tokenizer, ["ab"], SamplingSettings(max_new_tokens=24, temperature=1.0, seed=100 + rank), lockstep=True
        )
        with open(f"{out}.{rank}", "w") as f:
            f.write(texts[0][0])
    finally:
        dist.destroy_process_group()


def test_sharded_sampling_takes_rank_0s_tokens_on_every_process(tmp_path):
    """A sharded model decodes in lockstep: every process appends rank 0's tokens, so none can
    end sooner than another (here the processes' own seeds differ, as two devices' rounding might)."""
    import torch.multiprocessing as mp

    mp.spawn(_sample_sharded, args=(str(tmp_path / "store"), str(tmp_path / "text")), nprocs=2)
    texts = [(tmp_path / f"text.{rank}").read_text() for rank in (0, 1)]
    assert len(texts[0]) == 24 and texts[0] == texts[1]


def _load_sharded(rank: int, world: int, store: str, out: str) -> None:
    """One of `world` gloo processes: a GPT built on the meta device, sharded, filled from rank 0's
    whole weights by load_from_rank_0 while recording the largest tensor each process allocates;
    each writes its shards' match with the whole model's rows, and that largest allocation."""
    import json

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpt.model import GPT, GPTConfig, meta
    from gpt.runtime import devices
    from gpt.training import parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        config = GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32)  # 65 rows: uneven pieces
        torch.manual_seed(0)
        reference = GPT(config)
        whole = {k: v.clone() for k, v in reference.state_dict().items()} if rank == 0 else {}
        model = GPT(config)
        meta.to_meta(model)
        model = parallel.shard(model, devices.Runtime(torch.device("cpu"), torch.float32, compile=False))
        parallel.materialize(model, torch.device("cpu"))
        largest = [0]

        class Allocations(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                result = func(*args, **(kwargs or {}))
                if func in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_strided.default):
                    largest[0] = max(largest[0], result.numel())
                return result

        with Allocations():
            parallel.load_from_rank_0(model, whole, torch.device("cpu"))
        rows_match = all(
            torch.equal(parallel.local(p), reference.state_dict()[name].chunk(world)[rank])
            if rank < len(reference.state_dict()[name].chunk(world))
            else parallel.local(p).numel() == 0
            for name, p in model.state_dict().items()
        )
        # an optimizer state tensor of a whole checkpoint, cut like its parameter: the same pieces, copied
        state = {name: t * 2 + 1 for name, t in reference.state_dict().items()}
        cuts = {name: parallel.shard_like(state[name], p) for name, p in model.state_dict().items()}
        cut_match = all(
            isinstance(c, DTensor)
            and c.placements == p.placements
            and torch.equal(
                c.to_local(), state[name].chunk(world)[rank] if rank < len(state[name].chunk(world)) else c.to_local()
            )
            and c.to_local().numel() == parallel.local(p).numel()
            and c.to_local().untyped_storage().data_ptr() != state[name].untyped_storage().data_ptr()
            for (name, c), p in zip(cuts.items(), model.state_dict().values())
        )
        shapes = [t.shape for t in reference.state_dict().values()]
        piece = max(-(-s[0] // world) * (s.numel() // s[0]) for s in shapes)  # the largest of torch.chunk's pieces
        with open(f"{out}.{rank}", "w") as f:
            json.dump(
                {
                    "rows_match": rows_match,
                    "cut_match": cut_match,
                    "largest": largest[0],
                    "piece": piece,
                    "whole": max(s.numel() for s in shapes),
                },
                f,
            )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_load_from_rank_0_sends_each_process_its_rows_only(tmp_path, world):
    """load_from_rank_0 puts torch.chunk's piece r of every whole tensor into rank r's shard (65
    rows: uneven pieces, padded for the scatter), and no process but rank 0 allocates more than
    the largest piece (torch's distribute_tensor would have each allocate the whole shape to
    receive into: device memory on a GPU)."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_load_sharded, args=(world, str(tmp_path / "store"), str(tmp_path / "out")), nprocs=world)
    got = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(world)]
    assert all(g["rows_match"] for g in got)
    assert all(g["cut_match"] for g in got)  # shard_like cuts a whole tensor into the same pieces
    assert all(0 < g["largest"] <= g["piece"] < g["whole"] for g in got[1:]), got  # the recorder saw their pieces, no more


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, optim, extra, tolerance",
    [
        ("gpt2-block", "adamw", [], 1e-5),
        ("gpt2-block", "muon", [], 1e-5),
        ("llama", "adamw", [], 1e-5),
        ("llama", "muon", ["train.grad_accum_steps=2"], 1e-5),  # gradients reduce-scattered per micro-batch
        # compiled block by block, recomputing activations in the backward pass; the one process
        # compiles its whole model, so kernels are fused differently
        ("llama", "muon", ["compile=true", "model.activation_checkpointing=true"], 1e-4),
    ],
    ids=["gpt2-block-adamw", "gpt2-block-muon", "llama-adamw", "llama-muon-accumulating", "llama-muon-compiled-recomputing"],
)
def test_two_sharded_processes_train_like_one(tmp_path, data_root, shape, optim, extra, tolerance):
    """20 steps, the same global batch, the initial weights rank 0's (drawn as one process draws them):
    losses within 1e-5 of one process (evals: micro-batches of 4 and 8 rows differ, see
    tests/test_distributed.py's eval test), with the sample training shows at every eval and at the end computed by both ranks in lockstep; the
    checkpoint holds whole tensors (the same weights as one process's)."""
    root, data = data_root
    args = [
        *data,
        *SHAPES[shape],
        *(MUON if optim == "muon" else ["optim=adamw"]),
        *EXACT,
        *extra,
        "train.max_iters=20",
        "train.eval_interval=10",
    ]
    args += ["train.eval_iters=2", "train.log_interval=1", "optim.warmup_iters=5", "train.sample_tokens=20"]
    one = run_script("train.py", [*args, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert one.returncode == 0, one.stderr[-2000:]
    # dynamo names each recompile: a compiled run's blocks must keep their training graph (the
    # samples between steps once made each rank recompile past dynamo's limit, then train eager)
    watch = {"TORCH_LOGS": "recompiles"} if "compile=true" in extra else {}
    two = _torchrun(
        2, [*args, "train.batch_size=4", "distributed=fsdp", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path, root, **watch
    )
    assert two.returncode == 0, two.stderr[-3000:]
    if watch:  # one graph for training, one for evaluation (no gradients): one recompile per rank
        assert "recompile_limit" not in two.stderr, two.stderr[-3000:]
        assert two.stderr.count("Recompiling function") <= 2, two.stderr[-3000:]
    accum = 2 if "train.grad_accum_steps=2" in extra else 1
    assert "FSDP2 over 2 processes" in two.stdout and f"global batch of {128 * accum}" in two.stdout
    assert "rank 0 built the initial weights and sent each process its shards" in two.stdout
    assert "sample at step 20" in two.stdout and two.stdout.count("sample at step 20") == 1  # rank 0 shows it
    assert len(_metrics(tmp_path / "one", "train")) == 20
    assert _max_diff(_metrics(tmp_path / "one", "train"), _metrics(tmp_path / "two", "train"), "loss") <= tolerance
    a, b = (checkpoint.load(runs.latest(tmp_path / d)) for d in ("one", "two"))
    assert a.model.keys() == b.model.keys() and all(a.model[k].shape == b.model[k].shape for k in a.model)
    assert max((a.model[k] - b.model[k]).abs().max().item() for k in a.model) <= tolerance
    tied = [ck.model["lm_head.weight"].data_ptr() == ck.model["transformer.wte.weight"].data_ptr() for ck in (a, b)]
    assert tied[0] == tied[1] == (shape == "gpt2-block")  # a tied weight saved once, as one process saves it
    state_a, state_b = a.training.optimizer["state"], b.training.optimizer["state"]
    assert all(state_a[i][k].shape == state_b[i][k].shape for i in state_a for k in state_a[i])
    _assert_sharded_by(2, runs.latest(tmp_path / "two"))
    assert torch.load(tmp_path / "two" / "checkpoints" / runs.BEST, weights_only=True)["format"] == 3  # weights, whole


@pytest.mark.slow
def test_a_sharded_step_reads_nothing_on_the_host_and_muon_exchanges_twice(tmp_path, data_root):
    """Under FSDP2 a training step queues its work and moves on: no tensor is read on the host
    in any step between logs (bool(t), .item(), ...: on a GPU each is a wait for the device; the
    non-finite guard used to read its flag every step), and the optimizer's step issues two
    collectives (Muon's two all-to-alls; 28 here when it gathered matrix by matrix): no more than
    the optimizer's parameter groups."""
    root, data = data_root
    args = [*data, *SHAPES["gpt2-block"], *MUON, *EXACT, "train.max_iters=6", "train.eval_interval=6"]
    args += ["train.eval_iters=1", "train.log_interval=100", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    (tmp_path / "hooks").mkdir()
    hooks = hooked_pythonpath(tmp_path / "hooks", NCCL_RULES + STEP_COUNTER)
    two = _torchrun(
        2,
        [*args, "train.batch_size=4", "distributed=fsdp", f"hydra.run.dir={tmp_path / 'two'}"],
        tmp_path,
        root,
        PYTHONPATH=hooks,
        STEP_COUNTS=str(tmp_path / "counts-"),
    )
    assert two.returncode == 0, two.stderr[-3000:]
    for rank in (0, 1):
        steps = [json.loads(line) for line in (tmp_path / f"counts-{rank}").read_text().splitlines()]
        assert len(steps) == 6
        assert [s["reads"] for s in steps] == [0] * 6, (rank, steps)
        assert all(s["collectives"] == 2 <= s["groups"] for s in steps), (rank, steps)


@pytest.mark.slow
def test_one_sharded_process_compiled_and_recomputing_trains_like_one_compiled_process(tmp_path, data_root):
    """`torchrun --nproc_per_node=1 train.py distributed=fsdp compile=true
    model.activation_checkpointing=true`: FSDP2 over a group of one, its blocks compiled one by
    one and their activations recomputed in the backward, trains within 1e-4 of one process
    compiling its whole model, without a recompile past the training and evaluation graphs."""
    root, data = data_root
    args = [*data, *SHAPES["llama"], *MUON, *EXACT, "compile=true", "model.activation_checkpointing=true"]
    args += ["train.max_iters=10", "train.eval_interval=10", "train.eval_iters=2", "train.log_interval=1"]
    args += ["train.sample_tokens=0", "train.eval_sample_tokens=0"]
    one = run_script("train.py", [*args, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert one.returncode == 0, one.stderr[-2000:]
    alone = _torchrun(
        1, [*args, "distributed=fsdp", f"hydra.run.dir={tmp_path / 'alone'}"], tmp_path, root, TORCH_LOGS="recompiles"
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "FSDP2 over 1 process" in alone.stdout and "compile on" in alone.stdout
    assert "recompile_limit" not in alone.stderr and alone.stderr.count("Recompiling function") <= 1, alone.stderr[-3000:]
    assert len(_losses(tmp_path / "alone")) == 10
    assert _max_diff(_metrics(tmp_path / "one", "train"), _metrics(tmp_path / "alone", "train"), "loss") <= 1e-4


@pytest.mark.slow
def test_torchrun_with_one_process_shards_over_it_with_cpu_offload(tmp_path, data_root):
    """`torchrun --nproc_per_node=1 train.py distributed=fsdp cpu_offload=true` shards over a
    group of one (on one GPU, FSDP2's CPU offload is what fits a larger model): it says so, its
    losses equal a plain one-process run's within 1e-5 (fp32), its checkpoint is sharded by one
    process, and sample.py reads it."""
    root, data = data_root
    args = [*data, *SHAPES["gpt2-block"], "optim=adamw", *EXACT, "train.max_iters=10", "train.eval_interval=10"]
    args += ["train.eval_iters=2", "train.log_interval=1", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    one = run_script("train.py", [*args, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert one.returncode == 0, one.stderr[-2000:]
    fsdp = ["distributed=fsdp", "cpu_offload=true", f"hydra.run.dir={tmp_path / 'alone'}"]
    alone = _torchrun(1, [*args, *fsdp], tmp_path, root)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert "FSDP2 with CPU offload over 1 process" in alone.stdout and "notice: distributed=fsdp" not in alone.stdout
    assert len(_losses(tmp_path / "alone")) == 10
    assert _max_diff(_metrics(tmp_path / "one", "train"), _metrics(tmp_path / "alone", "train"), "loss") <= 1e-5
    _assert_sharded_by(1, runs.latest(tmp_path / "alone"))
    sampled = run_script(
        "sample.py", [f"ckpt={runs.latest(tmp_path / 'alone')}", "num_samples=1", "max_new_tokens=8"], tmp_path, root
    )
    assert sampled.returncode == 0, sampled.stderr[-2000:]


def _assert_sharded_by(n: int, path) -> None:
    """The step checkpoint at `path` is sharded (format 4): its folder holds one file per process,
    each its own part (none near the whole), as DCP names them, and nothing of a temporary."""
    assert torch.load(path, weights_only=True)["format"] == 4
    files = {f.name: f.stat().st_size for f in runs.shards_folder(path).iterdir()}
    assert set(files) == {".metadata"} | {f"__{rank}_0.distcp" for rank in range(n)}
    parts = [size for name, size in files.items() if name.endswith(".distcp")]
    assert max(parts) < 1.5 * sum(parts) / n
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc")
def test_a_sharded_checkpoint_resumes_at_2_1_and_4_processes_and_after_a_kill(tmp_path, data_root):
    """A 2-process FSDP run stopped by SIGTERM to rank 1 saves once and exits 0 on both ranks;
    resumed at 2 processes it ends bitwise as the uninterrupted run, at 1 and at 4 processes
    (the same global batch) within float tolerance; a single-process checkpoint resumes under
    FSDP; a run whose rank 1 is killed -9 reruns to the uninterrupted run's end bitwise."""
    root, data = data_root
    args = [*data, *SHAPES["llama"], *MUON, *EXACT, "train.max_iters=24", "train.eval_interval=8"]
    args += ["train.eval_iters=2", "train.log_interval=1", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    fsdp = ["distributed=fsdp", "train.batch_size=4"]
    reference = _torchrun(2, [*args, *fsdp, f"hydra.run.dir={tmp_path / 'reference'}"], tmp_path, root)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = _metrics(tmp_path / "reference", "train")
    kept = runs.step_checkpoints(tmp_path / "reference")  # steps 16 and 24: keep_last=2, older ones pruned with their shards
    assert [p.name for p in kept] == ["ckpt-0000016.pt", "ckpt-0000024.pt"]
    assert sorted(p.name for p in (tmp_path / "reference" / "checkpoints").glob("*.shards")) == [
        "ckpt-0000016.shards", "ckpt-0000024.shards"
    ]  # fmt: skip
    for path in kept:
        _assert_sharded_by(2, path)
    sampled = run_script("sample.py", [f"ckpt={kept[-1]}", "num_samples=1", "max_new_tokens=8"], tmp_path, root)
    assert sampled.returncode == 0 and sampled.stdout.strip(), sampled.stderr[-2000:]  # one process reads the shards whole

    stopped_dir = tmp_path / "stopped"
    out = _stop_rank_1(2, [*args, *fsdp, f"hydra.run.dir={stopped_dir}"], tmp_path, root, signal.SIGTERM, after=5)
    assert out.returncode == 0 and out.stdout.count("stopped at step") == 1, out.stderr[-3000:]
    stopped_at = checkpoint.load(runs.latest(stopped_dir)).step
    assert stopped_at >= 5
    for name in ("at-1", "at-4"):
        shutil.copytree(stopped_dir, tmp_path / name)

    again = _torchrun(2, [*args, *fsdp, f"hydra.run.dir={stopped_dir}"], tmp_path, root)
    assert again.returncode == 0 and f"at step {stopped_at}" in again.stdout, again.stderr[-3000:]
    assert "built on the meta device: each process holds only its shards" in again.stdout
    assert _losses(stopped_dir) == _losses(tmp_path / "reference")  # bitwise, before the stop and after
    ours, theirs = (checkpoint.load(runs.latest(d)).model for d in (stopped_dir, tmp_path / "reference"))
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    after = {s: r for s, r in expected.items() if s > stopped_at}
    at_1 = run_script("train.py", [*args, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'at-1'}"], tmp_path, root)
    assert at_1.returncode == 0 and "random streams restart" in at_1.stdout, at_1.stderr[-2000:]
    at_4 = _torchrun(4, [*args, "distributed=fsdp", "train.batch_size=2", f"hydra.run.dir={tmp_path / 'at-4'}"], tmp_path, root)
    assert at_4.returncode == 0 and "FSDP2 over 4 processes" in at_4.stdout, at_4.stderr[-3000:]
    _assert_sharded_by(4, runs.latest(tmp_path / "at-4"))  # 2 processes' shards read into 4, then written by 4
    assert torch.load(runs.latest(tmp_path / "at-1"), weights_only=True)["format"] == 3  # one process writes whole
    for name in ("at-1", "at-4"):
        resumed = {s: r for s, r in _metrics(tmp_path / name, "train").items() if s > stopped_at}
        assert _max_diff(resumed, after, "loss") <= 1e-4, name

    # 1 -> 2: a single-process run's checkpoint, continued sharded
    first_8 = ["train.batch_size=8", "train.max_iters=8", "optim.decay_iters=24", f"hydra.run.dir={tmp_path / 'from-1'}"]
    single = run_script("train.py", [*args, *first_8], tmp_path, root)
    assert single.returncode == 0, single.stderr[-2000:]
    grown = _torchrun(2, [*args, *fsdp, f"hydra.run.dir={tmp_path / 'from-1'}"], tmp_path, root)
    assert grown.returncode == 0 and "at step 8" in grown.stdout, grown.stderr[-3000:]
    continued = {s: r for s, r in _metrics(tmp_path / "from-1", "train").items() if s > 8}
    assert _max_diff(continued, {s: r for s, r in expected.items() if s > 8}, "loss") <= 1e-4

    killed_dir = tmp_path / "killed"
    killed = _stop_rank_1(2, [*args, *fsdp, f"hydra.run.dir={killed_dir}"], tmp_path, root, signal.SIGKILL, after=10)
    assert killed.returncode != 0
    assert checkpoint.load(runs.latest(killed_dir)).step == 8  # the eval checkpoint before the kill
    # as if the kill had come mid-save at step 16: rank 0's temporary folder, and a folder renamed
    # before its file was written; the rerun removes both and resumes from step 8
    ckpts = killed_dir / "checkpoints"
    shutil.copytree(ckpts / "ckpt-0000008.shards", ckpts / "ckpt-0000016.shards.tmp-999999")
    shutil.copytree(ckpts / "ckpt-0000008.shards", ckpts / "ckpt-0000016.shards")
    rerun = _torchrun(2, [*args, *fsdp, f"hydra.run.dir={killed_dir}"], tmp_path, root)
    assert rerun.returncode == 0 and "at step 8" in rerun.stdout, rerun.stderr[-3000:]
    assert _losses(killed_dir) == _losses(tmp_path / "reference")
    assert sorted(p.name for p in ckpts.iterdir()) == sorted(p.name for p in (tmp_path / "reference" / "checkpoints").iterdir())


def _stop_rank_1(n: int, args: list[str], cwd, root, sig, after: int) -> subprocess.CompletedProcess:
    """torchrun with `args`, `sig` sent to rank 1 once rank 0 has logged step `after`."""
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", str(REPO / "train.py")]
    proc = subprocess.Popen([*launch, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(f"step {after}/"):
            break
    os.kill(worker_pids(proc)[1], sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + out, err)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [0, 4])
def test_a_llama_folder_finetuned_sharded_trains_like_one_process_and_exports(tmp_path, data_root, lora):
    """An imported Llama folder finetuned under FSDP2 (LoRA rank 4, or every weight): losses
    within 1e-5 of one process over 20 steps; `tinygpt export` of the sharded run gives a folder
    transformers loads with the run's logits."""
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    root, _ = data_root
    folder, corpus = llama_folder(tmp_path, root)
    args = [
        f"init_from={folder}", "data=local", f"data.source.path={corpus}", "data.name=llama_ft", "data.split_by=tail",
        "data.tokenizer.kind=hf", f"data.tokenizer.name={folder}", f"finetune.lora_rank={lora}", "optim=adamw",
        "train.eval_iters=2", "train.eval_interval=10", "train.sample_tokens=0", "train.log_interval=1",
        "finetune.block_size=32", "train.max_iters=20", *EXACT,
    ]  # fmt: skip
    one = run_script("train.py", [*args, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert one.returncode == 0, one.stderr[-2000:]
    two = _torchrun(2, [*args, "train.batch_size=4", "distributed=fsdp", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path, root)
    assert two.returncode == 0 and "FSDP2 over 2 processes" in two.stdout, two.stderr[-3000:]
    assert ("LoRA" in two.stdout) == bool(lora)
    assert _max_diff(_metrics(tmp_path / "one", "train"), _metrics(tmp_path / "two", "train"), "loss") <= 1e-5

    # the sharded checkpoint resumed sharded: the model (and its adapters) built on the meta device
    longer = [a for a in args if a != "train.max_iters=20"] + ["train.max_iters=22", "optim.decay_iters=20"]
    on = _torchrun(2, [*longer, "train.batch_size=4", "distributed=fsdp", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path, root)
    assert on.returncode == 0 and "resuming from" in on.stdout and "built on the meta device" in on.stdout, on.stderr[-3000:]
    assert sorted(_losses(tmp_path / "two"))[-2:] == [21, 22]
    # best.pt (the weights gathered whole) and the last step checkpoint (sharded, read whole here)
    for name, source in (("best", f"run_dir={tmp_path / 'two'}"), ("step", f"ckpt={runs.latest(tmp_path / 'two')}")):
        exported = run_script("export", [source, f"out={tmp_path / name}"], tmp_path, root)
        assert exported.returncode == 0 and "LlamaForCausalLM" in exported.stdout, exported.stderr[-2000:]
        ours = loading.load(source.partition("=")[2]).model.eval()
        hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / name).eval()
        idx = torch.randint(0, ours.config.vocab_size, (2, 16))
        with torch.no_grad():
            assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5, name


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_gpt2_folder_starts_a_sharded_finetune_like_one_process(tmp_path, data_root, dtype):
    """Rank 0 maps the folder (loading.load(mapped=True)) and scatters its weights one tensor at a
    time: in the file's dtype (bf16 as the Hub's, or fp32), GPT-2's Conv1D weights as transposed
    views of the file. The shards hold what one process reads into float32: losses within 1e-5
    over 20 steps (torch's set_model_state_dict broadcast the views scrambled: 0.0075 off)."""
    transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")
    root, _ = data_root
    llama, corpus = llama_folder(tmp_path, root)  # its BPE tokenizer and corpus
    config = transformers.GPT2Config(vocab_size=400, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    folder = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(config).to(dtype).save_pretrained(folder)
    shutil.copy(llama / "tokenizer.json", folder / "tokenizer.json")
    args = [
        f"init_from={folder}", "data=local", f"data.source.path={corpus}", "data.name=gpt2_ft", "data.split_by=tail",
        "data.tokenizer.kind=hf", f"data.tokenizer.name={folder}", "optim=adamw", "train.eval_iters=2",
        "train.eval_interval=10", "train.sample_tokens=0", "train.log_interval=1", "finetune.block_size=32",
        "train.max_iters=20", *EXACT,
    ]  # fmt: skip
    one = run_script("train.py", [*args, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert one.returncode == 0, one.stderr[-2000:]
    two = _torchrun(2, [*args, "train.batch_size=4", "distributed=fsdp", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path, root)
    assert two.returncode == 0 and "FSDP2 over 2 processes" in two.stdout, two.stderr[-3000:]
    assert _max_diff(_metrics(tmp_path / "one", "train"), _metrics(tmp_path / "two", "train"), "loss") <= 1e-5


@pytest.mark.slow
def test_a_tied_table_some_process_holds_no_rows_of_saves_and_resumes(tmp_path, data_root):
    """Three processes over a tied 2-token table: the third holds no rows of it (FSDP2 cuts by
    rows), yet every process must agree that the embedding and the LM head are one tensor, or
    DCP refuses the save. It saves sharded, resumes sharded, and reads back whole and tied."""
    root, _ = data_root
    corpus = tmp_path / "ab.txt"
    corpus.write_text("".join("ab"[(i * 7 + i // 3) % 2] for i in range(6000)))
    args = [
        "data=local", f"data.source.path={corpus}", "data.name=ab", "data.tokenizer.kind=char", "data.split_by=tail",
        *SHAPES["gpt2-block"],
        "optim=adamw", *EXACT, "train.batch_size=2", "train.eval_interval=2", "train.eval_iters=1",
        "train.sample_tokens=0", "train.eval_sample_tokens=0", "distributed=fsdp", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    first = _torchrun(3, [*args, "train.max_iters=2"], tmp_path, root)
    assert first.returncode == 0 and "FSDP2 over 3 processes" in first.stdout, first.stderr[-3000:]
    _assert_sharded_by(3, runs.latest(tmp_path / "run"))
    again = _torchrun(3, [*args, "train.max_iters=4"], tmp_path, root)
    assert again.returncode == 0 and "built on the meta device" in again.stdout, again.stderr[-3000:]
    ckpt = checkpoint.load(runs.latest(tmp_path / "run"))
    assert ckpt.step == 4 and ckpt.model["lm_head.weight"].shape[0] == 2
    assert ckpt.model["lm_head.weight"] is ckpt.model["transformer.wte.weight"]


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_eval_tasks_histograms_and_attention_maps_under_fsdp_are_the_whole_models(tmp_path, data_root, compiled):
    """train.eval_tasks under FSDP2: rank 0 reads the items (local copies under the data root) and
    hands them to the other process; both score them with the sharded model; rank 0 records
    figures equal to scoring the saved step-4 model in one process (lambada's perplexity is a
    continuous check of it). Weight and gradient histograms hold every value of the whole
    tensors (gathered), and the attention maps are drawn, by both processes in lockstep. Compiled
    (blocks compiled in place), the scores, maps and samples run the blocks eager: no recompile
    beyond evaluation's no-grad graph."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpt.config import TaskSettings
    from gpt.evals.tasks import evaluate_task, examples
    from gpt.tokenizers import tokenizer_from_dict

    root, data = data_root
    own = tmp_path / "root"
    (own / "tasks").mkdir(parents=True)
    for entry in root.iterdir():  # the prepared data, linked
        (own / entry.name).symlink_to(entry)
    lambada = ["He looked at the clock and said it was time to go home", "The cat sat on the mat", "She opened the gate"]
    (own / "tasks" / "lambada.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lambada))
    arc = [
        {"id": str(i), "question": q, "choices": {"text": c, "label": list("ABC"[: len(c)])}, "answerKey": "A"}
        for i, (q, c) in enumerate([("Which is a bird?", ["crow", "stone"]), ("What falls?", ["rain", "up", "sky"])])
    ]
    (own / "tasks" / "arc_easy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arc))
    args = [
        *data, *SHAPES["gpt2-block"], "optim=adamw", *EXACT, "train.max_iters=4", "train.eval_interval=2",
        "train.eval_iters=1", "train.sample_tokens=0", "train.eval_tasks=[lambada,arc_easy]", "distributed=fsdp",
        "train.histogram_every=1", "train.attention_every=2", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    proc = _torchrun(2, args + ["compile=true"] * compiled, tmp_path, own, **({"TORCH_LOGS": "recompiles"} if compiled else {}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    if compiled:  # one recompile per rank: evaluation's no-grad graph
        assert "recompile_limit" not in proc.stderr and proc.stderr.count("Recompiling function") <= 2, proc.stderr[-3000:]
    assert proc.stdout.count("task lambada: 3 items scored at every eval") == 1  # read by rank 0 alone
    recorded = _metrics(tmp_path / "run", "tasks")
    assert sorted(recorded) == [0, 2, 4]
    ckpt = checkpoint.load(runs.latest(tmp_path / "run"))
    model, tokenizer = loading.model_from_checkpoint(ckpt).eval(), tokenizer_from_dict(ckpt.tokenizer)
    for name in ("lambada", "arc_easy"):
        alone = evaluate_task(model, tokenizer, name, examples(TaskSettings(name), own), torch.device("cpu"))
        for metric, value in recorded[4][name].items():
            assert abs(value - alone[metric]) <= 1e-5 * max(1.0, abs(value)), (name, metric, value, alone[metric])
    assert recorded[4]["lambada"]["perplexity"] != recorded[0]["lambada"]["perplexity"]  # scored afresh at each eval
    events = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"histograms": 0, "images": 0}).Reload()
    weight = "weights/transformer.h.0.attn.c_attn.weight"
    assert [e.step for e in events.Histograms(weight)] == [0, 2, 4]
    assert events.Histograms(weight)[-1].histogram_value.num == ckpt.model["transformer.h.0.attn.c_attn.weight"].numel()
    grads = events.Histograms("grads/transformer.h.0.mlp.c_fc.weight")
    assert [e.step for e in grads] == [2, 4] and grads[-1].histogram_value.num == ckpt.model[
        "transformer.h.0.mlp.c_fc.weight"
    ].numel()
    maps = events.Images("attention/layer_0")
    assert [e.step for e in maps] == [2] and (maps[0].width, maps[0].height) == (2 * 16, 16)  # 2 heads of 16 x 16


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc")
@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_cpu_offload_trains_like_one_process_and_resumes_bitwise(tmp_path, data_root, optim):
    """cpu_offload=true (FSDP2's CPUOffloadPolicy; on this CPU the shards are in host memory
    already, so this runs the wiring: the policy, materializing the shards in host memory, the
    optimizer stepping them there, Muon's rows sent to the run's device for Newton-Schulz and
    back): 12 steps within 1e-5 of one process, and a run stopped by SIGTERM to rank 1 resumes
    (on the meta device, its shards read into host memory) to the uninterrupted run's end bitwise."""
    root, data = data_root
    args = [*data, *SHAPES["gpt2-block"], *(MUON if optim == "muon" else ["optim=adamw"]), *EXACT]
    args += ["train.max_iters=12", "train.eval_interval=4"]
    args += ["train.eval_iters=2", "train.log_interval=1", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    offload = ["distributed=fsdp", "cpu_offload=true", "train.batch_size=4"]
    one = run_script("train.py", [*args, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert one.returncode == 0, one.stderr[-2000:]
    whole = _torchrun(2, [*args, *offload, f"hydra.run.dir={tmp_path / 'whole'}"], tmp_path, root)
    assert whole.returncode == 0 and "FSDP2 with CPU offload over 2 processes" in whole.stdout, whole.stderr[-3000:]
    assert _max_diff(_metrics(tmp_path / "one", "train"), _metrics(tmp_path / "whole", "train"), "loss") <= 1e-5
    stopped = tmp_path / "stopped"
    out = _stop_rank_1(2, [*args, *offload, f"hydra.run.dir={stopped}"], tmp_path, root, signal.SIGTERM, after=5)
    assert out.returncode == 0 and out.stdout.count("stopped at step") == 1, out.stderr[-3000:]
    again = _torchrun(2, [*args, *offload, f"hydra.run.dir={stopped}"], tmp_path, root)
    assert again.returncode == 0 and "built on the meta device" in again.stdout, again.stderr[-3000:]
    assert _losses(stopped) == _losses(tmp_path / "whole")
