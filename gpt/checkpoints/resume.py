"""Where a training run continues from, decided once: `resume_point` examines the `resume`
setting and the run directory (a damaged newest checkpoint is refused, and the one before it
taken, with the reason), and returns a `ResumePoint` that the command line finds before Hydra
writes anything and hands to the run's set-up as it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpt.checkpoints import checkpoint
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.checkpoints.loading import model_from_checkpoint
from gpt.checkpoints.runs import CKPT_DIR, has_run, latest, step_checkpoints
from gpt.errors import TinyGPTError

AUTO, NEVER = "auto", "never"


def parse_resume(value) -> str | Path:
    """The `resume` setting, read in this one place: AUTO, NEVER, or the path it names."""
    text = str(value).strip()
    if value is not None and text == "":
        raise TinyGPTError("resume= is empty; use resume=auto, resume=false, or a checkpoint / run directory")
    if value is None or text.lower() in ("auto", "true", "none", "null"):
        return AUTO
    if text.lower() in ("false", "never"):
        return NEVER
    return Path(text).expanduser()


def resume_source(resume, out_dir: Path, newest=latest, peek=None) -> Path | None:
    """The checkpoint a training run starts from, per `resume`:
    auto  - this run directory's newest checkpoint if it has one (rerunning a run continues it),
    false - none; refuse to train into a directory that already holds a run,
    path  - that checkpoint file, or the newest checkpoint of that run directory (the run
            continues in the new directory; the old one is only read).
    `peek(path)`: the checkpoint at path, when the caller has it already (read here otherwise)."""
    mode = parse_resume(resume)
    if mode == AUTO:
        return newest(out_dir)
    if mode == NEVER:
        if has_run(out_dir):
            raise TinyGPTError(f"{out_dir} already holds a run and resume=false; train into a new directory or use resume=auto")
        return None
    if mode.is_file():
        source = mode
    elif mode.is_dir():
        source = latest(mode)
        if source is None:
            raise TinyGPTError(f"resume={mode}: the directory holds no ckpt-*.pt checkpoint to resume from")
    else:
        raise TinyGPTError(f"resume={resume!r} is neither auto, false, a checkpoint file nor a run directory")
    own = newest(out_dir)
    if own is None or source.resolve() == own.resolve():
        return source
    # This directory's run began from `resume` and has saved since (preempted, rerun with the
    # same overrides): continue it, not the starting point again.
    peek = peek or (lambda path: checkpoint.load(path, mmap=True))
    if source.resolve().parent != own.resolve().parent and _same_path(peek(own).config.get("resume"), resume):
        return own
    # Any other trajectory here would overwrite its ckpt-<step> files (same step names) or have
    # them pruned (retention keeps the highest steps): refuse rather than lose them.
    raise TinyGPTError(
        f"{out_dir} already holds a run (newest checkpoint {own.name}); continuing from {source} there would "
        f"overwrite or prune its checkpoints: train into a new directory, or use resume=auto to continue that run"
    )


def _same_path(a, b) -> bool:
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def resumable(path: Path) -> Checkpoint:
    """The checkpoint at `path` (its tensors mapped, not read) if training can continue from it:
    it loads, holds the training state, and its weights fit its own model; else a TinyGPTError
    that says which. Checked before anything is written, and again for each step checkpoint of
    a run that resumes, so that a damaged newest one is not where the run continues from. (Each is
    examined once per start: the command line hands the point it found to the run's set-up.)"""
    ckpt = checkpoint.load(path, mmap=True)
    if ckpt.training is None:
        raise TinyGPTError(f"{path} holds weights only (no optimizer state) and cannot be resumed; pass a ckpt-*.pt file")
    try:
        model_from_checkpoint(ckpt)
    except TinyGPTError as e:
        raise TinyGPTError(f"{path}: {e}") from None
    return ckpt


def newest_resumable(run_dir: Path) -> tuple[Path | None, Checkpoint | None, list[tuple[Path, str]]]:
    """The newest step checkpoint of `run_dir` that `resumable` accepts (its path and checkpoint),
    and the newer ones it refused with the reason for each (for the caller to set aside and say
    so); (None, None, []) for a run without checkpoints. A run whose checkpoints all fail is
    refused: starting afresh there would overwrite or prune them."""
    refused = []
    for path in reversed(step_checkpoints(run_dir)):
        try:
            return path, resumable(path), refused
        except TinyGPTError as e:
            refused.append((path, str(e)))
    if refused:
        raise TinyGPTError(
            f"{run_dir} holds checkpoints but none can be resumed from (newest: {refused[0][1]}); move "
            f"{run_dir / CKPT_DIR} elsewhere to train afresh there, or train into a new directory"
        )
    return None, None, refused


@dataclass
class ResumePoint:
    """Where a training run into `run_dir` continues from, found once: the command line finds it
    before Hydra writes anything (and refuses a bad one), and the run's set-up takes it as found."""

    run_dir: Path | None  # None: where the run goes is not known yet (only resume= is examined)
    source: Path | None = None  # None: a new run
    checkpoint: Checkpoint | None = None  # the source's (tensors mapped, not read)
    refused: list[tuple[Path, str]] = field(default_factory=list)  # newer checkpoints of run_dir that cannot be resumed


def resume_point(resume, run_dir: Path | None) -> ResumePoint:
    """The checkpoint a training run into `run_dir` starts from per `resume` (auto | false | a
    checkpoint or run directory: resume_source), each candidate examined once by
    `resumable`; a TinyGPTError that says what is wrong otherwise."""
    point, found = ResumePoint(Path(run_dir) if run_dir is not None else None), {}

    def newest(folder: Path | None) -> Path | None:
        if folder is None:
            return None
        path, ckpt, refused = newest_resumable(folder)
        found[path] = ckpt
        point.refused += refused
        return path

    given = parse_resume(resume)
    if isinstance(given, Path) and given.is_file():  # first: what is wrong with it is the news
        try:
            found[given] = resumable(given)
        except TinyGPTError as e:
            raise TinyGPTError(f"resume={resume}: {e}") from None
    peek = lambda path: found.get(path) or checkpoint.load(path, mmap=True)  # noqa: E731
    point.source = resume_source(resume, point.run_dir, newest, peek)
    if point.source is not None:
        try:
            point.checkpoint = found.get(point.source) or resumable(point.source)
        except TinyGPTError as e:
            raise TinyGPTError(f"resume={resume}: {e}") from None
    return point
