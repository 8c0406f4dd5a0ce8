"""A CPU run's numbers do not depend on what else the machine is doing (issue 26, item 1), checked
through the real `train.py` on the tiny model, whose losses change from about step 14 on when the
thread count does: a run beside a busy process equals one alone, bitwise (and says once that
other work is there); OMP_NUM_THREADS=1 is one thread; kill -9 at random moments while spinner
processes come and go, then the same command until it finishes, ends bitwise as an uninterrupted
run; a resume takes its checkpoint's thread count (and says when told another); metrics.jsonl and
summary.json carry the run's wall time, over its resumes. OMP_NUM_THREADS is removed from every
run's environment unless a test sets it. End-to-end (about 75 s on 2 idle cores), so all marked
slow. Run: pytest tests/test_reproducible.py"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from gpt.checkpoints import checkpoint, runs
from helpers import REPO, sigterm_after_step_5

# 40 steps, a loss at every one, an eval and a checkpoint every 5: resume points all along the run.
# 48 dims: wide enough that 1 and 2 threads split some sum differently (debug=tiny's 24 is not,
# and then the equalities below would hold whatever the count: test_the_thread_count_shows_...)
RUN = ["debug=tiny", "model.n_embd=48", "train.max_iters=40", "train.eval_interval=5", "train.log_interval=1"]
RUN += ["train.sample_tokens=0"]
STEPS = 40
TIMING = ("time", "elapsed_s", "ms_per_step")  # what may differ between equal runs
FIGURES = ("best_val_loss", "final_val_loss", "step", "tokens_seen", "status")  # summary.json's results
# A process that keeps one core busy, and ends itself if the test process dies without killing it.
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _env(data_root, **extra: str) -> dict:
    """The commands' environment as a user's shell would give it, without OMP_NUM_THREADS (the
    tests' own runner may set it) unless `extra` sets it."""
    env = {**os.environ, "TINYGPT_DATA_DIR": str(data_root[0]), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    for name in ("OMP_NUM_THREADS", "HYDRA_FULL_ERROR"):
        env.pop(name, None)
    return {**env, **extra}


def _command(data_root, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), *RUN, *data_root[1], f"hydra.run.dir={run_dir}", *extra]


@dataclass
class Ran:
    """One training process: its run directory, its output, and when it ran (by the test's clock,
    so the process's own times lie inside)."""

    dir: Path
    log: str
    started: float
    ended: float


def _train(data_root, run_dir: Path, *extra: str, **env: str) -> Ran:
    started = time.time()
    proc = subprocess.run(
        _command(data_root, run_dir, *extra),
        cwd=run_dir.parent,
        env=_env(data_root, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    ended = time.time()
    assert proc.returncode == 0, proc.stdout[-3000:]
    return Ran(run_dir, proc.stdout, started, ended)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _figures(rows: list[dict]) -> list[dict]:
    """The rows' numbers (losses, lr) without their timing."""
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _by_step(rows: list[dict], kind: str) -> dict[int, dict]:
    return {row["step"]: row for row in _figures(rows) if row["kind"] == kind}


def _thread_counts(log: str) -> list[int]:
    """Every `threads N (...)` the run logged: the count it chose (one, unless it changed)."""
    return [int(n) for n in re.findall(r"\bthreads (\d+) \(", log)]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _assert_same_end(run_dir: Path, reference: Path) -> None:
    """The summary's figures, the final checkpoint's losses and its weights, exactly."""
    summary, expected = _summary(run_dir), _summary(reference)
    assert {k: summary.get(k) for k in FIGURES} == {k: expected[k] for k in FIGURES}
    final, wanted = checkpoint.load(runs.latest(run_dir)), checkpoint.load(runs.latest(reference))
    assert final.step == wanted.step == STEPS
    assert (final.last_eval, final.best_val_loss) == (wanted.last_eval, wanted.best_val_loss)
    assert final.model.keys() == wanted.model.keys()
    assert all(torch.equal(final.model[name], wanted.model[name]) for name in wanted.model), "weights differ"


def _assert_rows_match(rows: list[dict], reference: Path) -> None:
    """Each of `rows` (train and eval) has the figures of the reference's row of its step."""
    assert rows
    expected = {kind: _by_step(_rows(reference), kind) for kind in ("train", "eval")}
    for row in _figures(rows):
        assert row == expected[row["kind"]][row["step"]], row


class Load:
    """Other work on this machine: spinner processes, held at a number (`hold`) or coming and going
    at random moments (`vary`, from a background thread) until `stop`."""

    def __init__(self):
        self.spinners: list[subprocess.Popen] = []
        self.counts: list[int] = []  # the spinner count set at each draw
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, n: int) -> None:
        with self._lock:
            while len(self.spinners) < n:
                self.spinners.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL))
            while len(self.spinners) > n:
                spinner = self.spinners.pop()
                spinner.kill()
                spinner.wait()
            self.counts.append(n)

    def vary(self, rng: random.Random, most: int = 2, every: tuple[float, float] = (0.2, 1.5)) -> None:
        """0 to `most` spinners, a new number every `every` seconds (uniformly drawn)."""
        self.stop()
        self._stop.clear()
        self.hold(rng.randint(0, most))

        def change() -> None:
            while not self._stop.wait(rng.uniform(*every)):
                self.hold(rng.randint(0, most))

        self._thread = threading.Thread(target=change, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.hold(0)


@pytest.fixture
def load():
    other = Load()
    try:
        yield other
    finally:
        other.stop()  # no spinner outlives its test


@pytest.fixture(scope="module")
def alone(data_root, tmp_path_factory) -> Ran:
    """An uninterrupted run with the default thread count, nothing of this file's running beside it."""
    return _train(data_root, tmp_path_factory.mktemp("alone") / "run")


@pytest.fixture(scope="module")
def one_thread(data_root, tmp_path_factory) -> Ran:
    """An uninterrupted run with threads=1."""
    return _train(data_root, tmp_path_factory.mktemp("one-thread") / "run", "threads=1")


@dataclass
class Resumed:
    stopped: Ran  # threads=1, stopped by SIGTERM after step 5
    rows_before: int  # metrics.jsonl's rows when it stopped
    ckpt: checkpoint.Checkpoint  # the checkpoint it left, which the resume continues from
    copy: Path  # the run directory as the stop left it, for a second resume
    resumed: Ran  # the same run directory trained again without threads= or OMP_NUM_THREADS


@pytest.fixture(scope="module")
def resumed(data_root, tmp_path_factory) -> Resumed:
    folder = tmp_path_factory.mktemp("resumed")
    run_dir = folder / "run"
    started = time.time()
    code, out, err = sigterm_after_step_5(_command(data_root, run_dir, "threads=1"), folder, _env(data_root))
    stopped = Ran(run_dir, out + err, started, time.time())
    assert code == 0 and "stopped at step" in out, (code, out[-2000:], err[-2000:])
    ckpt = checkpoint.load(runs.latest(run_dir))
    assert 5 <= ckpt.step < STEPS and ckpt.training.threads == 1
    rows_before = len(_rows(run_dir))
    copy = folder / "copy"
    shutil.copytree(run_dir, copy)
    return Resumed(stopped, rows_before, ckpt, copy, _train(data_root, run_dir))


@pytest.mark.slow
def test_a_busy_sibling_process_changes_neither_the_count_nor_a_single_loss(data_root, tmp_path, alone, load):
    load.hold(1)
    time.sleep(0.5)  # the sibling is busy before the run looks
    busy = _train(data_root, tmp_path / "run")
    load.stop()
    assert _figures(_rows(busy.dir)) == _figures(_rows(alone.dir))
    assert len(_thread_counts(alone.log)) == 1 and _thread_counts(busy.log) == _thread_counts(alone.log), busy.log
    assert "notice: threads " not in busy.log  # no change of count
    if _cores() >= 2 and Path("/proc/stat").is_file():  # one core: the count fits what is free; no counters: no look
        assert busy.log.count("notice: other work keeps") == 1, busy.log


@pytest.mark.slow
def test_omp_num_threads_1_gives_one_thread_and_the_losses_of_threads_1(data_root, tmp_path, one_thread):
    omp = _train(data_root, tmp_path / "run", OMP_NUM_THREADS="1")
    assert "threads 1 (OMP_NUM_THREADS" in omp.log, omp.log
    assert "threads 1 (set in config)" in one_thread.log
    assert _figures(_rows(omp.dir)) == _figures(_rows(one_thread.dir))


@pytest.mark.slow
def test_the_thread_count_shows_in_the_losses(alone, one_thread):
    """What makes the equalities in this file mean something: another count, other losses."""
    if _cores() < 2:
        pytest.skip("one core: the default count is 1, there is no other to tell apart")
    assert _thread_counts(alone.log) == [_cores()]  # the default: this process's cores
    assert _figures(_rows(alone.dir)) != _figures(_rows(one_thread.dir)), (
        "threads=1 and the default count gave the same losses: this model is too small here to show a change of count"
    )


@pytest.mark.slow
def test_kill_9_at_random_moments_under_a_changing_load_ends_bitwise_as_the_uninterrupted_run(data_root, tmp_path, alone, load):
    """Three trials: the default command killed twice (SIGKILL, at a random step and a random
    moment after it: in the step, its log, an eval or a checkpoint write), then run to its end,
    while 0-2 spinners come and go for the whole trial. Each ends as the run alone ended, and its
    last process's steps are the uninterrupted run's, loss for loss."""
    rng = random.Random(26)
    for trial in range(3):
        run_dir = tmp_path / f"trial-{trial}"
        load.counts.clear()
        load.vary(random.Random(rng.random()))
        resume_from = 0  # the step the next process starts from
        for kill in range(2):
            # The second kill comes after a step the second process runs, and after step 5's
            # checkpoint, so that the last process always resumes.
            step = rng.randint(2, 24) if kill == 0 else rng.randint(max(6, resume_from + 1), STEPS - 1)
            _kill_after(data_root, run_dir, step, rng.uniform(0, 0.05))
            newest = runs.latest(run_dir)
            resume_from = checkpoint.load(newest).step if newest else 0
        rows_before = len(_rows(run_dir))
        done = _train(data_root, run_dir)
        counts = list(load.counts)
        load.stop()
        assert len(set(counts)) >= 2 and max(counts) >= 1, counts  # the load did change during the trial
        rows = _rows(run_dir)[rows_before:]  # the last process's
        assert rows[0]["step"] == resume_from + 1 > 1, rows[0]  # it resumed
        _assert_rows_match(rows, alone.dir)
        _assert_same_end(run_dir, alone.dir)
        assert "Traceback" not in done.log


def _kill_after(data_root, run_dir: Path, step: int, delay: float) -> None:
    """Start the command, and kill -9 it `delay` seconds after it logged `step`."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        _command(data_root, run_dir),
        cwd=run_dir.parent,
        env=_env(data_root),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(f"step {step}/"):
                time.sleep(delay)
                break
        else:
            pytest.fail(f"the run ended before step {step}:\n" + "".join(seen[-30:]))
    finally:
        proc.kill()  # SIGKILL: no handler, no cleanup
        proc.wait()
        proc.stdout.close()


@pytest.mark.slow
def test_a_resume_adopts_its_checkpoints_thread_count_and_ends_bitwise_equal(resumed, one_thread):
    log = resumed.resumed.log
    if _cores() >= 2:  # on one core the default is the checkpoint's count already: nothing to say
        assert "the count the checkpoint was trained with" in log and "notice: threads 1," in log, log
    _assert_rows_match(_rows(resumed.resumed.dir)[resumed.rows_before :], one_thread.dir)
    _assert_same_end(resumed.resumed.dir, one_thread.dir)


@pytest.mark.slow
def test_a_resume_told_another_count_says_it_will_not_be_bitwise_equal(data_root, resumed):
    other = _train(data_root, resumed.copy, "threads=2")
    assert "threads 2 (set in config)" in other.log
    assert "where the checkpoint was trained with 1: the resumed steps will not be bitwise equal" in other.log, other.log


@pytest.mark.slow
def test_every_metrics_row_carries_its_time_and_elapsed_s_runs_on_over_a_resume(alone, resumed):
    _assert_times(_rows(alone.dir), alone, since=0.0)
    _assert_summary_times(alone.dir)

    rows = _rows(resumed.resumed.dir)
    before, after = rows[: resumed.rows_before], rows[resumed.rows_before :]
    _assert_times(before, resumed.stopped, since=0.0)
    ckpt_elapsed = resumed.ckpt.training.elapsed_s
    assert 0 < ckpt_elapsed <= resumed.stopped.ended - resumed.stopped.started
    _assert_times(after, resumed.resumed, since=ckpt_elapsed)  # from the checkpoint's time, not from 0
    _assert_summary_times(resumed.resumed.dir)


def _assert_times(rows: list[dict], ran: Ran, since: float) -> None:
    """Rows one process wrote: `time` inside its window; `elapsed_s` from `since` (the time the
    run had taken before it started) on, never going back, no more than the process's time added."""
    assert rows
    for row in rows:
        assert isinstance(row["time"], float) and ran.started <= row["time"] <= ran.ended, (row, ran.started, ran.ended)
        assert isinstance(row["elapsed_s"], float), row
    elapsed = [row["elapsed_s"] for row in rows]
    assert elapsed == sorted(elapsed), elapsed
    assert since <= elapsed[0] and elapsed[-1] <= since + (ran.ended - ran.started), (since, elapsed)


def _assert_summary_times(run_dir: Path) -> None:
    """summary.json's best_elapsed_s is the elapsed_s of the eval row that set its best val loss
    (the first to reach it); its elapsed_s is the whole run's, no less than any row's."""
    summary, rows = _summary(run_dir), _rows(run_dir)
    evals = [row for row in rows if row["kind"] == "eval"]
    best = min(row["val"] for row in evals)
    assert summary["best_val_loss"] == best
    assert summary["best_elapsed_s"] == next(row["elapsed_s"] for row in evals if row["val"] == best)
    assert summary["elapsed_s"] >= max(row["elapsed_s"] for row in rows)
