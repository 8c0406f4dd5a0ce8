"""gpt/tracking/leaderboard.py: a sweep folder summarised, partial and crashed runs included.
Run: pytest tests/test_leaderboard.py"""

from __future__ import annotations

import csv
import json

import pytest

from gpt.errors import TinyGPTError
from gpt.tracking.leaderboard import write_leaderboard
from helpers import compose, train_recording_losses


def _fake_job(sweep, n, status=None, best=None, curve=()):
    job = sweep / str(n)
    job.mkdir(parents=True)
    if status:
        (job / "summary.json").write_text(
            json.dumps({"status": status, "best_val_loss": best, "final_val_loss": best, "step": 10, "overrides": [f"x={n}"]})
        )
    with open(job / "metrics.jsonl", "w") as f:
        for step, val in curve:
            f.write(json.dumps({"kind": "eval", "step": step, "train": val, "val": val}) + "\n")
        f.write('{"kind": "eval", "st')  # a record cut short by a crash


def test_leaderboard_marks_partial_and_crashed_runs(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    assert write_leaderboard(sweep) == []  # no job yet (queued, or not started)
    assert "No runs yet" in (sweep / "leaderboard.md").read_text() and (sweep / "val_curves.png").exists()

    _fake_job(sweep, 0, "finished", 2.0, [(0, 4.0), (10, 2.0)])
    _fake_job(sweep, 1, "failed", 1.5, [(0, 4.0), (5, 1.5)])
    _fake_job(sweep, 2, "running", None, [])
    _fake_job(sweep, 3, None)  # crashed before writing anything
    _fake_job(sweep, 4, "finished", 1.8, [(0, 4.0), (10, 1.8)])
    (sweep / "multirun.yaml").write_text("not a job")
    rows = write_leaderboard(sweep)
    assert [(r["run"], r["status"]) for r in rows] == [
        ("1", "failed"),
        ("4", "finished"),
        ("0", "finished"),
        ("2", "running"),
        ("3", "no summary"),
    ]
    with open(sweep / "leaderboard.csv") as f:
        assert [r["run"] for r in csv.DictReader(f)] == ["1", "4", "0", "2", "3"]
    assert (sweep / "val_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TinyGPTError, match="does not exist"):
        write_leaderboard(tmp_path / "nope")


def test_only_the_differing_overrides_are_listed_also_without_a_summary(tmp_path):
    """A job that died before its first summary still has Hydra's record of its overrides."""
    sweep = tmp_path / "sweep"
    for n, lr in enumerate(("1e-3", "3e-3", "1e-2")):
        job = sweep / str(n)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- model=gpt-nano\n- optim.lr={lr}\n")
        if n != 1:
            (job / "summary.json").write_text(json.dumps({"status": "finished", "best_val_loss": 2.0 + n}))
    (sweep / "3").mkdir()  # a job that left nothing at all
    rows = {r["run"]: r for r in write_leaderboard(sweep)}
    assert {run: r["overrides"] for run, r in rows.items()} == {
        "0": "optim.lr=1e-3",
        "1": "optim.lr=3e-3",
        "2": "optim.lr=1e-2",
        "3": "",
    }
    assert rows["1"]["status"] == "no summary"
    assert "Every run: `model=gpt-nano`" in (sweep / "leaderboard.md").read_text()  # what they share, said once


def test_an_error_stays_on_its_row(tmp_path):
    job = tmp_path / "sweep" / "0"
    job.mkdir(parents=True)
    (job / "summary.json").write_text(json.dumps({"status": "failed", "error": "line one\nline | two"}))
    write_leaderboard(tmp_path / "sweep")
    row = [line for line in (tmp_path / "sweep" / "leaderboard.md").read_text().splitlines() if line.startswith("| 1 ")]
    assert len(row) == 1 and row[0].endswith("| line one line \\| two |")


def test_a_run_directory_is_not_a_sweep(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(TinyGPTError, match="is a run directory, not a sweep"):
        write_leaderboard(tmp_path)
    assert not (tmp_path / "leaderboard.md").exists()


def test_a_sweep_ranks_by_a_task_figure(tmp_path):
    """train.eval_tasks' figures become columns; rank_by orders by one, accuracies highest first
    and perplexities lowest first; a figure no run reports is a one-line error."""
    sweep = tmp_path / "sweep"
    figures = [(2.0, 0.30, 40.0), (1.5, 0.25, 30.0), (1.8, 0.35, 50.0)]  # best val loss, acc_norm, lambada perplexity
    for n, (best, acc_norm, ppl) in enumerate(figures):
        job = sweep / str(n)
        job.mkdir(parents=True)
        tasks = {
            "hellaswag": {"acc": 0.2, "acc_norm": acc_norm, "step": 10},
            "lambada": {"acc": 0.1, "perplexity": ppl, "step": 10},
        }
        (job / "summary.json").write_text(json.dumps({"status": "finished", "best_val_loss": best, "tasks": tasks}))
    (sweep / "3").mkdir()  # a job that left nothing: last whatever the ranking
    assert [r["run"] for r in write_leaderboard(sweep)] == ["1", "2", "0", "3"]
    assert [r["run"] for r in write_leaderboard(sweep, "hellaswag/acc_norm")] == ["2", "0", "1", "3"]
    with open(sweep / "leaderboard.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["hellaswag/acc_norm"] == "0.35" and rows[0]["lambada/perplexity"] == "50.0"
    assert "sorted by hellaswag/acc_norm (highest first)" in (sweep / "leaderboard.md").read_text()
    assert [r["run"] for r in write_leaderboard(sweep, "lambada/perplexity")] == ["1", "0", "2", "3"]
    with pytest.raises(TinyGPTError, match="rank_by='arc_easy/acc': no run of .* reports it; use one of best_val_loss"):
        write_leaderboard(sweep, "arc_easy/acc")


def test_a_long_command_line_is_wrapped_in_the_curves_legend_so_the_figure_lays_out(tmp_path):
    """A scaling study's first job is labelled by its whole command line, wider than the figure;
    unwrapped, matplotlib warns 'Tight layout not applied' and squeezes the plot."""
    import warnings

    from gpt.tracking.leaderboard import plot_curves

    long = " ".join(f"scaling.setting_{i}=value_{i}" for i in range(12))
    rows = [{"run": "0", "overrides": long, "status": "running", "curve": [(1, 3.0), (2, 2.5)]}]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plot_curves(rows, tmp_path / "curves.png")
    assert [str(w.message) for w in seen] == []
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_resumed_jobs_wall_time_is_the_whole_runs(tmp_path, data_root):
    """A job stopped (SIGTERM) and rerun: its summary's wall_s is the rerun's alone (a fraction of
    a fresh job's), its elapsed_s the whole run's; the leaderboard shows the whole run's."""
    root, data_overrides = data_root
    job = compose(["debug=tiny", "train.max_iters=10", *data_overrides, f"paths.data_dir={root}"], tmp_path / "sweep" / "0")
    train_recording_losses(job, stop_after=5)
    train_recording_losses(job)  # the same folder: resumed
    summary = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["elapsed_s"] > summary["wall_s"]
    (row,) = write_leaderboard(tmp_path / "sweep")
    assert row["wall_s"] == summary["elapsed_s"]
    with open(tmp_path / "sweep" / "leaderboard.csv") as f:
        assert float(next(csv.DictReader(f))["wall_s"]) == summary["elapsed_s"]
