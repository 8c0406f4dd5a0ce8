"""Sweep summaries: a leaderboard (Markdown + CSV) and a plot of every run's val-loss curve.

Written when a multirun ends (gpt.apps.train.LeaderboardCallback, registered in
configs/hydra/default.yaml), or on demand: `tinygpt sweep outputs/sweeps/<stamp>`.

Runs that crashed, were interrupted, are still running or left no summary are listed too,
marked as such, below the finished ones of equal loss.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path

from gpt.errors import TinyGPTError
from gpt.runtime import io
from gpt.runtime.io import atomic_write
from gpt.tracking.plots import pyplot, read_metrics, save
from gpt.tracking.records import status_of

LEGEND_WIDTH = 60  # characters of a legend line (7-point type in an 8-inch figure)
COLUMNS = [
    "rank",
    "run",
    "status",
    "best_val_loss",
    "final_val_loss",
    "step",
    "tokens_per_s",
    "params",
    "wall_s",
    "overrides",
    "error",
]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job folders: those holding Hydra's record of a job or a run summary. Hydra
    names them 0, 1, 2, ... unless hydra.sweep.subdir says otherwise; numbers sort as numbers."""
    jobs = [
        p
        for p in sweep_dir.iterdir()
        if p.is_dir() and ((p / ".hydra").is_dir() or (p / "summary.json").is_file() or p.name.isdigit())
    ]
    return sorted(jobs, key=lambda job: run_order(job.name))


def run_order(name: str) -> tuple:
    """Sort key of a sweep's job folder names: Hydra's numbers as numbers, then any other name."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _overrides(job: Path, summary: dict) -> list[str]:
    """The job's command-line overrides: Hydra's record of them (there from the job's start, also
    when the job died before writing a summary), else the summary's."""
    import yaml

    try:
        recorded = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        recorded = None
    return [str(o) for o in (recorded if isinstance(recorded, list) else summary.get("overrides") or [])]


def task_columns(rows: list[dict]) -> list[str]:
    """The zero-shot task figures some run of the sweep reported (train.eval_tasks): <task>/<metric>."""
    return sorted({c for row in rows for c in row if "/" in c})


def higher_is_better(column: str) -> bool:
    return column.rsplit("/", 1)[-1].startswith("acc")  # accuracies; losses and perplexities fall


def _task_figures(summary: dict) -> dict:
    tasks = summary.get("tasks")
    if not isinstance(tasks, dict):
        return {}
    return {
        f"{name}/{metric}": value
        for name, figures in tasks.items()
        if isinstance(figures, dict)
        for metric, value in figures.items()
        if metric != "step" and isinstance(value, (int, float))
    }


def collect(sweep_dir: Path, rank_by: str = "best_val_loss") -> tuple[list[dict], list[str]]:
    """The rows, ranked, each with the overrides that set it apart; and the overrides every run
    shares."""
    rows = []
    for job in _job_dirs(sweep_dir):
        summary = _read_json(job / "summary.json") or {}
        rows.append(
            {
                **_task_figures(summary),
                "run": job.name,
                "status": status_of(summary),
                "best_val_loss": summary.get("best_val_loss"),
                "final_val_loss": summary.get("final_val_loss"),
                "step": summary.get("step"),
                "tokens_per_s": summary.get("tokens_per_s"),
                "params": summary.get("params"),
                # the whole run's, over its resumes (summary.json's wall_s is its latest start's)
                "wall_s": summary.get("elapsed_s", summary.get("wall_s")),
                "overrides": _overrides(job, summary),
                "error": summary.get("error"),
                "curve": [(r["step"], r["val"]) for r in read_metrics(job)[1]],
            }
        )

    rankable = ["best_val_loss", "final_val_loss", *task_columns(rows)]
    if rank_by not in rankable:
        raise TinyGPTError(f"rank_by={rank_by!r}: no run of {sweep_dir} reports it; use one of {', '.join(rankable)}")
    sign = -1.0 if higher_is_better(rank_by) else 1.0

    def key(row):
        value = row.get(rank_by)
        usable = isinstance(value, (int, float)) and math.isfinite(value)
        return (not usable, sign * value if usable else 0.0, row["status"] != "finished", run_order(row["run"]))

    # Show what sets runs apart: the overrides that are not common to every run of the sweep
    # (among the runs whose overrides are known).
    known = [set(r["overrides"]) for r in rows if r["overrides"]]
    common = set.intersection(*known) if len(known) > 1 else set()
    shared = [o for o in next((r["overrides"] for r in rows if r["overrides"]), []) if o in common]  # in command-line order
    for row in rows:
        row["overrides"] = " ".join(o for o in row["overrides"] if o not in common)
    rows.sort(key=key)
    for i, row in enumerate(rows, 1):
        row["rank"] = i
    return rows, shared


def _fmt(column: str, value) -> str:
    if value is None:
        return ""
    if column == "error":  # one line already; a Markdown cell must not hold a pipe
        return " ".join(str(value).split()).replace("|", "\\|")
    if column.endswith("loss") or "/" in column:  # losses and task figures
        return f"{value:.4f}"
    if column == "wall_s":
        return f"{value:.1f}"
    if isinstance(value, (int, float)) and column != "run":
        return f"{value:,.0f}"
    return str(value)


def write_leaderboard(sweep_dir: str | Path, rank_by: str = "best_val_loss") -> list[dict]:
    """Write leaderboard.md, leaderboard.csv and val_curves.png into sweep_dir; return the rows,
    ranked by best val loss or by another column (a task's figure, e.g. hellaswag/acc_norm)."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / "summary.json").is_file() or (sweep_dir / "checkpoints").is_dir():
        raise TinyGPTError(f"{sweep_dir} is a run directory, not a sweep; pass the folder of a multirun (outputs/sweeps/<stamp>)")
    if not sweep_dir.is_dir():
        raise TinyGPTError(f"sweep directory {sweep_dir} does not exist; pass the folder of a multirun (outputs/sweeps/<stamp>)")
    # The folder above the sweeps (outputs/sweeps) holds sweeps, not jobs. (A sweep with no job
    # yet, e.g. queued on SLURM, is an empty leaderboard.)
    inner = [] if _job_dirs(sweep_dir) else sorted(p for p in sweep_dir.iterdir() if p.is_dir() and _job_dirs(p))
    if inner:
        raise TinyGPTError(f"{sweep_dir} holds {len(inner)} sweep(s), not jobs; pass one of them, e.g. {inner[-1]}")
    rows, shared = collect(sweep_dir, rank_by)
    at = COLUMNS.index("final_val_loss") + 1
    columns = COLUMNS[:at] + task_columns(rows) + COLUMNS[at:]
    with atomic_write(sweep_dir / "leaderboard.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    order = "highest" if higher_is_better(rank_by) else "lowest"
    lines = [f"# Sweep {sweep_dir.name}: {len(rows)} run(s), sorted by {rank_by} ({order} first)", ""]
    if shared:
        lines += [f"Every run: `{' '.join(shared)}`", ""]
    if rows:
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_fmt(c, row.get(c)) for c in columns) + " |" for row in rows]
    else:
        lines.append("No runs yet.")
    io.write_bytes(sweep_dir / "leaderboard.md", ("\n".join(lines) + "\n").encode())
    plot_curves(rows, sweep_dir / "val_curves.png")
    return rows


def plot_curves(rows: list[dict], path: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(8, 5), dpi=100)
    for row in rows:
        if row["curve"]:
            steps, losses = zip(*row["curve"])
            label = f"{row['run']}: {row['overrides'] or '(defaults)'}"
            if row["status"] != "finished":
                label += f" [{row['status']}]"
            # a job's whole command line (a scaling study's) is wider than the figure: wrapped
            ax.plot(steps, losses, marker="o", markersize=3, label=textwrap.fill(label, LEGEND_WIDTH))
    ax.set_xlabel("step")
    ax.set_ylabel("val loss")
    ax.set_title(f"{path.parent.name}: validation loss")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no evaluations yet", ha="center", va="center", transform=ax.transAxes)
    save(fig, path)
