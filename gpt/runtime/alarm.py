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
same mistake met by every rank, a collective that fails on its own, or torchrun's agent stopping
it): then that process ends as it would have, saying its own error, and the first process to
exit is the one that failed (the one torchrun names as the root cause). Only a process still
waiting after that is ended, with `os._exit`: it is blocked inside a collective, where no Python
exception can reach it. Before that its `last_words` run (rank 0: the run's summary says
`failed`, its directory's lock is released); checkpoints need nothing, as one appears whole or
not at all (gpt.checkpoints).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable

FAILED = "failed"  # the first failing process's reason: later ones (its consequences) are not kept
POLL_S = 1.0  # how often a listener reads the store
GRACE_S = 3.0  # how long a listener leaves its process to fail, or be stopped, by itself
HEARING_S = 30.0  # the longest the store's host waits, as it exits, for the others to hear
LAST_WORDS_S = 5.0  # the longest a stopped process spends on its last words
EXIT_S = 2.0  # time enough for a failed process to exit (`news`)

_listener: Listener | None = None
_leaving = threading.Lock()  # a process leaves once: by failing (`announce`) or by being stopped (`Listener`)
_last_words: list[Callable[[str], None]] = []


def _heard(rank: int) -> str:
    return f"heard/{rank}"


class Listener(threading.Thread):
    """Reads the store every POLL_S until this process fails (`announce`) or exits. `hosting`:
    the store lives in this process (rank 0, launched without torchrun's agent)."""

    def __init__(self, store, rank: int, world_size: int, hosting: bool):
        super().__init__(name="tinygpt-alarm", daemon=True)
        # A connection of its own: a store's connection serves one request at a time, and the
        # main thread's may be held for minutes by a wait (for a process group's peers to meet).
        self.shared, self.store = store, store.clone()
        self.rank, self.world_size, self.hosting = rank, world_size, hosting
        self.leaving = threading.Event()  # set when this process leaves by itself: nothing more to do
        self.told: list[str | None] = []  # what `news` found, once

    def run(self) -> None:
        while not self.leaving.wait(POLL_S):
            try:
                if not self.store.check([FAILED]):
                    continue
                reason = self.store.get(FAILED).decode()
            except Exception:  # noqa: BLE001 - the store's host has gone (its run ended, or it failed): nothing more will come
                return
            if self.leaving.wait(GRACE_S):  # this process left by itself meanwhile
                return
            self._end(reason)

    def take_leave(self) -> bool:
        """Whether this call is the one that makes the process leave (by failing, by hearing of
        another's failure, or by being stopped): a process leaves once."""
        with _leaving:
            if self.leaving.is_set():
                return False
            self.leaving.set()
            return True

    def _end(self, reason: str) -> None:
        if not self.take_leave():
            return
        with contextlib.suppress(Exception):
            self.store.set(_heard(self.rank), "1")
        print(f"error: process {self.rank} of {self.world_size} stops because {reason}", file=sys.stderr, flush=True)
        words = threading.Thread(target=_say_last_words, args=(reason,), daemon=True)
        words.start()
        words.join(LAST_WORDS_S)  # a hung filesystem must not keep the process
        os._exit(1)


def _say_last_words(reason: str) -> None:
    for words in list(_last_words):  # the outermost first: the run directory's lock is released before all else
        with contextlib.suppress(Exception):
            words(reason)


@contextlib.contextmanager
def last_words(words: Callable[[str], None]):
    """Inside, `words(reason)` runs if a listener ends this process (see the module's docstring)."""
    _last_words.append(words)
    try:
        yield
    finally:
        _last_words.remove(words)


def listen(store, rank: int, world_size: int, hosting: bool) -> None:
    """Start this process's listener (once)."""
    global _listener
    if _listener is None:
        _listener = Listener(store, rank, world_size, hosting)
        _listener.start()
        atexit.register(stop)


def announce(reason: str) -> None:
    """This process fails with `reason`: tell the others. A no-op outside a distributed run.
    The store's host, as it exits, waits until each has heard (or failed too), at most HEARING_S:
    the store ends with it."""
    listener = _listener
    if listener is None or not listener.take_leave():
        return
    store = listener.shared
    try:
        store.compare_set(FAILED, "", f"process {listener.rank} of {listener.world_size} failed: {reason}")
        store.set(_heard(listener.rank), "1")
    except Exception:  # noqa: BLE001 - the store is gone (its host failed too): nobody is left to tell
        return
    if listener.hosting:
        atexit.register(_wait_for_the_others, store, listener.world_size)


# How gloo reports a process that has gone (NCCL notices nothing: the listener is for that).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_gone(error: BaseException) -> bool:
    """Whether a collective failed because another process has gone (a consequence, not a
    failure of this process's own to announce)."""
    return isinstance(error, RuntimeError) and any(s in str(error) for s in PEER_GONE)


def cut_short(error: BaseException) -> str:
    """What a process whose collective a gone peer cut short (`peer_gone`) records as its error,
    until the other process's own reason replaces it (`news`)."""
    from gpt.errors import one_line

    return f"another process of this run exited ({one_line(error)})"


def news(wait_s: float) -> str | None:
    """The failure another process announced ("process 0 of 8 failed: ..."), waiting up to
    `wait_s` for it: for a process whose collective failed because a peer has gone. The first
    time, it then waits a moment more, so that the failed process exits first: torchrun's agent
    names the first process to exit as the failure's root cause. None without news (a peer
    that died without a word), or outside a distributed run."""
    listener, deadline = _listener, time.monotonic() + wait_s
    if listener is None:
        return None
    # A process that asks has left its collective: its listener stands down first, or it would
    # end this process (exit status 1, no record) during the waits below, which may outlast GRACE_S.
    leave()
    if listener.told:  # asked before: the answer stands (no second wait)
        return listener.told[0]
    own, reason = f"process {listener.rank} of ", None
    try:
        while time.monotonic() < deadline:
            if listener.shared.check([FAILED]) and not (told := listener.shared.get(FAILED).decode()).startswith(own):
                reason = told
                break
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - the store's host has gone
        pass
    listener.told.append(reason)
    if reason is not None:
        time.sleep(EXIT_S)
    return reason


def leave() -> None:
    """This process ends because another did (`peer_gone`): nothing of its own to announce, and
    its listener has nothing more to do. The store's host is told it has heard."""
    listener = _listener
    if listener is None or not listener.take_leave():
        return
    with contextlib.suppress(Exception):
        listener.shared.set(_heard(listener.rank), "1")


def _wait_for_the_others(store, world_size: int) -> None:
    everyone, deadline = [_heard(rank) for rank in range(world_size)], time.monotonic() + HEARING_S
    with contextlib.suppress(Exception):
        while not store.check(everyone) and time.monotonic() < deadline:
            time.sleep(0.1)


def stop() -> None:
    """End the listener (the process is exiting): the store's host, if it waits for the others
    to hear of its own late failure, need not wait for this one."""
    global _listener
    if _listener is not None:
        with contextlib.suppress(Exception):  # (the host may have ended already)
            _listener.shared.set(_heard(_listener.rank), "1")
        _listener.leaving.set()
        _listener.join(timeout=POLL_S + 1)
        _listener = None
