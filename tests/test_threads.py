"""gpt/runtime/threads.py: a run's CPU thread count comes from a rule that never looks at the load
(threads=N, else OMP_NUM_THREADS, else a resumed checkpoint's count, else the cores), and stays;
other work at the start is one notice; threads=auto follows the load. On a pretend 4-core
machine whose counters and clock the tests move. Run: pytest tests/test_threads.py"""

from __future__ import annotations

import pytest
import torch

from gpt.errors import TinyGPTError
from gpt.runtime import threads

CPU = torch.device("cpu")


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose CPU counters and clock the test moves: other work is the busy time it
    adds beyond this process's own (kept at 0). OMP_NUM_THREADS unset unless a test sets it."""
    state = {"busy": 0.0, "total": 0.0, "clock": 0.0, "others": 0}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
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


def test_the_count_is_the_cores_whatever_else_runs(machine):
    assert threads.Threads(CPU).reason == "threads 4 (4 cores; threads=N to choose)"
    machine["others"] = 3  # three cores busy with other work at the start: the count is the same
    chosen = threads.Threads(CPU)
    assert torch.get_num_threads() == 4 and chosen.count == 4
    threads.Threads(CPU, local_processes=2)  # torchrun: 2 processes on this node share its cores
    assert torch.get_num_threads() == 2


def test_it_never_changes_during_the_run(machine):
    chosen = threads.Threads(CPU)
    for busy in (3, 3, 0, 0, 4, 4):
        machine["advance"](busy_cores=busy)
        assert chosen.observe() is None and torch.get_num_threads() == 4


def test_omp_num_threads_is_honoured_and_the_setting_wins(machine, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.Threads(CPU).reason == "threads 1 (OMP_NUM_THREADS; threads=N to choose)"
    assert torch.get_num_threads() == 1
    assert threads.Threads(CPU, requested=3).reason == "threads 3 (set in config)"
    monkeypatch.setenv("OMP_NUM_THREADS", "2,1")  # nested levels: the first is ours
    assert threads.Threads(CPU).count == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    with pytest.raises(TinyGPTError, match="OMP_NUM_THREADS='many' is not a positive integer"):
        threads.Threads(CPU)
    with pytest.raises(TinyGPTError, match="threads must be a positive integer, null .* or auto"):
        threads.Threads(CPU, requested=0)


def test_other_work_at_the_start_is_one_notice_and_the_count_stays(machine):
    """Looked at when set-up ends, over at least a quarter of a second since the count was chosen
    (a shorter set-up waits out the rest); said once."""
    chosen = threads.Threads(CPU)
    assert chosen.load_notice() is None and chosen.load_checked  # nothing else runs
    machine["others"] = 2
    chosen = threads.Threads(CPU)
    machine["advance"](busy_cores=2, seconds=0.1)
    note = chosen.load_notice()  # waits out the rest of the quarter second (the pretend clock)
    assert machine["clock"] >= 0.25
    assert "other work keeps 2 of 4 cores busy" in note and "threads=2" in note and "threads=auto" in note
    assert torch.get_num_threads() == 4 and chosen.count == 4
    assert chosen.load_notice() is None  # once
    machine["others"] = 3
    assert threads.Threads(CPU, local_processes=4).load_notice() is None  # 1 thread fits the free core


def test_a_resume_takes_its_checkpoints_count_unless_told_otherwise(machine, monkeypatch):
    chosen = threads.Threads(CPU)
    note = chosen.adopt(1)
    assert chosen.count == 1 and torch.get_num_threads() == 1
    assert "threads 1, the count the checkpoint was trained with (here the default would be 4)" in note
    assert threads.Threads(CPU).adopt(4) is None and threads.Threads(CPU).adopt(None) is None  # same, or not recorded
    told = threads.Threads(CPU, requested=3)
    assert "threads 3 (set in config) where the checkpoint was trained with 1" in told.adopt(1) and told.count == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    told = threads.Threads(CPU)
    assert "(OMP_NUM_THREADS)" in told.adopt(1) and torch.get_num_threads() == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "this machine has 4 cores" in threads.Threads(CPU).adopt(8)  # more than this machine has: kept, and said
    auto = threads.Threads(CPU, requested="auto")
    assert "(threads=auto) where the checkpoint was trained with 1" in auto.adopt(1) and auto.adaptive


def test_auto_takes_the_free_cores_and_follows_other_work(machine):
    auto = threads.Threads(CPU, requested="auto")
    assert torch.get_num_threads() == 4 and auto.reason.startswith("threads 4 (threads=auto: 4 cores")
    machine["advance"](busy_cores=2)  # another job starts
    assert auto.observe() is None and torch.get_num_threads() == 4  # once could be a spike
    machine["advance"](busy_cores=2)
    assert "threads 4 -> 2" in auto.observe() and torch.get_num_threads() == 2
    for _ in range(2):
        machine["advance"](busy_cores=0)  # it ended
        note = auto.observe()
    assert "threads 2 -> 4" in note and torch.get_num_threads() == 4
    machine["others"] = 3
    auto = threads.Threads(CPU, requested="AUTO")
    assert torch.get_num_threads() == 1 and "3 busy with other work" in auto.reason
    machine["others"] = 0.6  # background noise is not a busy core
    assert threads.Threads(CPU, requested="auto").count == 4


def test_auto_does_not_flap_on_fast_steps(machine):
    """Steps of a millisecond: a look waits until a second has gone by, so a few ticks of noise
    between two steps never decide anything."""
    auto = threads.Threads(CPU, requested="auto")
    notes = []
    for step in range(3000):
        machine["advance"](busy_cores=1 if step % 6 < 2 else 0, seconds=0.001)  # a third of a core, in bursts
        notes.append(auto.observe())
    assert not any(notes) and torch.get_num_threads() == 4


def test_without_the_kernels_counters_the_cores_are_kept(monkeypatch):
    """No /proc/stat (macOS, Windows, a locked-down container): the cores, no crash, no looks;
    threads=auto has nothing to follow and keeps them too."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "_PROC_STAT", "/nonexistent/stat")
    monkeypatch.setattr(threads, "_affinity", lambda: None)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 3)
    saved = torch.get_num_threads()
    try:
        for requested in (None, "auto"):
            chosen = threads.Threads(CPU, requested=requested)
            assert torch.get_num_threads() == 3 and chosen.reason.startswith("threads 3 (3 cores;")
            assert chosen.observe() is None and chosen.load_notice() is None
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
    auto = threads.Threads(CPU, requested="auto")  # 4 free cores, torch already at 4
    for _ in range(3):
        machine["advance"](busy_cores=0)
        auto.observe()
    threads.Threads(CPU, requested=4)
    threads.Threads(CPU)
    assert calls == []
    threads.Threads(CPU, requested=2)
    assert calls == [2]
