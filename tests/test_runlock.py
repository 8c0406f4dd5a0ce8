"""gpt/runlock.py: one training process per run directory; a lock whose owner is gone is taken
over. Run: pytest tests/test_runlock.py"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from gpt import runlock
from gpt.errors import TinyGPTError
from gpt.runlock import RunLock
from helpers import assert_one_line_error, run_script


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
    _write_lock(tmp_path, host="elsewhere", pid=12345)
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
