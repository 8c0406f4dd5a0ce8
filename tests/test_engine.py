"""Training engine: exact resume, preemption, atomic checkpoints under SIGKILL, DDP parity,
non-finite step guard. Run: pytest tests/test_engine.py"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, TINY_RUN, compose, run_script
from gpt import checkpoint
from gpt.errors import TinyGPTError
from gpt.model import GPT
from gpt.preemption import Preempted
from gpt.trainer import train

ENGINE_RUN = [o for o in TINY_RUN if not o.startswith(("train.max_iters", "train.eval_interval", "train.log_interval"))] + [
    "train.max_iters=30", "train.eval_interval=10", "train.log_interval=1", "optim.warmup_iters=5", "train.sample_tokens=0",
]


def _train_collecting(cfg: dict, stop_after: int | None = None) -> dict[int, float]:
    losses: dict[int, float] = {}

    def on_step(step: int, loss: float) -> None:
        losses[step] = loss
        if step == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)  # the real preemption path, in-process

    if stop_after is None:
        train(cfg, on_step=on_step)
    else:
        with pytest.raises(Preempted):
            train(cfg, on_step=on_step)
    return losses


# mid-interval, right at an eval, and with Muon's momentum buffers in the optimizer state
@pytest.mark.parametrize("stop_at, accum, optim", [(13, 1, "adamw"), (10, 2, "adamw"), (13, 1, "muon")])
def test_resume_continues_the_exact_trajectory(tmp_path, data_root, stop_at, accum, optim):
    root, data_overrides = data_root
    # dropout: the RNG must resume too; accumulation: the data stream must
    overrides = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "model.dropout=0.1",
                 f"train.grad_accum_steps={accum}", f"optim={optim}"]
    full = _train_collecting(compose(overrides, tmp_path / "full"))
    assert sorted(full) == list(range(1, 31))

    first = _train_collecting(compose(overrides, tmp_path / "split"), stop_after=stop_at)
    assert sorted(first) == list(range(1, stop_at + 1))  # stopped after finishing that step
    assert checkpoint.latest(tmp_path / "split").name == checkpoint.step_file(stop_at)
    rest = _train_collecting(compose(overrides, tmp_path / "split"))  # same run dir: resume=auto
    assert sorted(rest) == list(range(stop_at + 1, 31))
    assert {**first, **rest} == full  # bitwise: same floats at every step
    a, b = (checkpoint.load(checkpoint.latest(tmp_path / d)) for d in ("full", "split"))
    assert a["best_val_loss"] == b["best_val_loss"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    evals = lambda d: [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]  # noqa: E731
    assert [e["step"] for e in evals("split")] == [0, 10, 20, 30]  # no eval repeated or skipped at the resume


def test_resume_from_another_run_leaves_it_untouched(tmp_path, data_root):
    root, data_overrides = data_root
    overrides = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}"]
    train(compose(overrides, tmp_path / "a"))
    before = {p.name: p.read_bytes() for p in (tmp_path / "a" / "checkpoints").iterdir()}
    more = _train_collecting(compose([*overrides, "train.max_iters=40", f"resume={tmp_path / 'a'}"], tmp_path / "b"))
    assert sorted(more) == list(range(31, 41))
    assert {p.name: p.read_bytes() for p in (tmp_path / "a" / "checkpoints").iterdir()} == before
    assert checkpoint.latest(tmp_path / "b").name == "ckpt-0000040.pt"


def _sigterm_after_step_5(cmd: list[str], cwd, env) -> tuple[int, str, str]:
    """Start a training command, SIGTERM it once it has logged step 5, and wait for it to end.
    Returns (exit status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step 5/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path, data_root):
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    args = [*TINY_RUN, *data_overrides, "train.max_iters=100000", "train.log_interval=1", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONUNBUFFERED": "1"}
    returncode, out, err = _sigterm_after_step_5([sys.executable, str(REPO / "train.py"), *args], tmp_path, env)
    assert returncode == 0, err[-2000:]
    assert "stopped at step" in out and f"hydra.run.dir={run_dir}" in out
    stopped_at = checkpoint.load(checkpoint.latest(run_dir))["step"]
    assert stopped_at >= 5

    resumed = run_script("train.py", [*TINY_RUN, *data_overrides, f"train.max_iters={stopped_at + 3}", f"hydra.run.dir={run_dir}"], tmp_path, root)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / checkpoint.step_file(stopped_at)} at step {stopped_at}" in resumed.stdout
    assert checkpoint.load(checkpoint.latest(run_dir))["step"] == stopped_at + 3
    assert (run_dir / ".hydra-1" / "overrides.yaml").is_file()  # the first invocation's record is kept


_WRITER = """
import sys, torch
from gpt import checkpoint
payload = {"model": {"w": torch.randn(3_000_000)}, "model_config": {}, "step": 0}
i = 0
while True:
    i += 1
    payload["step"] = i
    checkpoint.save(sys.argv[1], payload)
    print(i, flush=True)
"""


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_sigkill_while_writing_keeps_a_loadable_checkpoint(tmp_path, delay):
    path = tmp_path / "checkpoints" / checkpoint.step_file(7)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    proc.stdout.readline()  # one complete checkpoint exists
    time.sleep(delay)  # ...and the writer is somewhere in the middle of another
    proc.kill()
    proc.wait()
    ckpt = checkpoint.load(path)
    assert ckpt["step"] >= 1 and ckpt["model"]["w"].shape == (3_000_000,)
    assert checkpoint.latest(tmp_path) == path  # a leftover temporary is never taken for a checkpoint


def _metrics(run_dir, kind):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line)["kind"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize("accum", [1, 2])
def test_two_process_ddp_matches_one_process(tmp_path, data_root, accum):
    root, data_overrides = data_root
    common = [o for o in ENGINE_RUN if not o.startswith(("train.batch_size", "train.max_iters"))] + [
        *data_overrides, "train.max_iters=12", "device=cpu", f"train.grad_accum_steps={accum}"]
    single = run_script("train.py", [*common, "train.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, root)
    assert single.returncode == 0, single.stderr[-2000:]
    work = tmp_path / "ddp"
    work.mkdir()
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py"),
         *common, "train.batch_size=4"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "DDP over 2 processes" in ddp.stdout
    assert f"micro-batch 4 x accum {accum} x 2 process(es) = global batch of {128 * accum}" in ddp.stdout
    runs = list((work / "outputs" / "runs").iterdir())
    assert len(runs) == 1 and sorted(p.name for p in work.iterdir()) == ["outputs"]  # rank 1 made no run dir or log
    one, two = _metrics(tmp_path / "one", "train"), _metrics(runs[0], "train")
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 13))
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(one, two)) <= 1e-5
    evals_one, evals_two = _metrics(tmp_path / "one", "eval"), _metrics(runs[0], "eval")
    assert max(abs(a["val"] - b["val"]) for a, b in zip(evals_one, evals_two)) <= 1e-5


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_once_and_the_rerun_resumes(tmp_path, data_root):
    """A scheduler preempts the launcher: torchrun forwards SIGTERM to both workers, which agree
    on the step to stop at, rank 0 saves, and both exit. (torchrun itself then reports the signal
    and exits non-zero; that part is its own.) The same command again resumes."""
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    common = [*TINY_RUN, *data_overrides, "device=cpu", "train.log_interval=1", f"hydra.run.dir={run_dir}"]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "train.py")]
    _, out, err = _sigterm_after_step_5([*launch, *common, "train.max_iters=100000"], tmp_path, env)
    assert "stopped at step" in out and "resume with: torchrun" in out, err[-2000:]
    stopped_at = checkpoint.load(checkpoint.latest(run_dir))["step"]
    assert stopped_at >= 5 and len(checkpoint.step_checkpoints(run_dir)) == 1

    resumed = subprocess.run([*launch, *common, f"train.max_iters={stopped_at + 3}"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"at step {stopped_at}" in resumed.stdout and "resuming from" in resumed.stdout
    assert checkpoint.load(checkpoint.latest(run_dir))["step"] == stopped_at + 3


def _poison(monkeypatch, bad_calls):
    """Make the training forward pass return NaN on the given (1-based) training calls."""
    real = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = real(self, idx, targets, **kw)
        if self.training and targets is not None:
            calls["n"] += 1
            if calls["n"] in bad_calls:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def test_isolated_nan_steps_are_skipped(tmp_path, data_root, monkeypatch, caplog):
    root, data_overrides = data_root
    _poison(monkeypatch, {4, 9})
    caplog.set_level(logging.INFO, logger="tinygpt")
    train(compose([*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_iters=15"], tmp_path))
    assert caplog.text.count("update skipped") == 2 and "2 non-finite step(s) skipped" in caplog.text
    ckpt = checkpoint.load(checkpoint.latest(tmp_path))
    assert ckpt["step"] == 15 and ckpt["bad_steps"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_divergence_stops_with_last_good_checkpoint_untouched(tmp_path, data_root, monkeypatch):
    root, data_overrides = data_root
    _poison(monkeypatch, set(range(13, 1000)))
    cfg = compose([*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_bad_steps=3"], tmp_path)
    with pytest.raises(TinyGPTError, match="diverged: 3 non-finite steps in a row at step 15.*ckpt-0000010.pt"):
        train(cfg)
    assert [p.name for p in checkpoint.step_checkpoints(tmp_path)] == ["ckpt-0000010.pt"]
    assert all(torch.isfinite(v).all() for v in checkpoint.load(checkpoint.latest(tmp_path))["model"].values())


def test_process_placement_from_torchrun_or_slurm(monkeypatch):
    from gpt import distributed

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.from_env() == distributed.Dist(0, 0, 1)
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert distributed.from_env() == distributed.Dist(5, 1, 8)
    monkeypatch.setenv("RANK", "3")  # torchrun inside a SLURM allocation: torchrun's view wins
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed.from_env() == distributed.Dist(3, 3, 4)
