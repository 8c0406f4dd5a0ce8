"""CPU threads: as many as the cores this process may use and other work leaves free.

Oversubscribed cores are ruinous, not just slow: on 2 cores, two trainings of 2 threads each ran
at 3.3 s per step each where one alone takes 42 ms, and one training beside a busy single-thread
process took 127 ms per step with 2 threads and 74 ms with 1 (see the README). So a CPU run
starts with the cores of its affinity mask, shared with the other processes of its node
(torchrun), less those other work keeps busy; and every logged step it looks again, taking
threads back or giving them up as other work comes and goes. `threads=N` fixes the count.
"""

from __future__ import annotations

import os
import resource
import time

import torch


def _cpu_counters() -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole machine so far, in clock ticks (Linux only)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ThreadGovernor:
    def __init__(self, device: torch.device, requested: int | None = None, local_processes: int = 1):
        self.active = device.type == "cpu" and not requested and _cpu_counters() is not None
        if requested:
            torch.set_num_threads(requested)
            self.reason = f"threads {requested} (set in config)"
            return
        if device.type != "cpu":
            self.reason = f"threads {torch.get_num_threads()} (torch's default: the GPU computes)"
            return
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.share = max(1, self.cores // max(1, local_processes))
        self._last = self._sample()
        time.sleep(0.1)  # a first look at what else runs (this process is idle meanwhile)
        busy = self._busy_elsewhere()
        threads = self._fit(busy)
        torch.set_num_threads(threads)
        self._wanted = threads
        why = [f"{self.cores} cores"] + [f"shared by {local_processes} processes"] * (local_processes > 1)
        why += [f"{busy} busy with other work"] * bool(busy)
        self.reason = f"threads {threads} ({', '.join(why)}; threads=N to choose)"

    def _sample(self) -> tuple:
        return _cpu_counters(), _own_cpu_seconds(), time.monotonic()

    def _busy_elsewhere(self) -> int:
        """Cores other processes kept busy since the last look (all busy cores less this one's)."""
        now = self._sample()
        (busy0, total0), own0, t0 = self._last
        (busy1, total1), own1, t1 = now
        self._last = now
        if total1 <= total0 or t1 <= t0:
            return 0
        all_busy = (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)
        return max(0, round(all_busy - (own1 - own0) / (t1 - t0)))

    def _fit(self, busy: int) -> int:
        return max(1, min(self.share, self.cores - busy))

    def observe(self) -> str | None:
        """Look again (cheap: two counters); a notice when the thread count changed. A change needs
        the same answer twice in a row, so a passing spike does not make it flap."""
        if not self.active:
            return None
        wanted = self._fit(self._busy_elsewhere())
        current = torch.get_num_threads()
        if wanted == current or wanted != self._wanted:
            self._wanted = wanted
            return None
        torch.set_num_threads(wanted)
        change = "other work took cores" if wanted < current else "cores came free"
        return f"notice: threads {current} -> {wanted} ({change}; threads=N to fix the count)"
