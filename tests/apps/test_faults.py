"""Faults a run meets in the wild, through the commands: damaged checkpoints (cut short, bytes
flipped, blocks zeroed) given to sample, eval and train's resume=, and a run whose best.pt is
damaged. Each either works as with the intact file or ends in one line; never a traceback, never
torch's advice to load with weights_only=False. Run: pytest tests/apps/test_faults.py"""

from __future__ import annotations

import shutil

import pytest

from gpt.checkpoints import runs
from helpers import assert_one_line_error, corrupted_variants, run_script


def _one_line_or_success(capsys, call) -> str:
    """Run a command's main() in this process; 'ok' or 'refused' (one `error:` line, status 2)."""
    try:
        call()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    err = capsys.readouterr().err
    assert "weights_only" not in err and "Traceback" not in err, err
    if code == 0:
        return "ok"
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("notice:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return "refused"


@pytest.mark.slow
def test_150_damaged_checkpoints_through_sample_eval_and_resume(trained_run, data_root, tmp_path, capsys, monkeypatch):
    from gpt.apps import eval as eval_app
    from gpt.apps import sample as sample_app
    from gpt.apps import train as train_app

    cwd, run_dir, _ = trained_run
    root, data_overrides = data_root
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TINYGPT_DATA_DIR", str(root))
    trained = []  # what train.py would have trained from: the checks before Hydra passed
    monkeypatch.setattr(train_app, "_hydra_main", lambda argv: trained.append(argv))
    (tmp_path / "essay.txt").write_text("ROMEO: But soft, what light through yonder window breaks?\n" * 3)
    good = runs.latest(run_dir).read_bytes()
    path = tmp_path / "damaged.pt"
    outcomes: dict[str, dict[str, int]] = {}
    for _kind, data in corrupted_variants(good, 150, seed=1):
        path.write_bytes(data)
        calls = {
            "sample": lambda: sample_app.main([f"ckpt={path}", "max_new_tokens=3", "prompt=ROMEO:", "threads=1"]),
            "eval": lambda: eval_app.main([f"ckpt={path}", f"text_file={tmp_path / 'essay.txt'}", "threads=1"]),
            "train": lambda: train_app.main(["debug=tiny", *data_overrides, f"resume={path}", "threads=1"]),
        }
        for name, call in calls.items():
            result = _one_line_or_success(capsys, call)
            outcomes.setdefault(name, {}).setdefault(result, 0)
            outcomes[name][result] += 1
    for name in ("sample", "eval", "train"):
        assert sum(outcomes[name].values()) == 150 and outcomes[name].get("refused", 0) > 125, outcomes
    assert len(trained) == outcomes["train"].get("ok", 0)


@pytest.mark.slow
def test_the_real_commands_on_damaged_files_and_a_run_whose_best_pt_is_damaged(trained_run, data_root, tmp_path):
    """The same through the real processes, a few variants of each kind; and a run directory whose
    best.pt is damaged: sample and eval use its newest step checkpoint instead, saying why, and
    leave the damaged file where it is."""
    cwd, run_dir, _ = trained_run
    root, data_overrides = data_root
    good = runs.latest(run_dir).read_bytes()
    for i, (_kind, data) in enumerate(corrupted_variants(good, 6, seed=2)):
        path = tmp_path / f"damaged-{i}.pt"
        path.write_bytes(data)
        for command, args in (("sample.py", ["max_new_tokens=3"]), ("train.py", ["debug=tiny", *data_overrides])):
            key = "ckpt" if command == "sample.py" else "resume"
            proc = run_script(command, [f"{key}={path}", *args], tmp_path, root)
            if proc.returncode != 0:
                assert_one_line_error(proc, str(path))
            assert "weights_only" not in proc.stderr
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    best = copy / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[:2000])
    proc = run_script("sample.py", [f"run_dir={copy}", "max_new_tokens=3", "prompt=ROMEO:"], tmp_path, root)
    assert proc.returncode == 0, proc.stderr
    newest = runs.latest(copy).name
    assert "best.pt: the file is damaged or cut short" in proc.stderr, proc.stderr
    assert f"using {newest} instead" in proc.stderr and best.stat().st_size == 2000
    (tmp_path / "essay.txt").write_text("ROMEO: But soft, what light through yonder window breaks?\n" * 3)
    proc = run_script("eval", [f"run_dir={copy}", f"text_file={tmp_path / 'essay.txt'}"], tmp_path, root)
    assert proc.returncode == 0 and f"using {newest} instead" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_sigterm_during_the_final_sample_ends_a_finished_run_cleanly(data_root, tmp_path):
    """Training done and saved, the final sample under way: SIGTERM skips the sample; exit 0 and
    summary.json says finished (it was left at running, exit 143, before)."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from helpers import REPO

    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "train.py"), "debug=tiny", *data_overrides, f"hydra.run.dir={run_dir}"]
    cmd += ["train.max_iters=10", "train.eval_interval=5", "train.sample_tokens=1000000", "threads=1"]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("eval step 10"):
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 0, rest
    assert "final sample skipped" in rest and "Traceback" not in rest
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 10


@pytest.mark.slow
def test_kill_9_at_random_moments_then_reruns_end_with_the_uninterrupted_figures(data_root, tmp_path):
    """kill -9 anywhere (set-up, a step, an eval, a checkpoint write, the summary write), then the
    same command again until it finishes: the summary's figures equal an uninterrupted run's
    (they come from the checkpoint resumed, not a summary.json the kill left behind or ahead)."""
    import json
    import os
    import random
    import subprocess
    import sys
    import time

    from helpers import REPO

    root, data_overrides = data_root
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}

    def command(run_dir):
        return [sys.executable, str(REPO / "train.py"), "debug=tiny", *data_overrides, f"hydra.run.dir={run_dir}"] + [
            "train.max_iters=60",
            "train.eval_interval=10",
            "train.sample_tokens=0",
            "threads=1",
        ]

    figures = ("best_val_loss", "final_val_loss", "step", "tokens_seen", "status")
    t0 = time.time()
    subprocess.run(command(tmp_path / "reference"), cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    duration = time.time() - t0
    reference = json.loads((tmp_path / "reference" / "summary.json").read_text())
    rng = random.Random(9)
    for trial in range(2):  # tests/test_reproducible.py kills at random steps under load, three trials more
        run_dir = tmp_path / f"trial-{trial}"
        for _kill in range(2):
            proc = subprocess.Popen(command(run_dir), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.3, duration))
            proc.kill()  # SIGKILL: no handler, no cleanup
            proc.wait()
        done = subprocess.run(command(run_dir), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert {k: summary.get(k) for k in figures} == {k: reference[k] for k in figures}, trial
