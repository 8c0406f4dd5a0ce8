"""Stop training cleanly on SIGTERM (cluster preemption) or Ctrl-C.

Inside the training loop the first signal only raises a flag: the loop finishes its current
step, saves a checkpoint, says how to resume, and exits with status 0. A second Ctrl-C stops at
once. Outside the loop (set-up, data preparation, the final sample) there is no step to finish
and nothing unsaved: the signal stops at once, as `Preempted`, which ends the same clean way.
"""

from __future__ import annotations

import os
import signal
import threading


class Preempted(Exception):
    """Raised by `train()` after a signal-requested stop has saved its checkpoint, so that the
    entry point exits with status 0 and a sweep does not go on to its next job."""


class StopRequest:
    def __init__(self, log=print):
        self.requested = False
        self.reason = ""
        self.deferred = False  # True while a loop polls `requested` between its steps
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
        self._log(f"{name} received: finishing this step, then saving a checkpoint (Ctrl-C again to quit at once)")

    def __enter__(self) -> StopRequest:
        # Signal handlers can only be installed from the main thread (not e.g. in a notebook worker).
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
