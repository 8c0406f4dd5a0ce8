"""gpt/runtime/runlock.py: one training process per run directory; a lock whose owner is gone is taken
over. Run: pytest tests/test_runlock.py"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt.errors import TinyGPTError
from gpt.runtime import runlock
from gpt.runtime.runlock import RunLock
from gpt.training.claim import resume_point
from helpers import REPO, assert_one_line_error, run_script


def _write_lock(run_dir, **owner):
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"host": socket.gethostname(), "time": time.time(), **owner}
    (run_dir / runlock.LOCK).write_text(json.dumps(record))


@pytest.fixture
def other_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_owner_keeps_the_run_and_a_gone_one_is_taken_over(tmp_path, other_process):
    _write_lock(tmp_path, pid=other_process.pid, started=runlock._started(other_process.pid))
    with pytest.raises(TinyGPTError, match=f"is being trained by process {other_process.pid}"):
        RunLock(tmp_path).acquire()
    with pytest.raises(TinyGPTError, match="delete .*\\.lock"):
        runlock.check(tmp_path)
    other_process.kill()
    other_process.wait()
    notices = []
    with RunLock(tmp_path, log=notices.append):
        assert json.loads((tmp_path / runlock.LOCK).read_text())["pid"] == os.getpid()
        runlock.check(tmp_path)  # our own lock is no obstacle
    assert "taking over" in notices[0] and not (tmp_path / runlock.LOCK).exists()


def test_a_reused_pid_does_not_hold_a_dead_owners_lock(tmp_path, other_process):
    """The pid runs again, but a process started later than the lock's owner."""
    _write_lock(tmp_path, pid=other_process.pid, started="1")
    with RunLock(tmp_path, log=lambda *_: None):
        pass


def test_an_owner_on_another_host_holds_until_its_heartbeat_is_old(tmp_path):
    _write_lock(tmp_path, host="elsewhere", pid=12345, time=time.time() - runlock.STALE_AFTER - 10)
    (tmp_path / "summary.json").write_text(json.dumps({"heartbeat": time.time()}))
    with pytest.raises(TinyGPTError, match="on elsewhere"):
        RunLock(tmp_path).acquire()
    (tmp_path / "summary.json").write_text(json.dumps({"heartbeat": time.time() - runlock.STALE_AFTER - 1}))
    with RunLock(tmp_path, log=lambda *_: None):
        pass


@pytest.mark.slow
def test_a_second_training_into_a_running_run_is_refused(tmp_path, data_root):
    """Started together into one hydra.run.dir: the second gets one line, touches nothing, and the
    first finishes with a metrics file of its own steps only."""
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    args = ["debug=tiny", *data_overrides, f"hydra.run.dir={run_dir}", "train.max_iters=300", "train.log_interval=1"]
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONPATH": str(runlock.Path(__file__).parent.parent)}
    first = subprocess.Popen(
        [sys.executable, "train.py", *args], cwd=runlock.Path(__file__).parent.parent, env=env, stdout=subprocess.PIPE, text=True
    )
    for line in first.stdout:
        if line.startswith("step 2/"):
            break
    second = run_script("train.py", [*args, "seed=7"], tmp_path, root)
    assert_one_line_error(second, f"is being trained by process {first.pid}")
    first.stdout.read()
    assert first.wait(timeout=300) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == list(range(1, 301)) and not (run_dir / runlock.LOCK).exists()  # one trajectory, once
    assert not (run_dir / ".hydra-1").exists()


def test_the_lock_is_reentrant_in_one_process_and_released_only_by_its_owner(tmp_path):
    """The command line takes the lock before Hydra runs and the trainer takes it again in the same
    process: the second acquire is a no-op, and only the first holder's release removes it; a lock
    taken over by another process meanwhile is not removed by the old holder."""
    outer = RunLock(tmp_path).acquire()
    inner = RunLock(tmp_path).acquire()
    inner.release()
    assert (tmp_path / runlock.LOCK).exists()
    outer.release()
    assert not (tmp_path / runlock.LOCK).exists()
    held = RunLock(tmp_path).acquire()
    _write_lock(tmp_path, pid=1, started="other")  # someone else's record now (as after a takeover)
    held.release()
    assert json.loads((tmp_path / runlock.LOCK).read_text())["pid"] == 1
    assert not list(tmp_path.glob(".lock.*"))  # the record written aside is gone


def test_a_lock_just_taken_on_another_host_holds_despite_an_old_summary(tmp_path):
    """A run that just started elsewhere has not beaten yet; the summary.json there is an earlier
    run's: the lock's own time keeps it held."""
    _write_lock(tmp_path, host="elsewhere", pid=12345)
    (tmp_path / "summary.json").write_text(json.dumps({"heartbeat": time.time() - runlock.STALE_AFTER - 100}))
    with pytest.raises(TinyGPTError, match="on elsewhere"):
        RunLock(tmp_path).acquire()


def test_a_reader_never_sees_a_half_written_lock(tmp_path, monkeypatch):
    """The lock file appears whole: while it is being written, another process reading it finds
    either no lock or a complete record (a record read as empty would be taken over)."""
    seen = []
    real_link = os.link

    def link_and_read(src, dst):
        seen.append(json.loads(open(src).read()))  # what exists just before the lock appears
        real_link(src, dst)
        seen.append(json.loads((tmp_path / runlock.LOCK).read_text()))

    monkeypatch.setattr(os, "link", link_and_read)
    with RunLock(tmp_path):
        pass
    assert seen[0]["pid"] == seen[1]["pid"] == os.getpid()


def test_the_command_line_holds_the_lock_before_hydra_writes(tmp_path, other_process, monkeypatch):
    """`tinygpt train hydra.run.dir=R` takes R's lock before its checks read R or Hydra moves or
    writes anything there, and holds it until the process ends; a start while another process
    holds it is refused with the earlier run's record in place, before anything reads the run."""
    from gpt.apps.train import claim_run_dir
    from gpt.training import claim

    monkeypatch.chdir(tmp_path)
    examined = []
    real = resume_point
    monkeypatch.setattr(claim, "resume_point", lambda *a: (examined.append(a), real(*a))[1])
    started = claim_run_dir([f"hydra.run.dir={tmp_path / 'a'}"])
    assert started.pinned == [f"hydra.run.dir='{tmp_path / 'a'}'"] and started.claim.point is not None
    assert json.loads((tmp_path / "a" / runlock.LOCK).read_text())["pid"] == os.getpid()
    RunLock(tmp_path / "a").acquire().release()  # the trainer, in this process, finds it its own
    assert (tmp_path / "a" / runlock.LOCK).exists() and len(examined) == 1
    (tmp_path / "b" / ".hydra").mkdir(parents=True)
    (tmp_path / "b" / "checkpoints").mkdir()
    (tmp_path / "b" / "checkpoints" / "ckpt-0000010.pt").write_bytes(b"x")
    _write_lock(tmp_path / "b", pid=other_process.pid, started=runlock._started(other_process.pid))
    with pytest.raises(TinyGPTError, match="is being trained by process"):
        claim_run_dir([f"hydra.run.dir={tmp_path / 'b'}"])
    assert (tmp_path / "b" / ".hydra").is_dir() and not (tmp_path / "b" / ".hydra-1").exists()
    assert len(examined) == 1  # refused before its checkpoints were read


def test_an_interpolated_run_dir_is_resolved_once_and_locked(tmp_path, monkeypatch):
    """hydra.run.dir='outputs/${now:...}' (or the default, or 'lr_${optim.lr}') is resolved here,
    locked, and pinned for Hydra as the folder it resolved to (a second resolution of ${now:}
    would name another); a refused start leaves no empty folder behind."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from gpt.apps.train import claim_run_dir, override_value

    monkeypatch.chdir(tmp_path)
    pinned = claim_run_dir(["hydra.run.dir=outputs/${now:%H-%M-%S}"]).pinned
    folder = OverridesParser.create().parse_override(pinned[0]).value()
    assert pinned[0].startswith("hydra.run.dir=") and (tmp_path / "outputs").is_dir()
    assert json.loads((Path(folder) / runlock.LOCK).read_text())["pid"] == os.getpid()
    default = OverridesParser.create().parse_override(claim_run_dir([]).pinned[0]).value()
    assert Path(default).parent == tmp_path / "outputs" / "runs"
    with pytest.raises(TinyGPTError, match="optim.lr"):
        claim_run_dir(["hydra.run.dir=outputs/lr_${optim.lr}", "optim.lr=fast"])
    assert not (tmp_path / "outputs" / "lr_fast").exists()
    for text in ("/tmp/my runs/a,b=c", "it's", "back\\slash", "end\\", "q\\'x", "$HOME/x"):
        assert OverridesParser.create().parse_override(f"hydra.run.dir={override_value(text)}").value() == text


def test_a_quoted_run_dir_is_the_folder_hydra_reads(tmp_path, monkeypatch):
    """hydra.run.dir='<a path with a space>' (the quoting the one-line errors advise) names the
    folder without its quotes, and a quoted ~ is the home folder: the lock, the checks and
    Hydra's writes all go there (the override's raw text made a folder named with its quotes)."""
    from gpt.apps.train import claim_run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for given, folder in ((f"'{tmp_path / 'my runs'}'", tmp_path / "my runs"), ("'~/runs/a'", tmp_path / "home" / "runs" / "a")):
        pinned = claim_run_dir([f"hydra.run.dir={given}"]).pinned
        assert pinned == [f"hydra.run.dir='{folder}'"] and (folder / runlock.LOCK).is_file()
    assert not [p for p in tmp_path.iterdir() if "'" in p.name or p.name == "~"]


def test_a_dead_owners_lock_is_taken_over_by_one_of_many_starts(tmp_path):
    """Six processes find the same dead owner's lock at once: exactly one takes the run. (Reading
    the lock is slowed down so that all of them see it dead before any replaces it; without the
    guard around the takeover each would remove another's new lock, and several would train.)"""
    import multiprocessing as mp

    _write_lock(tmp_path, pid=2**22 + 7, started="1")  # no such process
    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_race_for_lock, args=(tmp_path, start, results)) for _ in range(6)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert sorted(outcomes) == ["refused"] * 5 + ["took it"], outcomes


def _race_for_lock(run_dir, start, results) -> None:
    real = runlock.owner_of

    def slow_owner_of(folder):
        owner = real(folder)
        time.sleep(0.3)
        return owner

    runlock.owner_of = slow_owner_of
    start.wait()
    try:
        RunLock(run_dir, log=lambda *_: None).acquire()
        results.put("took it")
        time.sleep(3)  # alive and holding while the others look
    except TinyGPTError:
        results.put("refused")


@pytest.mark.slow
def test_two_starts_at_once_into_one_directory(tmp_path, data_root):
    """Two `train.py hydra.run.dir=R` started in the same instant: exactly one trains; the other
    says which process holds R, exits 2, and nothing of the first's run is touched (its record,
    its log, its metrics are its own)."""
    root, data_overrides = data_root
    run_dir = tmp_path / "run"
    env = {**os.environ, "TINYGPT_DATA_DIR": str(root), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    args = ["debug=tiny", *data_overrides, f"hydra.run.dir={run_dir}", "train.max_iters=20", "train.log_interval=1", "threads=1"]
    procs = [
        subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *args, f"seed={seed}"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    ended = [(proc, *proc.communicate(timeout=300)) for proc in procs]
    codes = sorted(proc.returncode for proc, _, _ in ended)
    assert codes == [0, 2], [(p.returncode, err[-1500:]) for p, _, err in ended]
    (winner, _, _), (loser, _, loser_err) = sorted(ended, key=lambda e: e[0].returncode)
    assert_one_line_error(subprocess.CompletedProcess([], 2, "", loser_err), f"is being trained by process {winner.pid}")
    seed = 1 if winner is procs[0] else 2
    assert f"seed={seed}" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert not (run_dir / ".hydra-1").exists() and "error" not in (run_dir / "train.log").read_text()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if row["kind"] == "train"]
    assert steps == list(range(1, 21)) and json.loads((run_dir / "summary.json").read_text())["pid"] == winner.pid


def test_a_filesystem_without_hard_links_still_gets_a_lock(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with RunLock(tmp_path):
        assert json.loads((tmp_path / runlock.LOCK).read_text())["pid"] == os.getpid()
        with pytest.raises(TinyGPTError, match="is being trained"):
            _write_lock(tmp_path / "other", pid=1, started=None)
            RunLock(tmp_path / "other").acquire()  # pid 1 runs: held
    assert not (tmp_path / runlock.LOCK).exists()


def test_a_live_owner_in_another_pid_namespace_is_not_taken_for_dead(tmp_path):
    """Two containers on one host name (docker --net=host, Kubernetes hostNetwork): the other's
    pid means nothing here, so only its heartbeat can say it is gone."""
    _write_lock(tmp_path, pid=2**22 + 7, started="1", ns="pid:[4026531836-elsewhere]")  # no such pid here
    (tmp_path / "summary.json").write_text(json.dumps({"heartbeat": time.time()}))
    with pytest.raises(TinyGPTError, match="is being trained by process"):
        RunLock(tmp_path).acquire()
    _write_lock(tmp_path, pid=2**22 + 7, started="1")  # no namespace recorded (an older lock): probed here
    with RunLock(tmp_path, log=lambda *_: None):
        pass
