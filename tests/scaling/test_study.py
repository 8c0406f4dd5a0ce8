"""`tinygpt scaling` as a user runs it: bad input refused in one line before anything trains, a
whole smoke study (fit.json, report.md, plots, every job's summary.json) with one job failing,
and an interrupted study that resumes without training its finished jobs again.
Run: pytest tests/scaling/test_study.py (the end-to-end studies are marked slow)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, assert_one_line_error, run_script

PNG = b"\x89PNG\r\n\x1a\n"


def job(depth: int, budget: float) -> str:
    """A job's folder as Hydra names it (its two overrides, the budget as Python prints a float)."""
    return f"model.depth={depth},train.flops_budget={float(budget)}"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["budgets=[1e10]"], "budgets=[1e+10]: a scaling fit needs at least 2 different compute budgets"),
        (["depths=[1,2]"], "depths=[1, 2]: each budget needs at least 3 model sizes"),
        (["budgets=[1e10,lots]"], "budgets[1] must be a number, got 'lots'"),
        (["depths=[1,two,3]"], "depths[1] must be an integer"),
        (["budgets=[1e10,-3e10]"], "every budget must be a number of FLOPs > 0"),
        (["budgets=[1e4,1e10]"], "budget 10000 is too small for the smallest model (depth 1) to take one step"),
        (["model.depth=4"], "the study sets each job's size and horizon itself"),
        (["train.max_iters=100"], "the study sets each job's size and horizon itself"),
        (["hydra.sweep.dir=/tmp/elsewhere"], "choose the folder with out=<folder>"),
        (["optim.lr=1e-3,3e-3"], "a study's jobs take one value per setting"),
        (["preset=huge"], "unknown preset config 'huge'"),
        (["optim.lr=fast"], "optim.lr must be a number"),
        (["model=lstm"], "has no model.depth"),
    ],
)
def test_bad_input_is_one_line_before_anything_trains(args, needle, tmp_path, data_root):
    root, data_overrides = data_root
    out = tmp_path / "study"
    proc = run_script("scaling", ["preset=smoke", f"out={out}", *data_overrides, *args], tmp_path, root)
    assert_one_line_error(proc, needle)
    assert not (out / "runs").exists()


def test_an_out_that_is_a_file_is_refused(tmp_path, data_root):
    root, data_overrides = data_root
    (tmp_path / "notes.txt").write_text("keep me")
    proc = run_script("scaling", ["preset=smoke", f"out={tmp_path / 'notes.txt'}", *data_overrides], tmp_path, root)
    assert_one_line_error(proc, "is a file; name a folder for the study")
    assert (tmp_path / "notes.txt").read_text() == "keep me"


@pytest.mark.slow
def test_a_study_with_a_failing_job_fits_from_the_rest_and_names_it(tmp_path, data_root):
    root, data_overrides = data_root
    out = tmp_path / "study"
    # A job whose folder cannot hold checkpoints (a file where the folder goes): it fails when it saves.
    broken = out / "runs" / job(2, 1e10)
    broken.mkdir(parents=True)
    (broken / "checkpoints").write_text("not a folder")
    # check=true: the predicted optimum is trained too, at 4x the largest budget
    proc = run_script("scaling", ["preset=smoke", f"out={out}", "check=true", *data_overrides], tmp_path, root, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"1 of 9 jobs failed and are left out of the fit (first: runs/{job(2, 1e10)}" in proc.stderr

    fit = json.loads((out / "fit.json").read_text())
    assert list(fit["failed"]) == [f"runs/{job(2, 1e10)}"] and not fit["unfinished"]
    assert len(fit["runs"]) == 8 and isinstance(fit["a"], float) and isinstance(fit["b"], float)
    # the budget that lost a size has two left: no parabola; the others give the laws
    assert "2 finished size(s)" in fit["skipped"]["1e+10"]
    assert [o["budget"] for o in fit["optima"]] == [3e10, 9e10]
    assert set(fit["prediction"]) == {"budget", "params", "tokens", "loss"} and fit["prediction"]["budget"] == 4 * 9e10
    for depth in (1, 2, 3):
        for budget in (1e10, 3e10, 9e10):
            summary = json.loads((out / "runs" / job(depth, budget) / "summary.json").read_text())
            assert summary["status"] == ("failed" if (depth, budget) == (2, 1e10) else "finished")
            assert summary["flops_budget"] == budget
            if summary["status"] == "finished":
                assert summary["flops"] <= budget and summary["model"].startswith(f"{depth}L {depth}H {16 * depth}D")
    check, pred = fit["check"], fit["prediction"]
    sizes = {d: json.loads((out / "runs" / job(d, 3e10) / "summary.json").read_text())["params_non_embedding"] for d in (1, 3)}
    assert check["depth"] >= 1 and check["params"] > 0
    if check["depth"] in sizes:
        assert check["params"] == sizes[check["depth"]]
    measured = json.loads((out / check["run"] / "summary.json").read_text())
    assert measured["status"] == "finished" and measured["final_val_loss"] == check["loss"]
    assert measured["flops"] == check["flops"] <= pred["budget"] and measured["model"].startswith(f"{check['depth']}L ")
    report = (out / "report.md").read_text()
    assert f"measured val loss **{check['loss']:.4f}** vs predicted **{pred['loss']:.4f}**" in report
    assert f"`runs/{job(2, 1e10)}`: failed:" in report and f"a = {fit['a']:.3f}" not in report  # shown as **a**
    assert f"C^**{fit['a']:.3f}** (`a`)" in report and f"C^**{fit['b']:.3f}** (`b`)" in report
    for name in ("isoflops.png", "frontier.png", "loss_vs_compute.png"):
        assert (out / name).read_bytes()[:8] == PNG and f"![{name}]({name})" in report


@pytest.mark.slow
def test_an_interrupted_study_resumes_without_retraining_finished_jobs(tmp_path, data_root):
    root, data_overrides = data_root
    out = tmp_path / "study"
    args = ["preset=smoke", f"out={out}", *data_overrides]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    study = subprocess.Popen(
        [sys.executable, "-m", "gpt", "scaling", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Jobs run depth by depth, budgets in order: stop the study a few seconds into depth 1's
    # largest budget (its longest job), after its two smaller budgets have finished.
    first_two = [out / "runs" / job(1, b) for b in (1e10, 3e10)]
    third = out / "runs" / job(1, 9e10)
    deadline = time.time() + 300
    while not (all(_status(j) == "finished" for j in first_two) and (third / "train.log").exists()):
        assert study.poll() is None and time.time() < deadline, "the study ended before it could be stopped"
        time.sleep(0.2)
    time.sleep(3)
    study.send_signal(signal.SIGTERM)  # as a scheduler would: to the study's process
    output, _ = study.communicate(timeout=300)
    assert study.returncode == 0, output[-3000:]
    assert "rerun the same command to finish" in output and not (out / "fit.json").exists()
    assert _status(third) == "interrupted"
    before = {j: (j / "metrics.jsonl").read_bytes() for j in first_two}
    stamps = {j: sorted((p.name, p.stat().st_mtime_ns) for p in (j / "checkpoints").iterdir()) for j in first_two}

    proc = run_script("scaling", args, tmp_path, root, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for j in first_two:  # not trained again: the same records, the same checkpoint files
        assert (j / "metrics.jsonl").read_bytes() == before[j]
        assert sorted((p.name, p.stat().st_mtime_ns) for p in (j / "checkpoints").iterdir()) == stamps[j]
    assert "resuming from" in (third / "train.log").read_text() and _status(third) == "finished"
    fit = json.loads((out / "fit.json").read_text())
    assert len(fit["runs"]) == 9 and not fit["failed"] and not fit["unfinished"]


def _status(folder) -> str | None:
    try:
        return json.loads((folder / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
def test_every_preset_composes_and_every_job_can_take_a_step(preset):
    """Each preset's jobs, composed as the study composes them (the GPU preset's too, which no
    test trains), each at least a few steps long; the CPU preset is at least 3 budgets x 4 sizes."""
    from gpt.scaling import study
    from helpers import compose

    s = compose([f"preset={preset}", "out=x"], config_name="scaling")
    settings = compose([*s.train, f"model.depth={s.depths[0]}"])
    vocab = 65 if settings.data.tokenizer.kind == "char" else 50257
    notices = []
    jobs = study.plan(s, settings, vocab, notices.append)
    assert not notices and all(job.steps >= 10 for job in jobs), [(j.label, j.steps) for j in jobs]
    assert len(set(s.budgets)) >= 3 and len(set(s.depths)) >= (4 if preset == "cpu" else 3) and s.predict > max(s.budgets)
    for depth in s.depths:
        compose([*s.train, f"model.depth={depth}", f"train.flops_budget={s.budgets[0]:g}"])


def test_a_sigterm_passed_on_to_a_job_still_starting_is_a_stop_not_a_status_of_its_own():
    """The study passes SIGTERM on to its sweep. One arriving while the sweep is still starting
    (before its own handler is in place) ends it by the signal's default action: that is the stop
    asked for (status 0: the study then reports its unfinished jobs), where it exited 241 (-15)
    and said nothing. A child ended by a signal nobody passed on keeps its status."""
    import threading

    from gpt.scaling import study

    before = signal.getsignal(signal.SIGTERM)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    assert study._run_child(sleeper) == 0 and time.monotonic() - started < 30
    killer = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert study._run_child(killer) == -signal.SIGKILL
    assert signal.getsignal(signal.SIGTERM) == before  # the study's own handling back in place
