"""One way to get a model and its tokenizer from what a user names: a tinygpt checkpoint file,
a run directory (its best.pt), a Hugging Face GPT-2 (Hub name or folder), or nothing (the
newest run under the runs folder). Used by sampling, evaluation, export and finetuning.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch.nn as nn

from gpt.checkpoints import checkpoint
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.config import PathsSettings
from gpt.errors import TinyGPTError
from gpt.model import registry
from gpt.tokenizers import Tokenizer, tokenizer_from_dict


@dataclass
class Loaded:
    model: nn.Module  # on the CPU, in eval mode
    tokenizer_spec: dict  # the tokenizer's dict form: comparable with the data's without building it
    source: str  # what was loaded, for messages: a checkpoint path or a pretrained name/folder
    checkpoint: Checkpoint | None = None  # None for Hugging Face models

    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_dict(self.tokenizer_spec)


def choose(
    ckpt: str | None = None, run_dir: str | None = None, init_from: str | None = None, runs_dir: str | Path | None = None
) -> str:
    """What the command-line choices (ckpt=, run_dir=, init_from=, else the newest run) name."""
    if init_from:
        return init_from
    path = checkpoint.resolve(ckpt, run_dir, runs_dir or PathsSettings().runs_dir)
    # A run directory, not its best.pt: `load` falls back to another of its checkpoints if that is damaged.
    return str(path if ckpt else path.parent.parent)


def check(source: str, what: str = "init_from") -> None:
    """Refuse, cheaply and before anything is written, a source `load` could not load: not a GPT-2
    name, folder or checkpoint; a run directory without checkpoints; a file that is no checkpoint
    (its tensors are mapped, not read)."""
    from gpt import interop

    if interop.is_hf_source(source):
        interop.check(source)
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise TinyGPTError(
            f"{what}={source} is not a Hugging Face model (a Hub name such as {', '.join(interop.HUB_MODELS)} or "
            f"owner/name, or a folder with config.json), a tinygpt run directory or a checkpoint file"
        )
    if not path.is_dir():
        checkpoint.load(path, mmap=True)
        return
    checkpoint.checkpoint_in_run(path)  # refuses a directory without checkpoints
    reasons = []
    for candidate in checkpoint.candidates_in_run(path):
        try:
            checkpoint.load(candidate, mmap=True)
            return
        except TinyGPTError as e:
            reasons.append(str(e))
    raise TinyGPTError(f"{what}={source}: no checkpoint of that run loads ({reasons[0]})")


def load(source: str, dropout: float | None = None, log=None) -> Loaded:
    """A Hugging Face GPT-2 (Hub name or folder with config.json), a tinygpt checkpoint, or a run
    directory (its best.pt, else its newest step checkpoint; a damaged one is skipped with a
    notice through `log`, stderr by default). `dropout` replaces the model's."""
    from gpt import interop

    log = log or (lambda message: print(message, file=sys.stderr))

    if interop.is_hf_source(source):
        model, tokenizer = interop.load(source, dropout or 0.0)
        if tokenizer is None:
            raise TinyGPTError(
                f"{source} has a vocabulary of {model.config.vocab_size} and no tokenizer files (tokenizer.json, or "
                f"tinygpt_tokenizer.json); put the model's tokenizer.json beside its config.json"
            )
        return Loaded(model.eval(), tokenizer, source)
    path = Path(source).expanduser()
    if not path.exists():
        raise TinyGPTError(
            f"init_from={source} is not a Hugging Face model (a Hub name such as {', '.join(interop.HUB_MODELS)} or "
            f"owner/name, or a folder with config.json), a tinygpt run directory or a checkpoint file"
        )
    if not path.is_dir():
        ckpt, model = _load_file(path, dropout)
        return Loaded(model.eval(), ckpt.tokenizer, str(path), ckpt)
    checkpoint.checkpoint_in_run(path)  # refuses a directory without checkpoints
    refused = []
    for candidate in checkpoint.candidates_in_run(path):
        try:
            ckpt, model = _load_file(candidate, dropout)
        except TinyGPTError as e:
            refused.append(str(e))
            continue
        for reason in refused:  # the damaged file stays where it is: readers do not rearrange a run
            log(f"notice: {reason}; using {candidate.name} instead")
        return Loaded(model.eval(), ckpt.tokenizer, str(candidate), ckpt)
    raise TinyGPTError(f"no checkpoint of {path} loads ({refused[0]}); pass ckpt=<a checkpoint that loads>")


def _load_file(path: Path, dropout: float | None) -> tuple[Checkpoint, nn.Module]:
    ckpt = checkpoint.load(path)
    try:
        return ckpt, model_from_checkpoint(ckpt, dropout)
    except TinyGPTError as e:
        raise TinyGPTError(f"{path}: {e}") from None


def resumable(path: Path) -> Checkpoint:
    """The checkpoint at `path` (its tensors mapped, not read) if training can continue from it:
    it loads, holds the training state, and its weights fit its own model; else a TinyGPTError
    that says which. Checked before anything is written, and again for each step checkpoint of
    a run that resumes, so that a damaged newest one is not where the run continues from."""
    ckpt = checkpoint.load(path, mmap=True)
    if ckpt.training is None:
        raise TinyGPTError(f"{path} holds weights only (no optimizer state) and cannot be resumed; pass a ckpt-*.pt file")
    stamp = _stamp(path)
    if stamp not in _FITS:
        try:
            model_from_checkpoint(ckpt)
        except TinyGPTError as e:
            raise TinyGPTError(f"{path}: {e}") from None
        _FITS.add(stamp)
    return ckpt


# Checkpoints whose weights were seen to fit their model, by (path, size, mtime): the command's
# preflight and the run's set-up ask about the same files, and building a large model to check
# it is the costly part. (Only the verdict is kept: a kept checkpoint would hold its file open.)
_FITS: set[tuple] = set()


def _stamp(path: Path) -> tuple:
    st = Path(path).stat()
    return (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def newest_resumable(run_dir: Path) -> tuple[Path | None, Checkpoint | None, list[tuple[Path, str]]]:
    """The newest step checkpoint of `run_dir` that `resumable` accepts (its path and checkpoint),
    and the newer ones it refused with the reason for each (for the caller to set aside and say
    so); (None, None, []) for a run without checkpoints. A run whose checkpoints all fail is
    refused: starting afresh there would overwrite or prune them."""
    refused = []
    for path in reversed(checkpoint.step_checkpoints(run_dir)):
        try:
            return path, resumable(path), refused
        except TinyGPTError as e:
            refused.append((path, str(e)))
    if refused:
        raise TinyGPTError(
            f"{run_dir} holds checkpoints but none can be resumed from (newest: {refused[0][1]}); move "
            f"{run_dir / checkpoint.CKPT_DIR} elsewhere to train afresh there, or train into a new directory"
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
    checkpoint or run directory: gpt.checkpoints.checkpoint.resume_source), each candidate examined once by
    `resumable`; a TinyGPTError that says what is wrong otherwise."""
    point, found = ResumePoint(Path(run_dir) if run_dir is not None else None), {}

    def newest(folder: Path | None) -> Path | None:
        if folder is None:
            return None
        path, ckpt, refused = newest_resumable(folder)
        found[path] = ckpt
        point.refused += refused
        return path

    given = checkpoint.parse_resume(resume)
    if isinstance(given, Path) and given.is_file():  # first: what is wrong with it is the news
        try:
            found[given] = resumable(given)
        except TinyGPTError as e:
            raise TinyGPTError(f"resume={resume}: {e}") from None
    peek = lambda path: found.get(path) or checkpoint.load(path, mmap=True)  # noqa: E731
    point.source = checkpoint.resume_source(resume, point.run_dir, newest, peek)
    if point.source is not None:
        try:
            point.checkpoint = found.get(point.source) or resumable(point.source)
        except TinyGPTError as e:
            raise TinyGPTError(f"resume={resume}: {e}") from None
    return point


def model_from_checkpoint(ckpt: Checkpoint, dropout: float | None = None) -> nn.Module:
    """The plain model in a checkpoint; a LoRA finetune's adapters are folded in."""
    from gpt.model.lora import apply_lora, merge_lora

    config = dict(ckpt.model_config)
    if dropout is not None:
        config["dropout"] = dropout
    model = registry.build(registry.config_from_dict(config))
    if ckpt.lora:
        apply_lora(model, ckpt.lora["rank"], ckpt.lora["alpha"])
        _load_weights(model, ckpt)
        merge_lora(model)
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        _load_weights(model, ckpt)
    return model


def _load_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    try:
        model.load_state_dict(ckpt.model)
    except RuntimeError as e:
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e).splitlines()[0])
        raise TinyGPTError(
            f"the checkpoint's weights do not fit its own model settings ({detail}); it is damaged or was edited"
        ) from None
