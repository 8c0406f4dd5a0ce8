"""gpt/runtime/distributed.py: where a process sits (torchrun, SLURM), and two CPU processes under
torchrun training exactly like one process with twice the batch, stopping together on SIGTERM.
Run: pytest tests/test_distributed.py"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from gpt.checkpoints import checkpoint, runs
from helpers import NCCL_RULES, REPO, STEP_COUNTER, hooked_pythonpath, run_script, sigterm_after_step_5, worker_pids

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py")]


def _metrics(run_dir, kind):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line)["kind"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize("accum", [1, 2])
def test_two_process_ddp_matches_one_process(tmp_path, data_root, accum):
    root, data_overrides = data_root
    # fp32 Newton-Schulz and fp32 training: in bf16 (auto on CPUs with AVX-512 BF16) the rounding of
    # two sums in another order can land a bf16 step apart, and the comparison is of DDP, not of
    # precision
    common = ["debug=tiny", "train.eval_interval=10", "train.log_interval=1", "optim.warmup_iters=5", "train.sample_tokens=0"] + [
        "optim.ns_dtype=float32",
        "dtype=float32",
        *data_overrides,
        "train.max_iters=12",
        "device=cpu",
        f"train.grad_accum_steps={accum}",
    ]
    single = run_script("train.py", [*common, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert single.returncode == 0, single.stderr[-2000:]
    work = tmp_path / "ddp"
    work.mkdir()
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = hooked_pythonpath(tmp_path / "nccl-rules", NCCL_RULES)  # DDP's gloo collectives as NCCL takes them
    ddp = subprocess.run(
        [*TORCHRUN, *common, "train.batch_size=4"], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "DDP over 2 processes" in ddp.stdout
    assert f"micro-batch 4 x accum {accum} x 2 process(es) = global batch of {128 * accum}" in ddp.stdout
    runs = list((work / "outputs" / "runs").iterdir())
    assert len(runs) == 1 and sorted(p.name for p in work.iterdir()) == ["outputs"]  # rank 1 made no run dir or log
    one, two = _metrics(tmp_path / "one", "train"), _metrics(runs[0], "train")
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 13))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(one, two)) <= 1e-5
    # (Their evals differ: an eval is train.eval_iters batches of train.batch_size rows, 8 here and
    # 4 there, whatever the processes; the next test compares evals at one micro-batch.)


def _ns_tolerance(ns_dtype: str) -> float:
    """How close a DDP run with Muon stays to one process over 60 steps: 1e-5 where Newton-Schulz
    runs in fp32. In bf16 any difference in the fp32 gradients' last bits (DDP sums two halves
    of the batch, one process the whole) moves some inputs across a bf16 rounding step, and the
    steps after carry it on: one process against itself with its batch cut in two
    micro-batches differed by 3.2e-4 over these 60 steps (4.8e-7 in fp32), DDP by 6.7e-5. A
    result exchanged wrongly differs by more than 1e-2."""
    import torch

    from gpt.config import MuonSettings
    from gpt.training.optim import ns_dtype_for

    resolved = ns_dtype_for(MuonSettings(ns_dtype=ns_dtype), torch.device("cpu"))
    return 1e-5 if resolved == torch.float32 else 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("ns_dtype", ["auto", "bfloat16"])
def test_ddp_with_muon_matches_one_process_over_60_steps_in_one_exchange_a_step(tmp_path, data_root, ns_dtype):
    """Muon's default Newton-Schulz dtype (auto: bf16 where the CPU multiplies it natively, fp32
    elsewhere) and bf16 itself: 2 DDP processes stay with one process over 60 steps
    (`_ns_tolerance`). The optimizer's step exchanges Muon's results in one all-gather: no more
    collectives than parameter groups."""
    root, data_overrides = data_root
    common = ["debug=tiny", *data_overrides, "device=cpu", "dtype=float32", "threads=1", "train.max_iters=60"]
    common += ["train.eval_interval=60", "train.log_interval=1", "train.sample_tokens=0", "optim.warmup_iters=5"]
    common += [f"optim.ns_dtype={ns_dtype}"]
    single = run_script("train.py", [*common, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert single.returncode == 0, single.stderr[-2000:]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "STEP_COUNTS": str(tmp_path / "counts-")}
    env["PYTHONPATH"] = hooked_pythonpath(tmp_path / "hooks", NCCL_RULES + STEP_COUNTER)
    ddp = subprocess.run(
        [*TORCHRUN, *common, "train.batch_size=4", f"hydra.run.dir={tmp_path / 'ddp'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "DDP over 2 processes" in ddp.stdout and "muon on" in ddp.stdout
    one, two = _metrics(tmp_path / "one", "train"), _metrics(tmp_path / "ddp", "train")
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 61))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(one, two)) <= _ns_tolerance(ns_dtype)
    for rank in (0, 1):
        steps = [json.loads(line) for line in (tmp_path / f"counts-{rank}").read_text().splitlines()]
        assert len(steps) == 60 and all(s["collectives"] == 1 <= s["groups"] for s in steps), (rank, steps[:3])


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ddp", "fsdp"])
def test_an_eval_is_one_process_s_eval_shared_out_over_the_ranks(tmp_path, data_root, how):
    """train.eval_iters=5 over 2 gloo processes: rank 0 evaluates 3 batches a split, rank 1 2 and
    a third that weighs nothing (every rank runs as many passes: a sharded forward needs both),
    and the step-0 eval (the same weights everywhere) is the single process's within 1e-6."""
    root, data_overrides = data_root
    common = ["debug=tiny", *data_overrides, "device=cpu", "dtype=float32", "train.max_iters=5", "train.eval_interval=5"]
    common += ["train.eval_iters=5"]  # (no more than the steps: _horizon)
    common += ["train.batch_size=4", "train.sample_tokens=0", "train.eval_sample_tokens=0"]
    single = run_script("train.py", [*common, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert single.returncode == 0, single.stderr[-2000:]
    hooks = hooked_pythonpath(
        tmp_path / "hooks",
        "import os\n"
        "from gpt.training import loop\n"
        "real = loop.Trainer._eval_loss\n"
        "def counted(self, batches):\n"
        "    with open(os.environ['ROWS_LOG'] + os.environ['RANK'], 'a') as f:\n"
        "        f.write(f'{sum(b.x.size(0) for b in batches)}\\n')\n"
        "    return real(self, batches)\n"
        "loop.Trainer._eval_loss = counted\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": hooks}
    env["ROWS_LOG"] = str(tmp_path / "rows-")
    ddp = subprocess.run(
        [*TORCHRUN, *common, f"distributed={how}", f"hydra.run.dir={tmp_path / 'ddp'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    for rank in (0, 1):  # two evals (steps 0 and 5) of two splits: 3 batches of 4 rows each
        rows = [int(n) for n in (tmp_path / f"rows-{rank}").read_text().split()]
        assert sum(rows) == 2 * 2 * 3 * 4, (rank, rows)
    one, two = _metrics(tmp_path / "one", "eval")[0], _metrics(tmp_path / "ddp", "eval")[0]
    assert one["step"] == two["step"] == 0
    assert abs(one["val"] - two["val"]) <= 1e-6 and abs(one["train"] - two["train"]) <= 1e-6, (one, two)


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_once_and_the_rerun_resumes(tmp_path, data_root):
    """A scheduler preempts the launcher: torchrun forwards SIGTERM to both workers, which agree
    on the step to stop at, rank 0 saves, and both exit. (torchrun itself then reports the signal
    and exits non-zero; that part is its own.) The same command again resumes."""
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    common = ["debug=tiny", *data_overrides, "device=cpu", "train.log_interval=1", f"hydra.run.dir={run_dir}"]
    launch = TORCHRUN
    _, out, err = sigterm_after_step_5([*launch, *common, "train.max_iters=100000"], tmp_path, env)
    assert "stopped at step" in out and "resume with: torchrun" in out, err[-2000:]
    stopped_at = checkpoint.load(runs.latest(run_dir)).step
    assert stopped_at >= 5 and len(runs.step_checkpoints(run_dir)) == 1
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"  # whatever torchrun's status

    resumed = subprocess.run(
        [*launch, *common, f"train.max_iters={stopped_at + 3}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"at step {stopped_at}" in resumed.stdout and "resuming from" in resumed.stdout
    assert checkpoint.load(runs.latest(run_dir)).step == stopped_at + 3


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc")
@pytest.mark.parametrize("when", ["in the loop", "during set-up"])
def test_sigterm_to_one_rank_stops_every_rank_after_one_save_and_resumes_bitwise(tmp_path, data_root, when):
    """A scheduler signals rank 1 alone: in the loop (after step 5), or while it sets up (its data
    loading signals itself, through a sitecustomize hook). Every rank stops at the same step, one
    checkpoint is saved, torchrun exits 0; the same command again resumes and ends with the
    losses and weights of an uninterrupted run. (During set-up, rank 1 used to leave alone, and
    rank 0 crashed in its next collective: 'Connection closed by peer'.)"""
    import signal

    import torch

    root, data_overrides = data_root
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = ["debug=tiny", *data_overrides, "device=cpu", "train.log_interval=1", "train.max_iters=24"]
    args += ["train.eval_interval=8", "train.sample_tokens=0"]
    reference = subprocess.run(
        [*TORCHRUN, *args, f"hydra.run.dir={tmp_path / 'reference'}"], cwd=tmp_path, env=env, capture_output=True, timeout=300
    )
    assert reference.returncode == 0, reference.stderr[-2000:]
    run_dir = tmp_path / "run"
    hooked = dict(env)
    if when == "during set-up":
        hooked["PYTHONPATH"] = hooked_pythonpath(
            tmp_path / "hook",
            "import os, signal\n"
            "if os.environ.get('RANK') == '1':\n"
            "    import gpt.training.build as s\n"
            "    real = s.load_data\n"
            "    def load_data(*a, **k):\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        return real(*a, **k)\n"
            "    s.load_data = load_data\n",
        )
    launcher = subprocess.Popen(
        [*TORCHRUN, *args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=hooked,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if when == "in the loop":
        for line in launcher.stdout:
            if line.startswith("step 5/"):
                break
        workers = worker_pids(launcher)
        os.kill(workers[1], signal.SIGTERM)
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    assert "(signal on another rank)" in out and "Traceback" not in err, (out[-2000:], err[-2000:])
    # One save for the stop: under torchrun the ranks read their stop flags every few steps and
    # after each eval, so an eval's checkpoint may come before it.
    *evals, saved = runs.step_checkpoints(run_dir)
    stopped_at = checkpoint.load(saved).step
    assert all(checkpoint.load(p).step % 8 == 0 and checkpoint.load(p).step < stopped_at for p in evals)
    assert out.count("stopped at step") == 1
    assert (stopped_at >= 5) if when == "in the loop" else (stopped_at == 0)
    resumed = subprocess.run(
        [*TORCHRUN, *args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0 and f"at step {stopped_at}" in resumed.stdout, resumed.stderr[-2000:]
    ours = {r["step"]: r["loss"] for r in _metrics(run_dir, "train")}
    theirs = {r["step"]: r["loss"] for r in _metrics(tmp_path / "reference", "train")}
    assert ours == theirs  # every step, before the stop and after the resume: bitwise
    assert [r["val"] for r in _metrics(run_dir, "eval") if r["step"] > stopped_at] == [
        r["val"] for r in _metrics(tmp_path / "reference", "eval") if r["step"] > stopped_at
    ]
    a, b = (checkpoint.load(runs.latest(d)).model for d in (run_dir, tmp_path / "reference"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_process_placement_from_torchrun_or_slurm(monkeypatch):
    from gpt.runtime import distributed

    for var in (
        *("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
        *("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID"),
        "MASTER_ADDR",
    ):
        monkeypatch.delenv(var, raising=False)
    assert distributed.from_env() == distributed.Dist(0, 0, 1, 1, launched=False)
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert distributed.from_env() == distributed.Dist(5, 1, 8, 1, launched=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")  # set only with --ntasks-per-node
    assert distributed.from_env() == distributed.Dist(5, 1, 8, 4, launched=False)
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3(x2),2")  # always set: nodes 0 and 1 run 3 tasks, node 2 runs 2
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert distributed.from_env() == distributed.Dist(5, 1, 8, 3, launched=False)
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert distributed.from_env() == distributed.Dist(5, 1, 8, 2, launched=False)
    monkeypatch.setenv("RANK", "3")  # torchrun inside a SLURM allocation: torchrun's view wins
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.from_env() == distributed.Dist(3, 3, 4, 4, launched=False)  # no LOCAL_WORLD_SIZE: one node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.from_env() == distributed.Dist(3, 3, 4, 2, launched=False)
    # `launched`: a group can meet, even of one process (FSDP2 then shards over it): a launcher
    # started the process and said where to meet. A one-task SLURM job without MASTER_ADDR is a
    # plain process (the default hydra/launcher=slurm job).
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var)
    for var, value in (("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0"), ("SLURM_TASKS_PER_NODE", "1")):
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("SLURM_NODEID", "0")
    assert distributed.from_env() == distributed.Dist(0, 0, 1, 1, launched=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert distributed.from_env() == distributed.Dist(0, 0, 1, 1, launched=True)
    for var, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        monkeypatch.setenv(var, value)  # torchrun --nproc_per_node=1 (which sets MASTER_ADDR)
    assert distributed.from_env() == distributed.Dist(0, 0, 1, 1, launched=True) and not distributed.from_env().enabled


def test_a_group_of_one_on_a_gpu_takes_the_gpu_in_use(monkeypatch):
    """distributed.init(alone=True) under torchrun with one process: device=cuda (no index) means
    the GPU torch uses, and any index is fine for one process (the check that each process has its
    own GPU is for several); NCCL and gloo when the shards are offloaded. (torch's CUDA and
    process-group calls are recorded, so this runs without a GPU.)"""
    import torch

    from gpt.errors import TinyGPTError
    from gpt.runtime import distributed

    calls = []
    monkeypatch.setattr(distributed.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(distributed.torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(
        distributed.dist, "init_process_group", lambda backend, **kw: calls.append((backend, str(kw["device_id"])))
    )
    monkeypatch.setattr(distributed.dist, "new_group", lambda **kw: None)
    monkeypatch.setattr(distributed, "meet", lambda d: None)  # no rendezvous store: the group's calls are recorded
    monkeypatch.setattr(distributed, "_ours", False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):  # init sets them for env://: put back as they were afterwards
        monkeypatch.setenv(var, "0" if var != "WORLD_SIZE" else "1")
    alone = distributed.Dist(0, 0, 1, 1, launched=True)
    distributed.init(alone, torch.device("cuda"), host_tensors=True, alone=True)
    distributed.init(alone, torch.device("cuda", 1), alone=True)
    assert calls == [("set_device", "cuda:0"), ("cuda:nccl,cpu:gloo", "cuda:0"), ("set_device", "cuda:1"), ("nccl", "cuda:1")]
    calls.clear()
    distributed.init(alone, torch.device("cuda"))  # not sharded: no group
    distributed.init(distributed.Dist(0, 0, 1, 1, launched=False), torch.device("cuda"), alone=True)  # nowhere to meet
    assert calls == []
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 2)
    with pytest.raises(TinyGPTError, match="would put every process on one GPU"):  # several processes: their own GPUs
        distributed.init(distributed.Dist(1, 1, 2, 2, launched=True), torch.device("cuda", 0))
    # SLURM's --gpus-per-task=1: each task sees one GPU, its own, as cuda:0 whatever its local rank
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 1)
    calls.clear()
    distributed.init(distributed.Dist(1, 1, 2, 2, launched=True), torch.device("cuda", 0))
    assert calls == [("set_device", "cuda:0"), ("nccl", "cuda:0")]


@pytest.mark.slow
def test_a_checkpoint_rank_0_cannot_write_stops_every_rank(tmp_path, data_root):
    """Rank 0's disk fills while it writes ckpt-20 (checkpoint.save patched to fail in rank 0
    only, through a sitecustomize module): both workers stop with the one-line error instead of
    rank 1 waiting at a barrier for a rank that has left, and ckpt-10 is kept."""
    root, data_overrides = data_root
    pythonpath = hooked_pythonpath(
        tmp_path / "hooks",
        "import os\n"
        "if os.environ.get('RANK') == '0':\n"
        "    from gpt.checkpoints import checkpoint\n"
        "    from gpt.errors import TinyGPTError\n"
        "    real = checkpoint.save\n"
        "    def save(path, ckpt):\n"
        "        if path.name == 'ckpt-0000020.pt':\n"
        "            raise TinyGPTError('could not write ckpt-0000020.pt (No space left on device); the previous one is kept')\n"
        "        return real(path, ckpt)\n"
        "    checkpoint.save = save\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    run_dir = tmp_path / "run"
    args = [
        "debug=tiny",
        *data_overrides,
        "device=cpu",
        "train.max_iters=30",
        "train.sample_tokens=0",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run([*TORCHRUN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "No space left on device" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    # rank 1 stopped on its own, told by rank 0 (not killed by torchrun after waiting: a SLURM
    # launch would have no one to kill it)
    assert "rank 0 could not save a checkpoint" in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert [p.name for p in runs.step_checkpoints(run_dir)] == ["ckpt-0000010.pt"]


@pytest.mark.slow
def test_a_mistake_rank_0_meets_alone_is_one_line_on_every_rank(tmp_path, data_root):
    """Rank 0 alone prepares the data and refuses it (a corpus of blank lines holds no document):
    the other process, waiting for it at a barrier, says in one line why it stops instead of
    burying rank 0's error under torch.distributed's traceback."""
    root, _ = data_root
    corpus = tmp_path / "blank.txt"
    corpus.write_text("  \n\n  \n")
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1"}
    args = [
        "data=local",
        f"data.source.path={corpus}",
        "data.tokenizer.kind=char",
        "device=cpu",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run([*TORCHRUN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert out.count("error: the corpus is empty") == 1, out[-3000:]
    # told by rank 0 through the rendezvous store (gpt.runtime.alarm), its reason with it
    assert "error: process 1 of 2 stops because process 0 of 2 failed: the corpus is empty" in out, out[-3000:]
    assert "[rank1]" not in out and "Error executing job" not in out, out[-3000:]
    # the failed process exits first, so that torchrun's summary names it (not the one it left alone)
    assert "rank      : 0 (local_rank: 0)" in out.split("Root Cause")[-1].split("=====")[0], out[-3000:]


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_and_the_new_attempt_is_not_stopped_by_the_old_failure(tmp_path, data_root):
    """torchrun --max-restarts=1: rank 1 crashes at its 15th step of the first attempt (after the
    step-10 checkpoint), rank 0 is stopped by the alarm, and torchrun starts both again. The
    second attempt meets in the same agent store, where the first one's failure and process
    group keys still are: it must read neither (each attempt's keys carry torchrun's restart
    count), resume from ckpt-10 and end exactly where an uninterrupted run ends."""
    root, data_overrides = data_root
    hooks = hooked_pythonpath(
        tmp_path / "hooks",
        "import os\n"
        "from gpt.training import step\n"
        "real, calls = step.train_step, [0]\n"
        "def train_step(*args, **kwargs):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 15 and os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
        "        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
        "    return real(*args, **kwargs)\n"
        "step.train_step = train_step\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1"}
    args = ["debug=tiny", *data_overrides, "device=cpu", "train.max_iters=30", "train.sample_tokens=0"]
    restarted, whole = tmp_path / "restarted", tmp_path / "whole"
    launch = [*TORCHRUN[:-1], "--max-restarts=1", TORCHRUN[-1]]
    proc = subprocess.run(
        [*launch, *args, f"hydra.run.dir={restarted}"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": hooks},
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("process 1 of 2 failed: RuntimeError: CUDA error") == 1, out[-3000:]  # the first attempt only
    assert f"resuming from {restarted / 'checkpoints' / 'ckpt-0000010.pt'} at step 10" in out, out[-3000:]
    proc = subprocess.run(
        [*TORCHRUN, *args, f"hydra.run.dir={whole}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _metrics(restarted, "eval")[-1]["val"] == _metrics(whole, "eval")[-1]["val"]
    assert [m["loss"] for m in _metrics(restarted, "train")][-2:] == [m["loss"] for m in _metrics(whole, "train")][-2:]


def _srun(args: list[str], cwd, env: dict, timeout: float = 120) -> tuple[list[int], list[str], list[float]]:
    """`srun --ntasks=2 python train.py ...` without SLURM: two processes given SLURM's
    per-task variables (gpt.runtime.distributed.from_env reads them) and nobody to kill a task's
    peers when it fails (srun without --kill-on-bad-exit). Returns their exit statuses, their
    output, and the seconds until each had ended (read both together: on a loaded machine the
    start-up alone may take many seconds, so a promptness bound is best put between the two)."""
    import threading
    import time

    from helpers import free_port

    port, started = free_port(), time.monotonic()
    tasks = [
        subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args],
            cwd=cwd,
            env={
                **env,
                "SLURM_NTASKS": "2",
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank),
                "SLURM_TASKS_PER_NODE": "2",
                "SLURM_NODEID": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs, ended = ["", ""], [float(timeout), float(timeout)]

    def wait(rank: int) -> None:  # each on its own thread, so that each end is timed as it happens
        with contextlib.suppress(subprocess.TimeoutExpired):
            outputs[rank] = tasks[rank].communicate(timeout=timeout)[0]
            ended[rank] = time.monotonic() - started

    waiters = [threading.Thread(target=wait, args=(rank,)) for rank in (0, 1)]
    try:
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join()
    finally:
        for task in tasks:
            task.kill()
    assert max(ended) < timeout, f"a task was still running after {timeout} s: {outputs}"
    return [task.returncode for task in tasks], outputs, ended


@pytest.mark.slow
def test_under_srun_a_rank_0_refused_before_the_group_forms_stops_the_other_within_seconds(tmp_path, data_root):
    """Rank 0 alone claims the run directory, before any process group exists, and another
    process holds it: the other task, waiting to meet rank 0, stops within seconds, saying why
    (it waited in the rendezvous until the collective timeout, 30 minutes; here 100 s, past the
    test's limit). The directory's owner keeps its lock."""
    from gpt.runtime.runlock import RunLock

    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    owner = RunLock(run_dir)
    owner.acquire()  # this test process: alive, so the lock is refused rather than taken over
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "TINYGPT_DIST_TIMEOUT_S": "100"}
    try:
        codes, (first, second), ended = _srun(
            ["debug=tiny", *data_overrides, "device=cpu", f"hydra.run.dir={run_dir}"], tmp_path, env, timeout=90
        )
        assert codes == [2, 1], first[-2000:] + second[-2000:]
        assert f"error: {run_dir} is being trained by process {os.getpid()}" in first, first[-2000:]
        assert f"error: process 1 of 2 stops because process 0 of 2 failed: {run_dir} is being trained" in second, second
        assert ended[1] - ended[0] < 20, ended  # (not the rendezvous's 100 s)
        assert json.loads((run_dir / ".lock").read_text())["pid"] == os.getpid()
    finally:
        owner.release()


@pytest.mark.slow
@pytest.mark.parametrize("rank_0_sees", [False, True], ids=["rank-0-blind-as-under-nccl", "rank-0-sees-as-under-gloo"])
def test_under_srun_another_rank_s_failure_is_rank_0_s_record_and_frees_the_run(tmp_path, data_root, rank_0_sees):
    """Rank 1 crashes at its sixth step. Rank 0's step either never returns (as NCCL's
    all-reduce would wait for a peer that has gone) or fails at once (gloo: "Connection closed by
    peer"). Either way rank 0 ends within seconds in one line with rank 1's reason, its summary
    says `failed` with that reason (not its own broken connection), and the run directory's lock
    is released, so that a rerun can resume it at once."""
    root, data_overrides = data_root
    hooks = hooked_pythonpath(
        tmp_path / "hooks",
        "import os, time\n"
        "from gpt.training import step\n"
        "real, calls = step.train_step, [0]\n"
        "def train_step(*args, **kwargs):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 6 and os.environ['SLURM_PROCID'] == '1':\n"
        "        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n"
        f"    if calls[0] == 6 and not {rank_0_sees}:\n"
        "        time.sleep(600)\n"
        "    return real(*args, **kwargs)\n"
        "step.train_step = train_step\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": hooks}
    run_dir = tmp_path / "run"
    args = ["debug=tiny", *data_overrides, "device=cpu", "train.max_iters=30", f"hydra.run.dir={run_dir}"]
    codes, (first, second), ended = _srun(args, tmp_path, env, timeout=90)
    # Blind, rank 0 is ended by its listener (exit status 1). Seeing its collective fail, it ends by
    # itself (2), unless rank 1 took longer than the listener's grace (GRACE_S) to exit and close its
    # connections, as on a loaded machine: then the listener ends it first, saying the same.
    assert codes[0] in ((1, 2) if rank_0_sees else (1,)) and codes[1] == 1, first[-2000:] + second[-2000:]
    assert "error: process 0 of 2 stops because process 1 of 2 failed: RuntimeError: CUDA error" in first, first[-2000:]
    assert "Traceback" not in first, first[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "process 1 of 2 failed: RuntimeError: CUDA error" in summary["error"], summary
    assert not (run_dir / ".lock").exists()
    assert ended[0] - ended[1] < 20, ended


@pytest.mark.slow
def test_under_srun_rank_0_failing_alone_after_the_others_finished_exits_promptly(tmp_path, data_root):
    """Rank 0 fails in work of its own after the last collective (here its closing lines), when
    rank 1 has finished and exited 0: rank 0, the store's host, does not wait for rank 1 to hear
    (it said so as it exited)."""
    root, data_overrides = data_root
    hooks = hooked_pythonpath(
        tmp_path / "hooks",
        "import os\n"
        "if os.environ.get('SLURM_PROCID') == '0':\n"
        "    from gpt.errors import TinyGPTError\n"
        "    from gpt.training import loop\n"
        "    def done(self):\n"
        "        raise TinyGPTError('could not write the closing lines')\n"
        "    loop.Trainer._log_done = done\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": hooks}
    args = ["debug=tiny", *data_overrides, "device=cpu", "train.max_iters=10", f"hydra.run.dir={tmp_path / 'run'}"]
    codes, (first, second), ended = _srun(args, tmp_path, env, timeout=90)
    assert codes == [2, 0], first[-2000:] + second[-2000:]
    assert "error: could not write the closing lines" in first, first[-2000:]
    assert ended[0] - ended[1] < 10, ended  # (30 s after rank 1 when rank 0 waited for it to hear)


@pytest.mark.slow
def test_under_srun_a_peer_killed_outright_stops_rank_0_promptly(tmp_path, data_root):
    """Rank 1 is killed (SIGKILL, as by the kernel's OOM killer) while it reads the data: it
    announces nothing, and rank 0, whose wait fails under gloo, ends in one line within seconds
    (it waits a moment for news, and never for the dead process to hear)."""
    root, data_overrides = data_root
    hooks = hooked_pythonpath(
        tmp_path / "hooks",
        "import os, signal\n"
        "if os.environ.get('SLURM_PROCID') == '1':\n"
        "    from gpt.training import build\n"
        "    def killed(*args, **kwargs):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    build._load_data = killed\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": hooks}
    args = ["debug=tiny", *data_overrides, "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"]
    codes, (first, _), ended = _srun(args, tmp_path, env, timeout=90)
    assert codes == [2, -9], first[-2000:]
    assert "error: process 0 of 2 stopped because another process of this run exited" in first, first[-2000:]
    assert ended[0] - ended[1] < 15, ended


@pytest.mark.slow
def test_under_srun_a_rank_waiting_where_it_cannot_see_a_peer_fail_is_stopped(tmp_path, data_root):
    """NCCL does not notice a peer that has gone: a rank waiting in a collective waits until its
    timeout. Here rank 1's waits for rank 0 to prepare the data never return (patched through a
    sitecustomize, as such a collective would behave), and rank 0 refuses the data: rank 1 is
    stopped within seconds with rank 0's reason. And a healthy run under srun ends with status 0
    on both tasks (no process is stopped when rank 0, the store's host, exits first)."""
    root, data_overrides = data_root
    corpus = tmp_path / "blank.txt"
    corpus.write_text("  \n\n  \n")
    blind = hooked_pythonpath(
        tmp_path / "hooks",
        "import os, time\n"
        "if os.environ.get('SLURM_PROCID') == '1':\n"
        "    from gpt.runtime import distributed\n"
        "    distributed.barrier = lambda d, patient=False: time.sleep(600)\n",
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONPATH": blind}
    args = ["data=local", f"data.source.path={corpus}", "data.tokenizer.kind=char", "device=cpu"]
    codes, (first, second), ended = _srun([*args, f"hydra.run.dir={tmp_path / 'bad'}"], tmp_path, env, timeout=90)
    assert codes == [2, 1], first[-2000:] + second[-2000:]
    assert "error: the corpus is empty" in first, first[-2000:]
    assert "error: process 1 of 2 stops because process 0 of 2 failed: the corpus is empty" in second, second[-2000:]
    assert ended[1] - ended[0] < 20, ended  # (not the 600 s wait)

    env["PYTHONPATH"] = str(REPO)
    good = tmp_path / "good"
    args = ["debug=tiny", *data_overrides, "device=cpu", "train.max_iters=10", f"hydra.run.dir={good}"]
    codes, (first, second), _ = _srun(args, tmp_path, env)
    assert codes == [0, 0], first[-2000:] + second[-2000:]
    assert "stops because" not in first + second and runs.latest(good) is not None


@pytest.mark.slow
def test_a_sweep_under_torchrun_has_one_folder_and_one_leaderboard(tmp_path, data_root):
    """`torchrun ... train.py -m`: every rank's Hydra launcher makes a sweep folder of its own
    (`${now:...}` differs by microseconds) and a folder per job. Rank 0's is the sweep's; the
    others' are scratch, gone when they exit, and only rank 0 writes and announces the leaderboard."""
    root, data_overrides = data_root
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    args = ["-m", "distributed=fsdp", "optim.lr=1e-3,3e-3", "debug=tiny", "train.sample_tokens=0", *data_overrides]
    done = subprocess.run(
        [*TORCHRUN, *args, f"paths.runs_dir={tmp_path / 'out'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (sweep,) = (tmp_path / "out" / "sweeps").iterdir()
    board = (sweep / "leaderboard.md").read_text()
    assert board.count("| finished |") == 2 and "no summary" not in board
    assert done.stdout.count("leaderboard: ") == 1
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("tinygpt-sweep")]


def test_slurm_jobs_start_their_tasks_with_kill_on_bad_exit(tmp_path):
    """hydra/launcher=slurm's job script exports SLURM_KILL_BAD_EXIT=1 before its srun (srun's
    --kill-on-bad-exit, read from the environment), so a task killed outright (kill -9, the OOM
    killer), which can tell no one (gpt.runtime.alarm), still ends its peers instead of leaving them
    in NCCL's next collective until its timeout. The script is the one submitit writes from the
    composed launcher settings."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra: pip install -e '.[slurm]'")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from submitit.slurm.slurm import _make_sbatch_string

    from gpt.apps.common import config_dir
    from gpt.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    script = _make_sbatch_string(command="python -u job.py", folder=tmp_path, setup=list(cfg.hydra.launcher.setup))
    lines = [line.strip() for line in script.splitlines()]
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert "export SLURM_KILL_BAD_EXIT=1" in lines[:srun], script
