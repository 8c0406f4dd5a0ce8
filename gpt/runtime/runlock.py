"""One writer per run directory: `<run>/.lock` names the training process that owns the run.

Two trainings into one directory would interleave their metrics and overwrite each other's
checkpoints without a word, so the second is refused. A lock whose owner is gone (kill -9, a
crash, a reboot) is taken over: on the owner's host, when its pid no longer runs (or runs a
newer process that reused the pid); from another host, when neither the lock nor the run's
summary.json heartbeat is younger than `STALE_AFTER` seconds. Under torchrun only rank 0 holds it.

The command line takes the lock before anything else reads or writes the directory (before the
run's checks and Hydra: gpt.apps.train), and the trainer in the same process finds it its own; a
notebook's `train()` takes it itself. Taking it is one atomic step: the lock file appears whole
(written aside, then hard-linked into place, which fails if one exists), so of two starts in the
same instant exactly one gets it, and no reader ever sees it empty. Taking over a dead owner's lock
(read it, remove it, link ours) is serialised by an exclusive flock on the run directory, so two
starts cannot both find it dead and each remove the other's new lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from gpt.errors import TinyGPTError

LOCK = ".lock"
STALE_AFTER = 7200.0  # seconds without a heartbeat after which a run written on another host is stale


def _started(pid: int) -> str | None:
    """When process `pid` started (Linux: clock ticks since boot), to tell it from a later
    process that got the same pid; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _pid_namespace() -> str | None:
    """Which pid namespace this process lives in (Linux): two containers can share a host name
    (docker --net=host, Kubernetes hostNetwork) but not their pids."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _local(owner: dict) -> bool:
    """Whether the owner's pid can be probed from here: the same host, the same pid namespace
    (a lock that names none was written before it was recorded: taken as the same)."""
    ns = owner.get("ns")
    return owner.get("host") == socket.gethostname() and (ns is None or ns == _pid_namespace())


def _alive(owner: dict) -> bool:
    pid = owner.get("pid")
    if not _local(owner) or not isinstance(pid, int) or os.name != "posix":
        return True  # not ours to probe: the heartbeat decides (see _stale)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return owner.get("started") is None or _started(pid) in (None, owner["started"])


def _stale(run_dir: Path, owner: dict) -> bool:
    if not _alive(owner):
        return True
    if _local(owner):
        return False
    try:
        beat = json.loads((run_dir / "summary.json").read_text()).get("heartbeat")
    except (OSError, ValueError, AttributeError):
        beat = None
    # The lock's own time too: a run just started elsewhere has not beaten yet, and the summary
    # may still be an earlier run's
    since = max(beat if isinstance(beat, (int, float)) else 0, owner.get("time", 0) or 0)
    return time.time() - since > STALE_AFTER


def _me() -> dict:
    return {"host": socket.gethostname(), "ns": _pid_namespace(), "pid": os.getpid(), "started": _started(os.getpid())}


def _is_me(owner: dict | None) -> bool:
    return owner is not None and all(owner.get(k) == v for k, v in _me().items())


def owner_of(run_dir: Path) -> dict | None:
    """Who holds the run now: the lock's record if its owner is alive, else None."""
    try:
        owner = json.loads((Path(run_dir) / LOCK).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(owner, dict) or _stale(Path(run_dir), owner):
        return None
    return owner


def _refusal(run_dir: Path, owner: dict) -> TinyGPTError:
    return TinyGPTError(
        f"{run_dir} is being trained by process {owner.get('pid')} on {owner.get('host')}; wait for it to end or "
        f"train into another directory (if that process is gone for good, delete {Path(run_dir) / LOCK})"
    )


def check(run_dir: Path) -> None:
    """Refuse now, before anything is written, if another live process trains in `run_dir`."""
    owner = owner_of(run_dir)
    if owner is not None and not _is_me(owner):
        raise _refusal(run_dir, owner)


def _create(aside: Path, lock: Path) -> None:
    """`lock` with `aside`'s content, or FileExistsError. A hard link appears whole; where the
    filesystem has none (vfat, some network mounts), an exclusive create and a write."""
    try:
        os.link(aside, lock)
    except FileExistsError:
        raise
    except OSError:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(aside.read_text())


@contextlib.contextmanager
def _serialised(run_dir: Path):
    """An exclusive flock on the directory itself while a takeover runs (no file of its own to
    leave behind). Where directories cannot be flocked (not POSIX, some network filesystems),
    no guard: the takeover is then as atomic as the filesystem allows."""
    try:
        import fcntl

        fd = os.open(run_dir, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing releases the flock


class RunLock:
    def __init__(self, run_dir: Path, log=print):
        self.path, self.run_dir, self.log, self.held = Path(run_dir) / LOCK, Path(run_dir), log, False

    def acquire(self) -> RunLock:
        """Take the lock, or find it already this process's (then the first holder releases it)."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TinyGPTError(
                f"cannot create the run directory {self.run_dir} ({e.strerror or e}); train into a folder you can write"
            ) from None
        aside = self.run_dir / f"{LOCK}.{os.getpid()}"
        aside.write_text(json.dumps({**_me(), "time": time.time()}))
        try:
            try:
                _create(aside, self.path)
            except FileExistsError:
                return self._take_over(aside)
            self.held = True
            return self
        finally:
            aside.unlink(missing_ok=True)

    def _take_over(self, aside: Path) -> RunLock:
        """A lock exists: ours already, a live owner's (refused), or a dead owner's, replaced by ours.
        Read again under the guard: another start may have replaced it meanwhile."""
        with _serialised(self.run_dir):
            owner = owner_of(self.run_dir)
            if _is_me(owner):
                return self
            if owner is not None:
                raise _refusal(self.run_dir, owner)
            if self.path.exists():
                self.log(f"notice: taking over {self.path} from a process that is gone")
                self.path.unlink(missing_ok=True)
            try:
                _create(aside, self.path)
            except FileExistsError:  # a start that took no guard (a filesystem without flock) won
                raise _refusal(self.run_dir, owner_of(self.run_dir) or {}) from None
            self.held = True
            return self

    def release(self) -> None:
        """Remove the lock if it is still this process's (one taken over meanwhile is not)."""
        if self.held:
            try:
                mine = _is_me(json.loads(self.path.read_text()))
            except (OSError, ValueError):
                mine = False
            if mine:
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
