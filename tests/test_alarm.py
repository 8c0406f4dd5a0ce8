"""gpt/runtime/alarm.py in one process, on a real TCPStore: what a process that was left alone
hears (once), what it tells the store's host as it exits, and which errors count as a peer that
left. The whole runs, with two processes started as SLURM and torchrun start them, are in
tests/test_distributed.py.
Run: pytest tests/test_alarm.py"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from gpt.apps import common
from gpt.runtime import alarm
from helpers import free_port


@pytest.fixture
def listening(monkeypatch):
    """This process as rank 1 of 2, listening on a store it hosts itself; the listener thread is
    sent away (`leave`) before any failure is written, so that it cannot end the test process."""
    store = dist.TCPStore("127.0.0.1", free_port(), 2, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(alarm, "EXIT_S", 0.0)
    alarm.listen(store, rank=1, world_size=2, hosting=False)
    yield store
    alarm.stop()


def test_news_waits_once_and_skips_this_process_s_own_reason(listening):
    alarm.leave()  # (the listener returns: a failure written below must not end this process)
    listening.set(alarm.FAILED, "process 1 of 2 failed: its own")
    started = time.monotonic()
    assert alarm.news(wait_s=0.5) is None  # its own reason is no news
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    assert alarm.news(wait_s=5.0) is None  # asked before: no second wait
    assert time.monotonic() - started < 0.2


def test_news_brings_another_process_s_reason(listening):
    alarm.leave()
    listening.set(alarm.FAILED, "process 0 of 2 failed: data refused")
    assert alarm.news(wait_s=2.0) == "process 0 of 2 failed: data refused"


def test_a_process_waiting_for_news_is_not_ended_by_its_listener(monkeypatch):
    """A process whose collective failed (a peer gone) asks for news and waits, longer than the
    listener's grace: the listener, which heard the same failure, must not end it (it would exit
    1 with nothing recorded, as a clean-clone CI run once saw under load)."""
    store = dist.TCPStore("127.0.0.1", free_port(), 2, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(alarm, "POLL_S", 0.05)
    monkeypatch.setattr(alarm, "GRACE_S", 0.1)
    monkeypatch.setattr(alarm, "EXIT_S", 1.0)  # ten times the grace
    ended = []
    monkeypatch.setattr(alarm.Listener, "_end", lambda self, reason: ended.append(reason))
    alarm.listen(store, rank=1, world_size=2, hosting=False)
    try:
        store.set(alarm.FAILED, "process 0 of 2 failed: data refused")
        assert alarm.news(wait_s=2.0) == "process 0 of 2 failed: data refused"
        assert ended == []
        assert store.check(["heard/1"])  # the host need not wait for this one
    finally:
        alarm.stop()


def test_a_process_that_exits_tells_the_host_it_need_not_wait_for_it(listening):
    assert not listening.check(["heard/1"])
    alarm.stop()
    assert listening.check(["heard/1"])


def _raised_in(filename: str, message: str) -> RuntimeError:
    try:
        exec(compile(f"raise RuntimeError({message!r})", filename, "exec"))
    except RuntimeError as e:
        return e
    raise AssertionError("not raised")


def test_a_collective_cut_short_by_a_gone_peer_counts_as_left_alone(monkeypatch):
    """gloo's error for a gone peer, from inside torch (a collective, or DDP's all-reduce in
    autograd) or from compiled code tinygpt called (Muon's Work.wait()), is the other process's
    doing; any other error is this process's own, which keeps its traceback. (The frames are not
    examined: a hook of one's own raising gloo's exact words would lose its traceback, a price
    paid for not reading bytecode to tell.)"""
    from pathlib import Path

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    inside = str(Path(torch.__file__).parent / "autograd" / "graph.py")
    gone = "[pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
    assert common._left_alone(_raised_in(inside, gone))
    assert not common._left_alone(_raised_in(inside, "CUDA error: an illegal memory access was encountered"))
    waited = f"import torch\ntorch._assert_async(torch.tensor(False), {gone!r})"
    try:
        exec(compile(waited, str(Path(common.__file__).parent.parent / "training" / "optim.py"), "exec"))
    except RuntimeError as e:
        assert common._left_alone(e)
    else:
        raise AssertionError("not raised")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not common._left_alone(_raised_in(inside, gone))
