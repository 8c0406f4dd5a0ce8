"""gpt/threads.py: a CPU run's thread count follows the cores other work leaves free, at start
and as it goes on; a count given in the settings is kept. Run: pytest tests/test_threads.py"""

from __future__ import annotations

import pytest
import torch

from gpt import threads


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose CPU counters and clock the test moves: other work is the busy time it
    adds beyond this process's own (kept at 0)."""
    state = {"busy": 0.0, "total": 0.0, "clock": 0.0, "others": 0}
    monkeypatch.setattr(threads, "_cpu_counters", lambda cpus: (state["busy"], state["total"]))
    monkeypatch.setattr(threads, "_own_cpu_seconds", lambda: 0.0)
    monkeypatch.setattr(threads, "_affinity", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(threads.time, "monotonic", lambda: state["clock"])
    monkeypatch.setattr(threads.time, "sleep", lambda s: advance(state["others"], s))
    saved = torch.get_num_threads()

    def advance(busy_cores: float, seconds: float = 1.0) -> None:
        state["busy"] += 100 * seconds * busy_cores
        state["total"] += 100 * seconds * 4
        state["clock"] += seconds

    state["advance"] = advance
    yield state
    torch.set_num_threads(saved)


def test_the_free_cores_at_start(machine):
    assert threads.ThreadGovernor(torch.device("cpu")).reason.startswith("threads 4 (4 cores;")
    machine["others"] = 3
    governor = threads.ThreadGovernor(torch.device("cpu"))
    assert torch.get_num_threads() == 1 and "3 busy with other work" in governor.reason
    machine["others"] = 0.6  # background noise is not a busy core
    assert threads.ThreadGovernor(torch.device("cpu")).reason.startswith("threads 4 (4 cores;")
    machine["others"] = 0
    threads.ThreadGovernor(torch.device("cpu"), local_processes=2)  # torchrun: 2 processes on this node
    assert torch.get_num_threads() == 2


def test_threads_follow_other_work_as_it_comes_and_goes(machine):
    governor = threads.ThreadGovernor(torch.device("cpu"))
    assert torch.get_num_threads() == 4
    machine["advance"](busy_cores=2)  # another job starts
    assert governor.observe() is None and torch.get_num_threads() == 4  # once could be a spike
    machine["advance"](busy_cores=2)
    assert "threads 4 -> 2" in governor.observe() and torch.get_num_threads() == 2
    for _ in range(2):
        machine["advance"](busy_cores=0)  # it ended
        note = governor.observe()
    assert "threads 2 -> 4" in note and torch.get_num_threads() == 4


def test_fast_steps_do_not_make_it_flap(machine):
    """Steps of a millisecond: a look waits until a second has gone by, so a few ticks of noise
    between two steps never decide anything."""
    governor = threads.ThreadGovernor(torch.device("cpu"))
    notes = []
    for step in range(3000):
        machine["advance"](busy_cores=1 if step % 6 < 2 else 0, seconds=0.001)  # a third of a core, in bursts
        notes.append(governor.observe())
    assert not any(notes) and torch.get_num_threads() == 4


def test_a_count_in_the_settings_is_kept(machine):
    governor = threads.ThreadGovernor(torch.device("cpu"), requested=3)
    assert torch.get_num_threads() == 3 and governor.reason == "threads 3 (set in config)"
    machine["advance"](busy_cores=4)
    machine["advance"](busy_cores=4)
    assert governor.observe() is None and torch.get_num_threads() == 3


def test_without_the_kernels_counters_the_share_is_kept(monkeypatch):
    """No /proc/stat (macOS, Windows, a locked-down container): the cores, no crash, no looks."""
    monkeypatch.setattr(threads, "_PROC_STAT", "/nonexistent/stat")
    monkeypatch.setattr(threads, "_affinity", lambda: None)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 3)
    saved = torch.get_num_threads()
    try:
        governor = threads.ThreadGovernor(torch.device("cpu"))
        assert torch.get_num_threads() == 3 and governor.reason.startswith("threads 3 (3 cores;")
        assert governor.observe() is None
    finally:
        torch.set_num_threads(saved)


def test_counters_cover_our_cores_only_and_count_guest_time_once(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 0 300 0 0 0 0 500 0\n"
        # user nice system idle iowait irq softirq steal guest guest_nice
        "cpu0 100 0 0 100 0 0 0 0 50 0\n"
        "cpu1 400 0 0 0 0 0 0 0 400 0\n"
        "cpu2 400 0 0 200 0 0 0 0 50 0\n"
        "intr 12345 0 0\n"
    )
    monkeypatch.setattr(threads, "_PROC_STAT", str(stat))
    assert threads._cpu_counters(None) == (900.0, 1200.0)
    assert threads._cpu_counters({0, 2}) == (500.0, 800.0)  # a busy cpu1 outside our mask is not ours to count


def test_torch_is_only_told_a_count_that_changes(machine, monkeypatch):
    """torch.set_num_threads, once called, makes every parallel region wake its threads through
    the kernel (26x the futex calls of a forward pass): never call it with the count torch has."""
    calls = []
    current = {"n": 4}
    monkeypatch.setattr(torch, "get_num_threads", lambda: current["n"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), current.update(n=n)))
    governor = threads.ThreadGovernor(torch.device("cpu"))  # 4 free cores, torch already at 4
    for _ in range(3):
        machine["advance"](busy_cores=0)
        governor.observe()
    threads.ThreadGovernor(torch.device("cpu"), requested=4)
    assert calls == []
    machine["others"] = 2
    threads.ThreadGovernor(torch.device("cpu"))
    assert calls == [2]
