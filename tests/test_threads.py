"""gpt/threads.py: a CPU run's thread count follows the cores other work leaves free, at start
and as it goes on; a count given in the settings is kept. Run: pytest tests/test_threads.py"""

from __future__ import annotations

import pytest
import torch

from gpt import threads


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose CPU counters the test writes: other work is the busy time it adds
    beyond this process's own (kept at 0)."""
    state = {"busy": 0.0, "total": 0.0}
    monkeypatch.setattr(threads, "_cpu_counters", lambda: (state["busy"], state["total"]))
    monkeypatch.setattr(threads, "_own_cpu_seconds", lambda: 0.0)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads.time, "sleep", lambda s: advance(busy_cores=state.get("others", 0)))
    saved = torch.get_num_threads()

    def advance(busy_cores: float) -> None:
        state["busy"] += 100 * busy_cores
        state["total"] += 100 * 4

    state["advance"] = advance
    yield state
    torch.set_num_threads(saved)


def test_the_free_cores_at_start(machine):
    assert threads.ThreadGovernor(torch.device("cpu")).reason.startswith("threads 4 (4 cores;")
    machine["others"] = 3
    governor = threads.ThreadGovernor(torch.device("cpu"))
    assert torch.get_num_threads() == 1 and "3 busy with other work" in governor.reason
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


def test_a_count_in_the_settings_is_kept(machine):
    governor = threads.ThreadGovernor(torch.device("cpu"), requested=3)
    assert torch.get_num_threads() == 3 and governor.reason == "threads 3 (set in config)"
    machine["advance"](busy_cores=4)
    machine["advance"](busy_cores=4)
    assert governor.observe() is None and torch.get_num_threads() == 3
