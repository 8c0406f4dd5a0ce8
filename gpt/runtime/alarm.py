"""When one process of a distributed run fails, the others stop within seconds and say why.

torchrun's agent kills a failed process's peers; `srun` does not (unless given
--kill-on-bad-exit), nor does the submitit launcher's job, and NCCL does not notice that a peer
has gone: the others would wait in their next collective until its timeout (30 minutes; at a
patient barrier, two days) holding their GPUs, and a process that never reached the rendezvous
leaves the others waiting to meet it for as long. So every process of a run joins the job's
rendezvous store as it starts (gpt.runtime.distributed.meet), a failing one writes its reason
there (`announce`), and the others' `Listener` reads it and ends its process. Written here:
torch.distributed has no such signal between processes (its error propagation covers NCCL's own
errors, not an exception in the program).

A listener that hears of a failure first gives its own process a moment to fail by itself (the
same mistake met by every rank, or the collective that told every rank rank 0 could not save):
that process says its own error. Only a process still waiting is ended, with `os._exit`: it is
blocked inside a collective, where no Python exception can reach it, and it writes nothing a
stop would break (a checkpoint appears whole or not at all, gpt.checkpoints).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

FAILED = "tinygpt/failed"  # the first failing process's reason: later ones (its consequences) are not kept
LEFT = "tinygpt/left"  # how many processes have failed or heard of a failure
POLL_S = 1.0  # how often a listener reads the store
GRACE_S = 3.0  # how long a listener leaves its process to fail by itself
HEARING_S = 30.0  # the longest a failing process waits for the others to hear (one may still be starting)

_listener: Listener | None = None


class Listener(threading.Thread):
    """Reads the store every POLL_S until this process fails (`announce`) or exits."""

    def __init__(self, store, rank: int, world_size: int):
        super().__init__(name="tinygpt-alarm", daemon=True)
        # A connection of its own: a store's connection serves one request at a time, and the
        # main thread's may be held for minutes by a wait (for a process group's peers to meet).
        self.store, self.rank, self.world_size = store.clone(), rank, world_size
        self.leaving = threading.Event()  # set when this process fails by itself: nothing more to do

    def run(self) -> None:
        while not self.leaving.wait(POLL_S):
            try:
                if not self.store.check([FAILED]):
                    continue
                reason = self.store.get(FAILED).decode()
            except Exception:  # noqa: BLE001 - the store's host has ended (at a run's end, or failed): not ours to judge
                continue
            if self.leaving.wait(GRACE_S):  # this process failed by itself meanwhile and says its own error
                return
            self._end(reason)

    def _end(self, reason: str) -> None:
        try:
            self.store.add(LEFT, 1)
        except Exception:  # noqa: BLE001 - the failing process may be gone already
            pass
        print(f"error: process {self.rank} of {self.world_size} stops because {reason}", file=sys.stderr, flush=True)
        os._exit(1)


def listen(store, rank: int, world_size: int) -> None:
    """Start this process's listener (once)."""
    global _listener
    if _listener is None:
        _listener = Listener(store, rank, world_size)
        _listener.start()
        atexit.register(stop)


def announce(reason: str) -> None:
    """This process fails with `reason`: tell the others, and return once each has heard (or
    failed too), at most HEARING_S later, so that a store this process hosts (rank 0's, under
    srun) outlives the news. A no-op outside a distributed run."""
    listener = _listener
    if listener is None or listener.leaving.is_set():
        return
    listener.leaving.set()
    store, rank, size = listener.store, listener.rank, listener.world_size
    try:
        store.compare_set(FAILED, "", f"process {rank} of {size} failed: {reason}")
        left, deadline = store.add(LEFT, 1), time.monotonic() + HEARING_S
        while left < size and time.monotonic() < deadline:
            time.sleep(0.1)
            left = store.add(LEFT, 0)
    except Exception:  # noqa: BLE001 - the store is gone (its host failed too): nobody is left to tell
        return


def stop() -> None:
    """End the listener (the process is exiting normally)."""
    global _listener
    if _listener is not None:
        _listener.leaving.set()
        _listener.join(timeout=POLL_S + 1)
        _listener = None
