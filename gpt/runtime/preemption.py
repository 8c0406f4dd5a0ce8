"""Stop training cleanly on SIGTERM (cluster preemption) or Ctrl-C.

Inside the training loop the first signal only raises a flag: the loop finishes its current
step, saves a checkpoint, says how to resume, and exits with status 0. A second Ctrl-C stops at
once. Outside the loop (set-up, data preparation, the final sample) there is no step to finish
and nothing unsaved: the signal stops at once, as `Preempted`, which ends the same clean way.

Under torchrun a signal may reach one rank only (some schedulers preempt that way). A rank that
left alone would leave the others waiting in their next collective (they crashed with gloo's
"Connection closed by peer"), so there the flag is all a signal raises, from the moment the
command starts (`defer_until_the_run_listens`) through set-up: the loop's first check, where
every rank learns whether any was asked to stop, stops them all at the same step, with one save.
"""

from __future__ import annotations

import os
import signal
import threading


class Preempted(Exception):
    """Raised by `train()` after a signal-requested stop has saved its checkpoint, so that the
    entry point exits with status 0 and a sweep does not go on to its next job."""


_early: list[str] = []  # signals that came before a StopRequest listened (defer_until_the_run_listens)


def _keep(signum, frame) -> None:
    _early.append(signal.Signals(signum).name)


def defer_until_the_run_listens() -> None:
    """Keep SIGTERM / SIGINT for the run's StopRequest instead of ending the process: for a rank
    of a distributed run, from the moment its command starts (imports, composing the config)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _keep)


class StopRequest:
    def __init__(self, log=print, deferred: bool = False):
        """`deferred`: answer a signal with the flag alone from the start (a distributed run's
        set-up, see the module's docstring); else only while a loop polls it."""
        self.requested = False
        self.reason = ""
        self.deferred = deferred  # True while a loop polls `requested` between its steps
        self._log = log
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    def request(self, reason: str) -> None:
        self.requested, self.reason = True, reason

    def _handle(self, signum, frame) -> None:
        if os.getpid() != self._pid:  # a forked child (a data-preparation worker): not ours to stop cleanly
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: the user means it
        if not self.deferred:
            self.request(name)
            raise Preempted(f"{name} received outside the training loop")
        self.request(name)
        self._log(f"{name} received: stopping after this step, with a checkpoint (Ctrl-C again to quit at once)")

    def __enter__(self) -> StopRequest:
        # Signal handlers can only be installed from the main thread (not e.g. in a notebook worker).
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
            if _early:  # it came while the command started up: answered now, as any other
                self.request(_early.pop())
                _early.clear()
                if not self.deferred:
                    raise Preempted(f"{self.reason} received outside the training loop")
                self._log(f"{self.reason} received: stopping at the first step, with a checkpoint")
        return self

    def __exit__(self, *exc) -> None:
        # What was there before, the early keeper included: under torchrun a signal between two
        # jobs of a sweep is kept for the next one, never the end of one rank alone.
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def end_with(parent: int) -> None:
    """This process (a worker another started: data preparation's tokenizers) killed when
    `parent` dies. A pool's worker waits on its queue, which a parent killed outright (kill -9, the
    OOM killer) never closes: the workers slept on for good, each holding its tokenizer and memory
    (found as orphans of tests/data/test_prepare.py's kill test). Linux's parent-death signal
    (prctl PR_SET_PDEATHSIG, which Python's standard library does not expose); elsewhere, as before."""
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)
