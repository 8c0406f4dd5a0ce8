"""A run's records on disk: metrics.jsonl (one line per logged step and eval), summary.json
(status, figures, and a heartbeat that tells a live run from a dead one) and `RunRecords`, the
one object the trainer writes them all through (TensorBoard's events included)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from gpt.runtime import io
from gpt.runtime.runlock import STALE_AFTER
from gpt.tracking import read_json
from gpt.tracking.tensorboard import NullTracker, TensorBoardTracker


class MetricsFile:
    """Appends one JSON object per line to <run>/metrics.jsonl, at full float precision (for
    tools, plots and exact comparisons); a None path makes it a no-op. Every row carries its
    time: `time` (Unix seconds) and `elapsed_s` (the run's seconds so far, from `clock`: over all
    its resumes), so "time to reach loss X" needs nothing but the file."""

    def __init__(self, path: Path | None, clock=None):
        self.f = open(path, "a", encoding="utf-8") if path is not None else None
        self.started = time.time()
        self.clock = clock or (lambda: time.time() - self.started)

    def write(self, **record) -> None:
        if self.f is not None:
            row = {**record, "time": time.time(), "elapsed_s": record.get("elapsed_s", self.clock())}
            self.f.write(json.dumps(row) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


BEAT_EVERY = 10.0  # seconds: between the summary writes that only say "still here" (each is an fsync)


class RunSummary:
    """<run>/summary.json: where a run stands, rewritten (atomically) at start, at every logged
    step and eval, and at the end, so that a crashed or killed run still leaves a truthful
    record. Each write carries its writer (host, pid) and time (heartbeat), so that a run whose
    process died without a word (kill -9, out of memory) reads as stale, not running
    (`status_of`)."""

    def __init__(self, path: Path | None, **fixed):
        self.path = path
        self.data = {"status": "running", **fixed, "host": socket.gethostname(), "pid": os.getpid()}
        # the training thread, and a distributed run's alarm ending this process (gpt.runtime.alarm),
        # write through the same temporary file: one at a time
        self._writing = threading.Lock()

    def update(self, **values) -> None:
        with self._writing:
            self.data.update(values, heartbeat=time.time())
            if self.path is not None:
                io.write_json(self.path, self.data)

    def beat(self, **values) -> None:
        """`update`, at most once every BEAT_EVERY seconds (progress between evals)."""
        if time.time() - self.data.get("heartbeat", 0.0) >= BEAT_EVERY:
            self.update(**values)


def status_of(summary: dict, now: float | None = None) -> str:
    """A summary's status, with `stale` for a run recorded as running whose writer is gone: its
    process no longer exists (same host), or no heartbeat for STALE_AFTER seconds (another host)."""
    status = summary.get("status", "no summary")
    if status != "running":
        return status
    # On Windows os.kill(pid, 0) would end the process: there only the heartbeat tells.
    if os.name == "posix" and summary.get("host") == socket.gethostname() and isinstance(summary.get("pid"), int):
        try:
            os.kill(summary["pid"], 0)
        except ProcessLookupError:
            return "stale"
        except PermissionError:
            pass  # alive, another user's
        return status
    heartbeat = summary.get("heartbeat")
    if isinstance(heartbeat, (int, float)) and (now or time.time()) - heartbeat > STALE_AFTER:
        return "stale"
    return status


def record_failure(out_dir: Path, error: str, replaces: str | None = None, **fields) -> None:
    """summary.json saying `failed` for a run that failed before it trained (its settings, its
    data), so that a sweep lists it too. Never over a run's own record or checkpoints: a refused
    resume must not rewrite the run it refused to touch. `replaces`: the error a run that failed
    while training recorded itself, to be said as `error` instead (with more to it)."""
    out_dir = Path(out_dir)
    earlier = read_json(out_dir / "summary.json")
    if replaces is not None and earlier.get("status") == "failed" and earlier.get("error") == replaces:
        io.write_json(out_dir / "summary.json", {**earlier, "error": error})
        return
    if (out_dir / "summary.json").exists() or any((out_dir / "checkpoints").glob("*.pt")):
        return
    RunSummary(out_dir / "summary.json", **fields).update(status="failed", error=error)


class RunRecords:
    """A run's records as one object: TensorBoard events, metrics.jsonl and summary.json under
    its directory; with no directory (ranks other than 0, or before training starts) no-ops."""

    METRICS = ["hparams/best_val_loss", "hparams/final_val_loss"]  # what the HParams tab ranks runs by

    def __init__(
        self,
        out_dir: Path | None = None,
        settings: dict | None = None,
        first_step: int = 0,
        task_tags: list[str] = (),
        clock=None,
        **summary,
    ):
        """`clock`: the run's elapsed seconds (metrics.jsonl's `elapsed_s`); `summary`: fields of
        summary.json known at the start."""
        self.out_dir = out_dir
        self.tb = TensorBoardTracker(out_dir / "tb") if out_dir is not None else NullTracker()
        self.metrics = MetricsFile(out_dir / "metrics.jsonl" if out_dir is not None else None, clock)
        # A resumed run carries its record on (its last eval's figures stay until the next one).
        earlier = read_json(out_dir / "summary.json") if out_dir is not None and first_step > 0 else {}
        earlier = {k: v for k, v in earlier.items() if k not in ("status", "error")}  # this run's own, from now
        self.summary = RunSummary(out_dir / "summary.json" if out_dir is not None else None, **{**earlier, **summary})
        if out_dir is not None:
            if first_step == 0:
                self.tb.config(settings)
            self.tb.hparams(settings, self.METRICS + list(task_tags))
            self.summary.update(step=first_step)

    def train(self, step: int, loss: float, lr: float, ms_per_step: float, **scalars) -> None:
        """A logged training step: its loss, lr, time and other scalars (grad_norm, perf/...)."""
        self.tb.scalars(step, {"loss/train": loss, "lr": lr, "perf/ms_per_step": ms_per_step, **scalars})
        self.metrics.write(kind="train", step=step, loss=loss, lr=lr, ms_per_step=ms_per_step)

    def eval(self, step: int, train: float, val: float, best: float, elapsed_s: float | None = None) -> None:
        """An eval's losses; `elapsed_s`: the time to record with it (the clock's now if None),
        so that summary.json's best_elapsed_s is the very figure of its row."""
        self.tb.scalars(step, {"loss/train_eval": train, "loss/val": val, self.METRICS[0]: best, self.METRICS[1]: val})
        self.metrics.write(
            kind="eval", step=step, train=train, val=val, **({} if elapsed_s is None else {"elapsed_s": elapsed_s})
        )

    def tasks(self, step: int, figures: dict[str, dict]) -> None:
        """Zero-shot task figures ({task: {metric: value}}): TensorBoard under tasks/<task>/<metric>,
        metrics.jsonl, and summary.json's `tasks` (what a sweep's leaderboard can rank by)."""
        self.tb.scalars(step, {f"tasks/{name}/{k}": v for name, f in figures.items() for k, v in f.items()})
        self.metrics.write(kind="tasks", step=step, **figures)
        self.summary.update(tasks={name: {**f, "step": step} for name, f in figures.items()})

    def close(self) -> None:
        """The run's end, with its status (TensorBoard's HParams tab shows it per session). A disk
        that cannot take them is one line (TinyGPTError), once every record had its try."""
        failed = None
        for part in (lambda: self.tb.end(self.summary.data.get("status", "running")), self.tb.close, self.metrics.close):
            try:
                part()
            except OSError as e:
                failed = failed or e
        if failed is not None:
            from gpt.errors import TinyGPTError

            raise TinyGPTError(
                f"cannot write the run's records in {self.out_dir} ({failed.strerror or failed}); its checkpoints are "
                f"as the log says: free space, then resume"
            )
