"""Step 2 of a start, the claim: before a run touches anything, every check that needs no data
(`preflight`), and the run directory taken for one run (`claim`): its lock held, and where the
run continues from decided once (`resume_point`: new, resumed or a finetune's, which checkpoint,
a damaged newest one refused with the reason and the one before it taken) into a `ResumePoint`.
Decided once, here, and handed down as values: the command line claims the run directory before
Hydra writes into it and passes the claim to `gpt.training.train`; a run started from Python (or
a sweep's job) is claimed by `train` itself."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpt.checkpoints import checkpoint
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.checkpoints.runs import CKPT_DIR, has_run, latest, step_checkpoints
from gpt.config import RunConfig
from gpt.errors import RunRefused, TinyGPTError
from gpt.runtime.runlock import RunLock

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
    from gpt.checkpoints.loading import model_from_checkpoint

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


def preflight(settings: RunConfig, run_dir: Path | None = None, here: bool = True) -> ResumePoint | None:
    """The checks that need no data: the eval tasks' names, the data source and root, what the
    run resumes from, what it starts from, the runtime (the model's shape was checked when the
    settings were built). `run_dir`: the directory the run trains into, which may hold a run to
    resume; returns where it resumes from, examined once (None without a run directory and no
    resume= path). `here`: whether the run starts on this machine (a SLURM job finds its node's
    devices itself)."""
    from gpt.data import sources
    from gpt.runtime import devices
    from gpt.training import parallel

    if settings.train.eval_tasks:
        from gpt.evals import tasks

        tasks.check_names(settings.train.eval_tasks)
    sources.check(settings.data.source)
    _check_data_root(settings.paths.data_root())
    point = None
    if run_dir is not None or isinstance(parse_resume(settings.resume), Path):
        point = resume_point(settings.resume, run_dir)
    if point is not None and point.checkpoint is not None:
        _check_same_run(point.checkpoint, point.source, settings)
    finetune = point is not None and point.checkpoint is not None and (point.checkpoint.config or {}).get("init_from")
    if point is not None and point.checkpoint is not None and not (settings.init_from or finetune):
        # (a finetune's data takes its model's tokenizer, whatever data.tokenizer says: compared
        # with the checkpoint's once the data is prepared, gpt.training.build)
        _check_tokenizer_kind(point.checkpoint, point.source, settings)
    if settings.init_from:
        from gpt.checkpoints import loading

        loading.check(settings.init_from)
    dtype = None
    if here:
        device, _ = devices.pick_device(settings.device)
        dtype, _ = devices.pick_dtype(device, settings.dtype, training=True)
        devices.pick_compile(device, settings.compile)
    parallel.check(settings, dtype)
    return point


@dataclass
class Claim:
    """A run directory taken for one run: its lock, held until `release`, and where the run
    continues from."""

    run_dir: Path
    point: ResumePoint | None
    lock: RunLock

    def release(self) -> None:
        self.lock.release()


def claim(settings: RunConfig, run_dir: Path, log=None) -> Claim:
    """Lock `run_dir` (one writer per run directory: of two starts into one directory exactly one
    goes on, and nothing of the other's run is read or moved meanwhile), then `preflight`. A
    refused start releases the lock and leaves no empty directory it made. The lock's refusal is
    a RunRefused (the directory is another process's: nothing of it may be touched)."""
    run_dir = Path(run_dir).expanduser().absolute()
    outermost = next((f for f in (run_dir, *run_dir.parents) if not f.exists() and f.parent.exists()), None)  # made here
    lock = RunLock(run_dir, log=log or (lambda m: print(m, file=sys.stderr)))
    try:
        lock.acquire()
    except RunRefused:
        raise
    except TinyGPTError as e:
        raise RunRefused(str(e)) from None
    try:
        return Claim(run_dir, preflight(settings, run_dir), lock)
    except BaseException:
        lock.release()
        _remove_empty(run_dir, outermost)
        raise


def _remove_empty(folder: Path, outermost: Path | None) -> None:
    """The folders a refused start made (the run directory and, on a first run, outputs/runs/
    above it), up to `outermost`, each only if it is empty."""
    while outermost is not None and folder.is_relative_to(outermost) and folder.is_dir() and not any(folder.iterdir()):
        try:
            folder.rmdir()
        except OSError:  # another start, at the same moment, made or removed it: it is that one's now
            return
        folder = folder.parent


def _check_data_root(root: Path) -> None:
    """A data root that is a file (or under one) cannot hold prepared data."""
    for folder in (root, *root.parents):
        if folder.exists():
            if not folder.is_dir():
                raise TinyGPTError(f"paths.data_dir={root}: {folder} is a file; name a folder for prepared data")
            return


def _check_same_run(resumed, source: Path, settings: RunConfig) -> None:
    """A run resumes on the data it trained on and with the optimizer it trained with (where the
    loader stands, and the optimizer's state, belong to them). A resumed run's settings are
    composed from the defaults and the command line, as any run's, so a resume that repeats
    neither would go on with the defaults' (the quickstart's data, Muon) and a "changed:" notice;
    refused instead, with what the run's last start passed."""
    recorded = resumed.config or {}
    data, optim = (recorded.get("data") or {}).get("name"), (recorded.get("optim") or {}).get("name")
    wrong = []
    if data and data != settings.data.name:
        wrong.append(f"data.name={data} (this command's: {settings.data.name})")
    if optim and optim != settings.optim.name:
        wrong.append(f"optim={optim} (this command's: optim={settings.optim.name})")
    if wrong:
        raise TinyGPTError(
            f"{source} was trained with {' and '.join(wrong)}; a run resumes with its own data and optimizer: "
            f"{started_with(source)}"
        )


def started_with(source: Path) -> str:
    """How to pass a run's data and optimizer again: what its last start set of them (its
    summary.json's overrides), where there is a record."""
    ours = recorded_overrides(source, ("data", "optim", "experiment"))
    if not ours:
        return "pass the data and optimizer settings it was started with again"
    return "pass again what its last start passed of them: " + " ".join(ours)


def recorded_overrides(source: Path, groups: tuple[str, ...]) -> list[str]:
    """What the last start of the run a checkpoint belongs to passed of the settings `groups`
    (the overrides the trainer records in <run>/summary.json); [] without a record."""
    from gpt.tracking import read_json

    # a step checkpoint sits in <run>/checkpoints/; one elsewhere has no run record to read
    source = Path(source)
    given = read_json(source.parent.parent / "summary.json").get("overrides") if source.parent.name == "checkpoints" else None
    given = [str(o) for o in given] if isinstance(given, list) else []
    return [o for o in given if o.lstrip("+~").split("=")[0].split(".")[0].split("/")[0] in groups]


def _check_tokenizer_kind(resumed, source: Path, settings: RunConfig) -> None:
    """A run resumes on data of its own tokenizer. The kind and, for a fixed vocabulary, the whole
    identity are known now; a char vocabulary or a BPE is fitted to its corpus, compared once the
    data is prepared (gpt.training.build)."""
    from gpt.tokenizers import difference, normalize_spec, tokenizer_identity

    theirs, ours = tokenizer_identity(resumed.tokenizer), tokenizer_identity(normalize_spec(asdict(settings.data.tokenizer)))
    if ours.get("vocab_size") is None:  # known once the ranks file is read (the settings say None)
        theirs.pop("vocab_size", None)
        ours.pop("vocab_size", None)
    # char and bpe are fitted to the corpus and hf read from its file: compared once the data is prepared
    if theirs["kind"] != ours["kind"] or (ours["kind"] not in ("char", "bpe", "hf") and theirs != ours):
        raise TinyGPTError(
            f"the checkpoint's tokenizer differs from data={settings.data.name}'s ({difference(resumed.tokenizer, ours)}); "
            f"a run resumes with its own data and optimizer: {started_with(source)}"
        )
