"""CPU threads: as many as the cores this process may use and other work leaves free.

Oversubscribed cores are ruinous, not just slow: on 2 cores, two trainings of 2 threads each ran
at 3.3 s per step each where one alone takes 42 ms, and one training beside a busy single-thread
process took 127 ms per step with 2 threads and 74 ms with 1 (see the README). So a CPU run
starts with the cores of its affinity mask, shared with the other processes of its node
(torchrun), less those other work keeps busy; and as it goes on it looks again (at most once a
second), taking threads back or giving them up as other work comes and goes. `threads=N` fixes
the count. Where the kernel's counters cannot be read (not Linux), the count stays at the share.

torch.set_num_threads is only called to change the count: once called, even with the count
torch already had, every parallel region of this process wakes its threads through the kernel
(3,200 futex calls per forward pass of the quickstart model instead of 120, measured with
strace; ~1 ms of system time per step here, far more on a busy or virtualised machine).
"""

from __future__ import annotations

import os
import time

import torch

_START_WINDOW_S = 0.25  # the first look: ~25 clock ticks per core, enough to tell a busy core from noise
_MIN_WINDOW_S = 1.0  # later looks gather at least this long, however short the steps
_BUSY_FROM = 0.75  # a core counts as taken when other work keeps it this busy
_PROC_STAT = "/proc/stat"


def _affinity() -> set[int] | None:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def _cpu_counters(cpus: set[int] | None) -> tuple[float, float] | None:
    """(busy, total) clock ticks so far, summed over the given CPUs (all of them when None);
    Linux's /proc/stat. None where it cannot be read."""
    busy = total = 0.0
    try:
        with open(_PROC_STAT) as f:
            for line in f:
                name, *values = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if not name[3:].isdigit():
                    break
                if cpus is not None and int(name[3:]) not in cpus:
                    continue
                # user nice system idle iowait irq softirq steal; guest time is already inside user/nice
                ticks = [float(x) for x in values[:8]]
                all_ticks = sum(ticks)
                total += all_ticks
                busy += all_ticks - ticks[3] - (ticks[4] if len(ticks) > 4 else 0.0)
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total) if total > 0 else None


def _set_threads(n: int) -> None:
    if n != torch.get_num_threads():  # see the module's docstring: setting it at all has a cost
        torch.set_num_threads(n)


def _own_cpu_seconds() -> float:
    return time.process_time()  # user + system time of every thread of this process, on any OS


class ThreadGovernor:
    def __init__(self, device: torch.device, requested: int | None = None, local_processes: int = 1):
        self.active = False
        if requested:
            _set_threads(requested)
            self.reason = f"threads {requested} (set in config)"
            return
        if device.type != "cpu":
            self.reason = f"threads {torch.get_num_threads()} (torch's default: the GPU computes)"
            return
        self.cpus = _affinity()
        self.cores = len(self.cpus) if self.cpus else (os.cpu_count() or 1)
        self.share = max(1, self.cores // max(1, local_processes))
        why = [f"{self.cores} cores"] + [f"shared by {local_processes} processes"] * (local_processes > 1)
        self._last = self._sample()
        if self._last[0] is None:  # no counters to read: the share, kept
            _set_threads(self.share)
            self.reason = f"threads {self.share} ({', '.join(why)}; threads=N to choose)"
            return
        self.active = True
        time.sleep(_START_WINDOW_S)  # a first look at what else runs (this process is idle meanwhile)
        busy = self._busy_elsewhere()
        threads = self._fit(busy)
        _set_threads(threads)
        self._wanted = threads
        why += [f"{busy} busy with other work"] * bool(busy)
        self.reason = f"threads {threads} ({', '.join(why)}; threads=N to choose)"

    def _sample(self) -> tuple:
        return _cpu_counters(self.cpus), _own_cpu_seconds(), time.monotonic()

    def _busy_elsewhere(self, now: tuple | None = None) -> int:
        """Cores of ours that other processes kept busy since the last look: the busy share of our
        cores less what this process used itself."""
        now = now or self._sample()
        last, self._last = self._last, now
        if now[0] is None or last[0] is None:
            return 0
        (busy0, total0), own0, t0 = last
        (busy1, total1), own1, t1 = now
        if total1 <= total0 or t1 <= t0:
            return 0
        busy_cores = (busy1 - busy0) / (total1 - total0) * self.cores
        others = busy_cores - (own1 - own0) / (t1 - t0)
        return max(0, int(others + (1 - _BUSY_FROM)))

    def _fit(self, busy: int) -> int:
        return max(1, min(self.share, self.cores - busy))

    def observe(self) -> str | None:
        """Look again when a second has gone by since the last look (cheap: one file read); a
        notice when the thread count changed. A change needs the same answer twice in a row, so a
        passing spike does not make it flap."""
        if not self.active:
            return None
        now = self._sample()
        if now[2] - self._last[2] < _MIN_WINDOW_S:
            return None
        wanted = self._fit(self._busy_elsewhere(now))
        current = torch.get_num_threads()
        if wanted == current or wanted != self._wanted:
            self._wanted = wanted
            return None
        _set_threads(wanted)
        change = "other work took cores" if wanted < current else "cores came free"
        return f"notice: threads {current} -> {wanted} ({change}; threads=N to fix the count)"
