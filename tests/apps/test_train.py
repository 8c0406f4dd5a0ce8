"""gpt/apps/train.py: `python train.py` / `tinygpt train` as a user runs it: checkpoints, logs,
TensorBoard events, a clean stop on SIGTERM and its resume, sweeps (local, Optuna, SLURM
config), the baby GPT's recipe, and the README's quickstart target.
Run: pytest tests/apps/test_train.py"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gpt.checkpoints import checkpoint, runs
from gpt.runtime import devices
from helpers import REPO, SHARED_TEXT, assert_one_line_error, run_script, sigterm_after_step_5

QUICK = ["debug=tiny", "train.max_iters=10", "train.eval_interval=5"]


def test_train_writes_checkpoints_logs_and_events(trained_run):
    cwd, run_dir, stdout = trained_run
    assert "best val loss" in stdout and "python sample.py run_dir=" in stdout
    # training autocasts to bf16 on CPUs with native bf16 (the rule: tests/test_runtime.py)
    assert "device cpu" in stdout and ("dtype bfloat16 autocast" if devices.cpu_has_native_bf16() else "dtype float32") in stdout
    assert len([line for line in stdout.splitlines() if line.startswith("eval step")]) == 3  # printed once each
    assert (run_dir / "train.log").read_text().count("eval step") == 3  # steps 0, 10, 20
    names = sorted(p.name for p in (run_dir / runs.CKPT_DIR).iterdir())
    assert names == ["best.pt", "ckpt-0000010.pt", "ckpt-0000020.pt"]
    for name in names:
        ckpt = checkpoint.load(run_dir / runs.CKPT_DIR / name)
        assert ckpt.tokenizer["kind"] == "char" and ckpt.model_config["n_embd"] == 24
    last = checkpoint.load(runs.latest(run_dir))
    assert last.step == 20 and last.training is not None and last.config["train"]["max_iters"] == 20
    assert checkpoint.load(run_dir / runs.CKPT_DIR / "best.pt").training is None
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 10, 20]
    assert [r["step"] for r in records if r["kind"] == "train"] == [5, 10, 15, 20]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["run_dir"] == str(run_dir) and summary["overrides"][0] == "debug=tiny"

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss/train", "loss/val", "loss/train_eval", "lr", "perf/tokens_per_s"} <= scalars
    assert [e.step for e in events.Scalars("loss/val")] == [0, 10, 20]
    assert {"config/text_summary", "sample/text_summary"} <= set(events.Tags()["tensors"])


def test_no_network_and_no_local_copy(tmp_path):
    empty = tmp_path / "empty-data"
    proc = run_script("train.py", ["debug=tiny", "data.source.url=http://127.0.0.1:9/input.txt"], tmp_path, empty)
    assert_one_line_error(proc, "could not download", str(empty / "tinyshakespeare" / "input.txt"), "TINYGPT_DATA_DIR")
    assert not any(p.is_file() for p in empty.rglob("*"))


def test_the_console_command_trains_like_the_script(tmp_path, data_root):
    root, data_overrides = data_root
    proc = run_script(
        "train",
        ["debug=tiny", *data_overrides, "train.max_iters=2", "train.eval_interval=2", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        root,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert checkpoint.load(runs.latest(tmp_path / "run")).step == 2


def test_smoke_shakespeare_char_experiment(tmp_path, data_root):
    root, data_overrides = data_root
    args = [
        "experiment=shakespeare_char",
        "train.max_iters=3",
        "train.eval_iters=1",
        "train.eval_interval=3",
        "train.batch_size=2",
        "train.sample_tokens=5",
        *data_overrides,
    ]
    proc = run_script("train.py", args, tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6L 6H 384D block 256" in proc.stdout


def test_sigterm_saves_and_exits_cleanly_then_resumes(tmp_path, data_root):
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    args = ["debug=tiny", *data_overrides, "train.max_iters=100000", "train.log_interval=1", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONUNBUFFERED": "1"}
    returncode, out, err = sigterm_after_step_5([sys.executable, str(REPO / "train.py"), *args], tmp_path, env)
    assert returncode == 0, err[-2000:]
    assert "stopped at step" in out and f"hydra.run.dir={run_dir}" in out
    stopped_at = checkpoint.load(runs.latest(run_dir)).step
    assert stopped_at >= 5 and json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"

    resumed = run_script(
        "train.py",
        ["debug=tiny", *data_overrides, f"train.max_iters={stopped_at + 3}", f"hydra.run.dir={run_dir}"],
        tmp_path,
        root,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / runs.step_file(stopped_at)} at step {stopped_at}" in resumed.stdout
    assert checkpoint.load(runs.latest(run_dir)).step == stopped_at + 3
    assert (run_dir / ".hydra-1" / "overrides.yaml").is_file()  # the first invocation's record is kept


def test_a_resume_that_would_change_the_run_s_data_or_optimizer_is_refused_with_what_restores_them(tmp_path, data_root):
    """A resumed run's settings are composed from the defaults and the command line, so resuming
    a run trained on other data with another optimizer by its folder alone would have gone on with
    the quickstart's data and Muon (a "changed:" notice; best.pt then scored on another val set).
    Refused in one line, nothing written, naming what the run's last start passed; passed again,
    the run resumes."""
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    started = [
        "debug=tiny",
        "data=shakespeare_char",
        "optim=adamw",
        *data_overrides,
        "train.max_iters=4",
        "train.sample_tokens=0",
    ]
    first = run_script("train.py", [*started, f"hydra.run.dir={run_dir}"], tmp_path, root)
    assert first.returncode == 0, first.stderr[-2000:]
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))

    bare = run_script(
        "train.py", ["debug=tiny", *data_overrides, "train.max_iters=8", f"hydra.run.dir={run_dir}"], tmp_path, root
    )
    assert_one_line_error(
        bare,
        "data.name=shakespeare_char (this command's: shakespeare_bytes)",
        "optim=adamw (this command's: optim=muon)",
        "pass again what its last start passed of them: data=shakespeare_char optim=adamw",
    )
    same_data = run_script(
        "train.py",
        ["debug=tiny", "data=shakespeare_char", *data_overrides, "train.max_iters=8", f"hydra.run.dir={run_dir}"],
        tmp_path,
        root,
    )
    assert_one_line_error(same_data, "trained with optim=adamw (this command's: optim=muon)")
    assert "data.name" not in same_data.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before

    again = run_script("train.py", [*started, "train.max_iters=8", f"hydra.run.dir={run_dir}"], tmp_path, root)
    assert again.returncode == 0, again.stderr[-2000:]
    assert checkpoint.load(runs.latest(run_dir)).step == 8


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra: pip install -e '.[slurm]'")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from gpt.apps.common import config_dir
    from gpt.config import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = hydra_compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher.gpus_per_node == 1 and "submitit" in cfg.hydra.launcher._target_


def test_the_slurm_launcher_off_a_cluster_or_without_its_plugin_is_one_line(tmp_path, data_root):
    """Off a cluster, submitit's RuntimeError ('Could not detect "srun"') was a traceback; without
    the plugin, Hydra's 'Could not load' named no package to install."""
    from hydra.errors import MissingConfigException

    from gpt.apps.common import explain

    missing = MissingConfigException("In 'hydra/launcher/slurm': Could not load 'hydra/launcher/submitit_slurm'.", "x")
    assert explain(missing).endswith("hydra/launcher=slurm needs the slurm extra: pip install 'tinygpt[slurm]'")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the slurm extra: pip install -e '.[slurm]'")
    if shutil.which("srun"):
        pytest.skip("this machine has srun: the launcher would submit")
    root, data_overrides = data_root
    args = ["-m", "hydra/launcher=slurm", "debug=tiny", *data_overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert_one_line_error(run_script("train.py", args, tmp_path, root), "finds no srun here: run it on the cluster")


@pytest.mark.slow
def test_quickstart_reaches_target_and_samples(tmp_path, data_root):
    """The README's promise: the default `python train.py` reaches val loss <= 1.90 on the real
    Tiny Shakespeare, and `python sample.py` then prints text (~1.5 min on 2 cores)."""
    root, data_overrides = data_root
    if data_overrides:
        pytest.skip(f"the 1.90 target is defined on the real corpus; {SHARED_TEXT} is absent")
    proc = run_script("train.py", [], tmp_path, root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = float(re.search(r"\(final (\d+\.\d+)\)", proc.stdout).group(1))
    assert final <= 1.90, proc.stdout[-2000:]

    sample = run_script("sample.py", ["num_samples=1", "max_new_tokens=200"], tmp_path, root)
    assert sample.returncode == 0, sample.stderr
    text = sample.stdout.split("sample 1/1 ----------\n", 1)[1]
    # Shakespeare-like: mostly letters and spaces, with speaker-style lines ("NAME:").
    assert sum(c.isalpha() or c.isspace() for c in text) / len(text) > 0.85
    assert re.search(r"^[A-Z][A-Za-z ]+:$", text, flags=re.M) or text.count("\n") >= 3


def test_after_a_stop_the_hint_resumes_only_what_was_saved(tmp_path):
    """A signal during set-up (before the first checkpoint) leaves nothing to resume: the line says
    to start again, not to resume a run that holds no checkpoint."""
    from gpt.apps.train import after_stop

    assert after_stop(tmp_path, "tinygpt train").startswith("stopped before the run saved a checkpoint: nothing to resume")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / runs.step_file(5)).write_bytes(b"x")
    assert after_stop(tmp_path, "tinygpt train") == f"resume with: tinygpt train <the same overrides> hydra.run.dir={tmp_path}"


def test_a_resume_examines_its_checkpoint_once(tmp_path, data_root):
    """`train.py hydra.run.dir=R` into a run: the command line finds where it resumes from before
    Hydra writes anything and the run's set-up takes that as found. Counted through a
    sitecustomize hook: each checkpoint is examined (gpt.training.claim.resumable) once, and read twice
    (mapped to be examined, then loaded to resume); it was examined twice and read three times."""
    from helpers import hooked_pythonpath

    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    args = ["debug=tiny", *data_overrides, f"hydra.run.dir={run_dir}", "train.sample_tokens=0", "threads=1"]
    assert run_script("train.py", [*args, "train.max_iters=10"], tmp_path, root).returncode == 0
    hook = (
        "import atexit, collections\n"
        "from pathlib import Path\n"
        "from gpt.checkpoints import checkpoint\nfrom gpt.training import claim as resume\n"
        "seen = collections.Counter()\n"
        "real_examine, real_read = resume.resumable, checkpoint.load\n"
        "def resumable(path):\n"
        "    seen['examined ' + Path(path).name] += 1\n"
        "    return real_examine(path)\n"
        "def load(path, *a, **k):\n"
        "    seen['read ' + Path(path).name] += 1\n"
        "    return real_read(path, *a, **k)\n"
        "resume.resumable, checkpoint.load = resumable, load\n"
        "atexit.register(lambda: print('counted', dict(sorted(seen.items()))))\n"
    )
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONPATH": hooked_pythonpath(tmp_path / "hook", hook)}
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args, "train.max_iters=20"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "resuming from" in proc.stdout, proc.stderr[-2000:]
    assert "counted {'examined ckpt-0000010.pt': 1, 'read ckpt-0000010.pt': 2}" in proc.stdout, proc.stdout[-500:]
