"""An IsoFLOP study, start to end:

    plan (every job's size and steps, checked before anything trains)
    -> the jobs as one Hydra multirun of `tinygpt train` (model.depth x train.flops_budget), into
       <out>/runs/<job>/, so launchers, failures, leaderboard and resume are a sweep's
    -> collect the finished jobs' summary.json -> fit (gpt.scaling.fit) -> report (gpt.scaling.report)
    -> optionally train the predicted optimum at the larger budget and compare (<out>/check/<job>/)

Each job's folder is named by its two overrides (Hydra's override_dirname), so a rerun into the
same `out` finds every job where it left it: a finished one is not trained again (it reports
"already reached step N"), an interrupted one resumes from its checkpoint, a failed or missing
one starts; a study extended with a budget or a size reuses the jobs it shares.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpt.config import RunConfig, ScalingConfig
from gpt.errors import TinyGPTError
from gpt.model import compute, meta
from gpt.scaling.fit import Point

RUNS, CHECK = "runs", "check"


@dataclass
class Job:
    depth: int
    budget: float
    params: int  # N (params_non_embedding)
    steps: int  # what train.flops_budget gives (0: less than one step)

    @property
    def label(self) -> str:
        return f"depth {self.depth} at {self.budget:.3g} FLOPs"


def shapes(settings: RunConfig, depths, vocab_size: int) -> dict[int, dict]:
    """compute.counts of the model at each depth, built on the meta device (no memory, no time:
    a GPU preset's models are sized here on a laptop)."""

    from gpt.model import registry

    out = {}
    for depth in depths:
        config = registry.with_vocab(settings.model.changed(depth=depth), vocab_size)
        with meta.building():
            out[depth] = compute.counts(registry.build(config))
    return out


def tokens_per_step(settings: RunConfig) -> int:
    t = settings.train
    return t.batch_size * settings.model.block_size * t.grad_accum_steps


def plan(s: ScalingConfig, settings: RunConfig, vocab_size: int, log) -> list[Job]:
    """Every job of the study, with its steps; refused in one line when the smallest model cannot
    take one step at the smallest budget (no job of that budget could). A larger model too big
    for a budget is said now; its job fails with that reason and the fit goes on without it."""
    per_step = tokens_per_step(settings)
    sizes = shapes(settings, s.depths, vocab_size)
    jobs = []
    for budget in s.budgets:
        for depth in s.depths:
            fpt = sizes[depth]["flops_per_token"]
            jobs.append(Job(depth, budget, sizes[depth]["params_non_embedding"], math.floor(budget / (fpt * per_step))))
    smallest = min(s.depths, key=lambda d: sizes[d]["flops_per_token"])
    one_step = sizes[smallest]["flops_per_token"] * per_step
    if min(s.budgets) < one_step:
        raise TinyGPTError(
            f"budget {min(s.budgets):g} is too small for the smallest model (depth {smallest}) to take one step "
            f"({one_step:.3g} FLOPs: {sizes[smallest]['flops_per_token']:.3g} per token x {per_step:,} tokens); "
            f"raise the smallest budget to at least {one_step:.2g} or use a smaller batch"
        )
    for job in jobs:
        if job.steps < 1:
            log(
                f"notice: depth {job.depth} cannot take one step on {job.budget:g} FLOPs: that job will fail and be left out of the fit"
            )
    return jobs


def launch(out: Path, s: ScalingConfig, overrides: list[str], log) -> int:
    """Run the study's jobs as one multirun of `tinygpt train` (in a child process, with this
    console); returns its exit status (1: some jobs failed, which the fit can live with). A
    SIGTERM to this process is passed on, so the running job saves and the sweep stops cleanly;
    Ctrl-C reaches the child from the terminal itself."""
    from gpt.config.overrides import override_value

    # Every key but the two that set a job apart is left out of its folder's name.
    keys = sorted(k for k in _keys(overrides) if not k.startswith("hydra"))
    command = [
        sys.executable,
        "-m",
        "gpt",
        "train",
        "-m",
        f"hydra.sweep.dir={override_value(str(out / RUNS))}",
        "hydra.sweep.subdir=${hydra.job.override_dirname}",
        f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keys)}]",
        "model.depth=" + ",".join(str(d) for d in s.depths),
        "train.flops_budget=" + ",".join(budget_text(b) for b in s.budgets),
        *overrides,
    ]
    log(f"training {len(s.depths) * len(s.budgets)} jobs into {out / RUNS}")
    return _run_child(command)


def train_one(run_dir: Path, depth: int, budget: float, overrides: list[str]) -> int:
    """One run of `tinygpt train` into run_dir (the prediction's check); its exit status."""
    from gpt.config.overrides import override_value

    command = [sys.executable, "-m", "gpt", "train", f"hydra.run.dir={override_value(str(run_dir))}"]
    return _run_child([*command, f"model.depth={depth}", f"train.flops_budget={budget_text(budget)}", *overrides])


def budget_text(budget: float) -> str:
    """A budget as an override: every digit kept (the job's folder, and the fit's grouping, match
    the budget exactly), as Hydra writes a float back into the folder name."""
    return str(float(budget))


def _keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def _run_child(command: list[str]) -> int:
    """The command's exit status; 0 when a SIGTERM passed on to it ended it before it could
    answer (while it started up, before its own handler was in place): a stop like any other,
    which the study reports from its jobs' folders."""
    child = subprocess.Popen(command)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    forwarded = []

    def forward(*_) -> None:
        forwarded.append(signal.SIGTERM)
        child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends Ctrl-C to the child too
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if code == -signal.SIGTERM and forwarded else code


@dataclass
class Collected:
    points: list[Point]
    failed: dict[str, str]  # job name -> its one-line error
    unfinished: dict[str, str]  # job name -> interrupted | running | not run | ...
    seconds: float  # the jobs' wall-clock time, summed (set-up and evals included)


def job_folders(runs: Path) -> dict[tuple[int, float], Path]:
    """The study's job folders by (depth, budget), as Hydra recorded each job's overrides (its
    folder name is Hydra's rendering of them, e.g. `model.depth=2,train.flops_budget=1000000000000.0`)."""
    import yaml

    found = {}
    for folder in sorted(runs.glob("*/.hydra/overrides.yaml")):
        try:
            given = dict(o.split("=", 1) for o in yaml.safe_load(folder.read_text()) if "=" in o)
            found[(int(given["model.depth"]), float(given["train.flops_budget"]))] = folder.parent.parent
        except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError):
            continue  # not a job of this study (or a record cut short)
    return found


def collect(out: Path, jobs: list[Job]) -> Collected:
    """The finished jobs as fit points, and what became of the others, by job label."""
    from gpt.tracking.records import status_of

    folders = job_folders(out / RUNS)
    points, failed, unfinished, seconds = [], {}, {}, 0.0
    for job in jobs:
        folder = folders.get((job.depth, job.budget))
        summary = read_summary(folder) if folder is not None else {}
        status = status_of(summary) if summary else "not run"
        loss = summary.get("final_val_loss")
        name = f"{RUNS}/{folder.name}" if folder is not None else job.label
        seconds += summary.get("elapsed_s") or 0.0
        if status == "finished" and isinstance(loss, (int, float)) and math.isfinite(loss):
            points.append(
                Point(
                    job.budget, job.depth, summary["params_non_embedding"], summary["tokens_seen"], summary["flops"], loss, name
                )
            )
        elif status in ("failed", "finished"):  # a finished run without a finite loss diverged
            failed[name] = summary.get("error") or "no finite validation loss"
        else:
            unfinished[name] = status
    return Collected(points, failed, unfinished, seconds)


def nearest_depth(settings: RunConfig, params: float, vocab_size: int) -> tuple[int, int]:
    """The model.depth whose N is nearest `params` on a log scale, and its N."""
    best, depth = None, 1
    while True:
        n = shapes(settings, [depth], vocab_size)[depth]["params_non_embedding"]
        if best is None or abs(math.log(n / params)) < abs(math.log(best[1] / params)):
            best = (depth, n)
        if n > params or depth > 256:
            return best
        depth += 1


def read_summary(run_dir: Path) -> dict:
    from gpt.tracking import read_json

    return read_json(run_dir / "summary.json")
