"""What a CPU can prove of the GPU path: torch.compile (inductor's C++ backend here) traces the
training forward of every block option without a graph break, a compiled run trains like an
eager one, and a multirun compiles each job afresh without piling up recompiles; bf16 autocast
trains every block option. (CUDA-only checks: tests/test_cuda.py.)
Run: pytest tests/test_compile.py   (the inductor runs are marked slow)"""

from __future__ import annotations

import json

import pytest
import torch

from gpt.model import GPT, GPTConfig
from gpt.training import train
from helpers import compose, run_script

QUICKSTART = dict(norm="rmsnorm", pos_encoding="rope", qk_norm=True, bias=False)  # configs/model/gpt-micro-modern.yaml
LLAMA = dict(norm="rmsnorm", mlp="swiglu", pos_encoding="rope", bias=False, tie_embeddings=False)  # llama-nano
BLOCKS = {
    "quickstart": QUICKSTART,
    "gpt2": dict(),
    "llama": LLAMA,
    "modded": dict(QUICKSTART, mlp="relu2", logit_softcap=15.0, tie_embeddings=False),
    "gqa-sinusoidal": dict(pos_encoding="sinusoidal", n_kv_head=1),
    "padded-checkpointed": dict(QUICKSTART, vocab_multiple=64, activation_checkpointing=True),
}


def _model(block: dict) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=32), **block}))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_the_training_forward_compiles_without_a_graph_break(name):
    model = _model(BLOCKS[name]).train()
    x = torch.randint(0, 61, (2, 16))
    explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch.compiler.reset()


def test_the_chunked_head_loss_compiles_without_a_graph_break(monkeypatch):
    monkeypatch.setattr(GPT, "LOSS_CHUNK_ELEMENTS", 8 * 61)  # 8 rows a chunk: the GPU path for GPT-2's vocabulary
    model = _model(QUICKSTART).train()
    x = torch.randint(0, 61, (2, 16))
    explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch.compiler.reset()


@pytest.mark.parametrize("name", [*BLOCKS, "lstm", "gru", "rnn"])
def test_bf16_autocast_trains_every_block_option_on_the_cpu(name):
    """dtype=bfloat16 on the CPU is autocast as on a GPU: the matmuls run in bf16, the loss in fp32."""
    from gpt.config import AdamWSettings
    from gpt.data.loader import Batch
    from gpt.model import registry
    from gpt.runtime import devices
    from gpt.training import train_step
    from gpt.training.optim import build_optimizer

    rt = devices.setup("cpu", "bfloat16", False)
    assert rt.dtype == torch.bfloat16
    if name in BLOCKS:
        model = _model(BLOCKS[name])
    else:
        from gpt.config.model import RNNConfig

        torch.manual_seed(0)
        model = registry.build(RNNConfig(arch=name, vocab_size=61, block_size=16, n_layer=1, n_embd=16, n_hidden=32))
    optimizer = build_optimizer(model, AdamWSettings(lr=3e-3, warmup_iters=0), rt.device)
    x = torch.randint(0, 61, (4, 16))

    class Same:
        def next(self):
            return Batch(x, x.roll(-1, dims=1), tokens=x.numel())

    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    losses = []
    for _ in range(25):
        result = train_step(model, Same(), optimizer, scaler, rt, accum_steps=1, grad_clip=1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(result.loss.item())
    hook.remove()
    assert seen[0] == torch.bfloat16  # autocast was on
    assert all(map(lambda v: v == v and abs(v) < 100, losses)) and losses[-1] < losses[0] - 0.5


class CountingCompile:
    """torch.compile with a backend that counts the graphs dynamo hands over (and runs them
    eagerly): what a multirun's jobs compile, without inductor's minutes."""

    def __init__(self):
        from torch._dynamo.testing import CompileCounter

        self.counter = CompileCounter()
        self.real = torch.compile

    def __call__(self, model, **kw):
        return self.real(model, backend=self.counter)


def test_a_multirun_compiles_each_job_afresh_and_evaluation_recompiles_nothing(tmp_path, data_root, monkeypatch):
    """Two jobs in one process, as a sweep's basic launcher and a scaling study run them, with
    four evals each: each job compiles one training and one evaluation graph, the evals after
    the first reuse it, and the second job compiles as the first did. Without a reset between
    jobs the second's graphs count against dynamo's recompile limit (here 2, as after a few
    jobs at its default of 8) and it silently runs eager."""
    from gpt.training import build

    root, data_overrides = data_root
    counting = CountingCompile()
    monkeypatch.setattr(build.torch, "compile", counting)
    torch.compiler.reset()
    graphs = []
    with torch._dynamo.config.patch(recompile_limit=2):
        for job, lr in enumerate(("1e-3", "2e-3")):
            before = counting.counter.frame_count
            overrides = [
                "debug=tiny",
                *data_overrides,
                f"paths.data_dir={root}",
                "compile=true",
                "train.max_iters=30",
                "train.sample_tokens=0",
                f"optim.lr={lr}",
                "threads=1",
            ]
            summary = train(compose(overrides, tmp_path / f"job{job}"))
            assert summary["status"] == "finished"
            graphs.append(counting.counter.frame_count - before)
    assert graphs == [2, 2], graphs  # training + evaluation, in each job: 4 evals compiled nothing more


@pytest.mark.slow
def test_compile_true_trains_the_default_model_like_eager(tmp_path, data_root):
    """`python train.py compile=true` (inductor's C++ backend): the quickstart's model, 30 steps,
    losses equal to eager's within 1e-4 in fp32; and compiled under bf16 autocast it trains too."""
    root, data_overrides = data_root
    common = [
        *data_overrides,
        "train.max_iters=30",
        "train.log_interval=1",
        "train.eval_interval=30",
        "train.eval_iters=2",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
        "threads=1",
        "optim.ns_dtype=float32",  # bf16 Newton-Schulz (auto on AVX-512 BF16) turns last-bit differences into bf16 steps
    ]
    losses = {}
    # fp32 for the comparison (dtype=auto trains in bf16 on CPUs with native bf16: the same
    # rounding story as Newton-Schulz's); the bf16 run compiled, as compile=true meets it there
    runs = (
        ("eager", ["dtype=float32"]),
        ("compiled", ["compile=true", "dtype=float32"]),
        ("bf16", ["dtype=bfloat16", "compile=true"]),
    )
    for name, extra in runs:
        proc = run_script("train.py", [*common, *extra, f"hydra.run.dir={tmp_path / name}"], tmp_path, root, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses["eager"]) == len(losses["compiled"]) == 30
    assert max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"])) <= 1e-4
    assert len(losses["bf16"]) == 30 and losses["bf16"][-1] < losses["bf16"][0] - 0.5
    assert max(abs(a - b) for a, b in zip(losses["eager"], losses["bf16"])) <= 0.1  # bf16 rounding, not another run


@pytest.mark.slow
@pytest.mark.parametrize("case", ["llama", "sft"])
def test_compile_true_trains_the_llama_preset_and_an_sft_run_like_eager(tmp_path, data_root, case):
    """The Llama preset's block (2 layers), and SFT on conversations (batches padded to widths of
    64: a compiled model meets few shapes), losses equal to eager's within 1e-4."""
    from gpt.chat.synthetic import suite
    from helpers import TEXT

    root, data_overrides = data_root
    if case == "llama":
        extra = ["model=llama-nano", "model.n_layer=2", "optim.ns_dtype=float32", *data_overrides]  # as above
    else:
        (tmp_path / "corpus.txt").write_text(TEXT)
        base = tmp_path / "base"
        proc = run_script(
            "train",
            [
                "debug=tiny",
                "data=local",
                f"data.source.path={tmp_path / 'corpus.txt'}",
                "data.name=corpus",
                "data.tokenizer.kind=byte",
                "data.split_by=tail",
                "model.block_size=128",
                f"paths.output_dir={base}",
            ],
            tmp_path,
            root,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        chats = tmp_path / "chats.jsonl"
        chats.write_text("".join(json.dumps(r) + "\n" for r in suite(200, 20, seed=1)[0]))
        extra = [
            "experiment=sft",
            f"init_from={base}",
            "data=local",
            f"data.source.path={chats}",
            "data.name=chats",
            "train.batch_size=4",
            "finetune.min_block_size=128",
        ]
    common = [
        *extra,
        "train.max_iters=12",
        "train.log_interval=1",
        "train.eval_interval=12",
        "train.eval_iters=2",
        "train.sample_tokens=0",
        "train.eval_sample_tokens=0",
        "threads=1",
        "dtype=float32",  # as above
    ]
    losses = {}
    for name, flag in (("eager", "compile=false"), ("compiled", "compile=true")):
        proc = run_script("train", [*common, flag, f"paths.output_dir={tmp_path / name}"], tmp_path, root, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses["eager"]) == len(losses["compiled"]) == 12
    assert max(abs(a - b) for a, b in zip(losses["eager"], losses["compiled"])) <= 1e-4


@pytest.mark.slow
def test_ddp_on_gloo_with_compile_trains_like_one_eager_process(tmp_path, data_root):
    """torchrun with two CPU processes (gloo), each compiling its model under DDP: the losses of
    one eager process with twice the micro-batch, within 1e-4."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    root, data_overrides = data_root
    common = [
        "debug=tiny",
        *data_overrides,
        "device=cpu",
        "train.max_iters=12",
        "train.log_interval=1",
        "train.eval_interval=12",
        "train.sample_tokens=0",
        "optim.warmup_iters=5",
        "optim.ns_dtype=float32",  # as above
        "dtype=float32",
    ]
    single = run_script("train.py", [*common, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert single.returncode == 0, single.stderr[-2000:]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py")]
    ddp = subprocess.run(
        [*torchrun, *common, "train.batch_size=4", "compile=true", f"hydra.run.dir={tmp_path / 'ddp'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "DDP over 2 processes" in ddp.stdout and "compile on" in ddp.stdout
    losses = {}
    for name in ("one", "ddp"):
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r["loss"] for r in rows if r["kind"] == "train"]
    assert len(losses["one"]) == len(losses["ddp"]) == 12
    assert max(abs(a - b) for a, b in zip(losses["one"], losses["ddp"])) <= 1e-4


@pytest.mark.parametrize("first, then", [("false", "true"), ("true", "false")])
def test_a_compiled_run_resumes_an_eager_checkpoint_and_the_reverse(tmp_path, data_root, monkeypatch, first, then):
    """compile= may change between a run and its resume: the checkpoint holds the plain model's
    keys either way (no `_orig_mod.` prefix), and the resumed run continues the uninterrupted
    run's trajectory. torch.compile runs with a backend that executes dynamo's graphs eagerly, so
    the floats are the same bit for bit; inductor's would agree within rounding
    (test_compile_true_trains_the_default_model_like_eager)."""
    from gpt.checkpoints import checkpoint, runs
    from gpt.training import build
    from helpers import ENGINE_RUN, train_recording_losses

    root, data_overrides = data_root
    counting = CountingCompile()
    monkeypatch.setattr(build.torch, "compile", counting)
    torch.compiler.reset()
    overrides = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "model.dropout=0.1"]
    full = train_recording_losses(compose([*overrides, "compile=false"], tmp_path / "full"))
    split = tmp_path / "split"
    head = train_recording_losses(compose([*overrides, f"compile={first}"], split), stop_after=12)
    assert not any(k.startswith("_orig_mod") for k in checkpoint.load(runs.latest(split)).model)
    tail = train_recording_losses(compose([*overrides, f"compile={then}"], split))  # same run dir: resume=auto
    assert sorted(tail) == list(range(13, 31))
    assert {**head, **tail} == full
    assert counting.counter.frame_count >= 2  # the compiled half did run through dynamo
