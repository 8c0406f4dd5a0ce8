"""CPU threads: one count per run, chosen by a rule that never looks at the machine's load.

A CPU's float results depend on the intra-op thread count (a sum split over two threads is added
in another order than over one: the quickstart's val loss after 400 steps was 2.207350969 with 1
thread and 2.207350492 with 2), so a count that followed the load made the same command give
different numbers, and broke bitwise resume whenever the load changed. The count comes from, in
order:

  1. `threads=N` (the setting)
  2. `OMP_NUM_THREADS` (the convention every OpenMP program follows; torchrun sets it)
  3. a resumed run: the count its checkpoint recorded (`Threads.adopt`), so the resumed steps are
     bitwise those of the uninterrupted run, wherever it resumes
  4. the cores of this process's affinity mask, shared among the node's local processes

and stays for the whole run. When other work already keeps cores busy at the start, one notice
says so and how to choose (`load_notice`); the count does not change. Oversubscribed cores are
ruinous rather than slow (on 2 cores, two trainings of 2 threads each ran at 3.3 s per step where
one alone takes 42 ms), so the notice matters on a shared machine.

`threads=auto` (on a CPU, over OMP_NUM_THREADS too) opts in to the adaptive governor instead:
the free cores at the start, looked at again as the run goes (at most once a second), giving
threads up when other work comes and taking them back when it leaves. It trades bitwise
reproducibility for throughput on a shared machine.

torch.set_num_threads is only called to change the count: once called, even with the count
torch already had, every parallel region of this process wakes its threads through the kernel
(3,200 futex calls per forward pass of the quickstart model instead of 120, measured with
strace; ~1 ms of system time per step here, far more on a busy or virtualised machine).
"""

from __future__ import annotations

import os
import time

import torch

from gpt.config import check_threads
from gpt.errors import TinyGPTError

AUTO = "auto"
_START_WINDOW_S = 0.25  # a first look at the load: ~25 clock ticks per core, enough to tell a busy core from noise
_MIN_WINDOW_S = 1.0  # the governor's later looks gather at least this long, however short the steps
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
    """User + system time of every thread of this process, and of its children that have ended
    (the worker processes that tokenized the data are this run's work, not other work)."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def omp_num_threads() -> int | None:
    """OMP_NUM_THREADS as a count (its first level when it lists several), None when unset."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not raw:
        return None
    first = raw.split(",", 1)[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise TinyGPTError(f"OMP_NUM_THREADS={raw!r} is not a positive integer; set it to a thread count, or unset it")
    return int(first)


class Load:
    """How busy this process's cores are with other work, from the kernel's counters between two
    looks (this process's own CPU time taken out)."""

    def __init__(self, cpus: set[int] | None, cores: int):
        self.cpus, self.cores = cpus, cores
        self.last = self._sample()

    @property
    def readable(self) -> bool:
        return self.last[0] is not None

    def _sample(self) -> tuple:
        return _cpu_counters(self.cpus), _own_cpu_seconds(), time.monotonic()

    def seconds_since_last(self) -> float:
        return time.monotonic() - self.last[2]

    def busy_elsewhere(self) -> int:
        """Cores that other processes kept busy since the last look: the busy share of our cores
        less what this process used itself."""
        now = self._sample()
        last, self.last = self.last, now
        if now[0] is None or last[0] is None:
            return 0
        (busy0, total0), own0, t0 = last
        (busy1, total1), own1, t1 = now
        if total1 <= total0 or t1 <= t0:
            return 0
        busy_cores = (busy1 - busy0) / (total1 - total0) * self.cores
        others = busy_cores - (own1 - own0) / (t1 - t0)
        return max(0, int(others + (1 - _BUSY_FROM)))


class Threads:
    """This process's CPU thread count: chosen once (see the module's docstring), or, with
    `requested="auto"`, kept to the cores other work leaves free. `reason` says where it came
    from; `observe()` is the governor's look (a no-op unless adaptive)."""

    def __init__(self, device: torch.device, requested: int | str | None = None, local_processes: int = 1):
        requested = check_threads(requested)  # also for callers that bypass the settings (the harness)
        self.requested, self.adaptive, self.device, self.load_checked = requested, False, device, False
        cpus = _affinity()
        self.cores = len(cpus) if cpus else (os.cpu_count() or 1)
        self.share = max(1, self.cores // max(1, local_processes))
        shared = f", shared by {local_processes} processes" if local_processes > 1 else ""
        self.load = Load(cpus, self.cores)
        self.omp = omp_num_threads()
        if isinstance(requested, int):
            self._set(requested, "set in config")
        elif requested == AUTO and device.type == "cpu" and self.load.readable:  # the setting, over the environment
            self.adaptive = True
            time.sleep(_START_WINDOW_S)  # a first look at what else runs (this process is idle meanwhile)
            busy = self.load.busy_elsewhere()
            self._wanted = self._fit(busy)
            self._set(self._wanted, f"threads=auto: {self.cores} cores{shared}" + (f", {busy} busy with other work" * bool(busy)))
        elif self.omp is not None:
            self._set(self.omp, "OMP_NUM_THREADS")
        elif device.type != "cpu":  # the GPU computes: torch's default serves the host side
            self.count, self.source = torch.get_num_threads(), "torch's default: the GPU computes"
        else:
            unread = "; threads=auto: no load counters here to follow" if requested == AUTO else ""
            self._set(self.share, f"{self.cores} cores{shared}{unread}")

    def _set(self, count: int, source: str) -> None:
        _set_threads(count)
        self.count, self.source = count, source

    @property
    def reason(self) -> str:
        hint = "" if self.source == "set in config" else "; threads=N to choose"
        return f"threads {self.count} ({self.source}{hint})"

    @property
    def chosen(self) -> bool:
        """Whether the user chose the count (the setting or OMP_NUM_THREADS)."""
        return isinstance(self.requested, int) or self.omp is not None

    def adopt(self, recorded: int | None) -> str | None:
        """A resumed run takes the count its checkpoint was trained with, unless the user chose one
        (or asked for threads=auto): then its steps are bitwise those of the uninterrupted run.
        A notice when the count differs from what the rule gave, or when the user's choice
        differs from the checkpoint's."""
        if recorded is None or recorded == self.count or self.device.type != "cpu":
            return None
        if self.adaptive or self.chosen:
            how = "threads=auto" if self.adaptive else self.source
            return (
                f"notice: threads {self.count} ({how}) where the checkpoint was trained with {recorded}: the resumed "
                f"steps will not be bitwise equal to an uninterrupted run's (threads={recorded} keeps them equal)"
            )
        default = self.count
        self._set(recorded, "the checkpoint's count")
        beyond = f"; this machine has {self.cores} cores: threads=N to choose" if recorded > self.cores else ""
        return (
            f"notice: threads {recorded}, the count the checkpoint was trained with (here the default would be "
            f"{default}), so that the resumed steps are bitwise those of an uninterrupted run{beyond}"
        )

    def load_notice(self) -> str | None:
        """One notice when other work keeps cores busy at the start (since this object was made):
        the run keeps its count, and says how to choose another. Called at the end of set-up,
        which then waits out the rest of a quarter second if set-up was shorter: the look needs
        a window in which this process computes little (while its own threads compute, the
        cores' busy time cannot tell them from other work)."""
        if self.load_checked or self.adaptive or self.device.type != "cpu" or not self.load.readable:
            return None
        wait = _START_WINDOW_S - self.load.seconds_since_last()
        if wait > 0:
            time.sleep(wait)
        self.load_checked = True
        busy = self.load.busy_elsewhere()
        free = max(1, self.cores - busy)
        if not busy or self.count <= free:
            return None
        return (
            f"notice: other work keeps {busy} of {self.cores} cores busy; this run keeps threads {self.count}, so its "
            f"results do not depend on that work, but it will run slower beside it: threads={free} (or "
            f"OMP_NUM_THREADS={free}) fits the free cores, threads=auto follows the load (not bitwise reproducible)"
        )

    # --- the adaptive governor (threads=auto) -------------------------------------------------------

    def _fit(self, busy: int) -> int:
        return max(1, min(self.share, self.cores - busy))

    def observe(self) -> str | None:
        """Under threads=auto: look again when a second has gone by since the last look (cheap: one
        file read); a notice when the thread count changed. A change needs the same answer twice
        in a row, so a passing spike does not make it flap."""
        if not self.adaptive or self.load.seconds_since_last() < _MIN_WINDOW_S:
            return None
        wanted = self._fit(self.load.busy_elsewhere())
        current = torch.get_num_threads()
        if wanted == current or wanted != self._wanted:
            self._wanted = wanted
            return None
        self._set(wanted, self.source)
        change = "other work took cores" if wanted < current else "cores came free"
        return f"notice: threads {current} -> {wanted} ({change}; threads=auto follows the load, threads=N fixes the count)"
