"""One way to get a model and its tokenizer from what a user names: a tinygpt checkpoint file,
a run directory (its best.pt), a Hugging Face model (GPT-2, Llama, Qwen: Hub name or folder), or nothing (the
newest run under the runs folder). Used by sampling, evaluation, export and finetuning.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from gpt.checkpoints import checkpoint, runs
from gpt.checkpoints.checkpoint import Checkpoint
from gpt.config import PathsSettings
from gpt.errors import TinyGPTError
from gpt.model import meta, registry
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
    path = runs.resolve(ckpt, run_dir, runs_dir or PathsSettings().runs_dir)
    # A run directory, not its best.pt: `load` falls back to another of its checkpoints if that is damaged.
    return str(path if ckpt else path.parent.parent)


def _no_such_model(what: str, source: str) -> TinyGPTError:
    from gpt import interop

    return TinyGPTError(
        f"{what}={source} is not a Hugging Face model (a Hub name such as {', '.join(interop.HUB_MODELS)} or "
        f"owner/name, or a folder with config.json), a tinygpt run directory or a checkpoint file"
    )


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
        raise _no_such_model(what, source)
    if not path.is_dir():
        checkpoint.load(path, mmap=True)
        return
    runs.checkpoint_in_run(path)  # refuses a directory without checkpoints
    reasons = []
    for candidate in runs.candidates_in_run(path):
        try:
            checkpoint.load(candidate, mmap=True)
            return
        except TinyGPTError as e:
            reasons.append(str(e))
    raise TinyGPTError(f"{what}={source}: no checkpoint of that run loads ({reasons[0]})")


def load(source: str, dropout: float | None = None, log=None, mapped: bool = False) -> Loaded:
    """A Hugging Face model (Hub name or folder with config.json), a tinygpt checkpoint, or a run
    directory (its best.pt, else its newest step checkpoint; a damaged one is skipped with a
    notice through `log`, stderr by default). `dropout` replaces the model's.

    `mapped`: the model's weights are the file's own tensors, mapped and not read (safetensors
    and torch.load(mmap=True) map copy-on-write: writing one changes this process's copy, never
    the file), in the file's dtype (a bf16 folder gives bf16 weights), built with no values of
    its own first: what a process that only passes the weights on needs (an FSDP2 start's rank 0,
    which sends them tensor by tensor). A sharded checkpoint's weights are read whole either way.
    Without it, a float32 model of private memory."""
    from gpt import interop

    log = log or (lambda message: print(message, file=sys.stderr))

    if interop.is_hf_source(source):
        model, tokenizer = interop.load(source, dropout or 0.0, mapped)
        if tokenizer is None:
            raise TinyGPTError(
                f"{source} has a vocabulary of {model.config.vocab_size} and no tokenizer files (tokenizer.json, or "
                f"tinygpt_tokenizer.json); put the model's tokenizer.json beside its config.json"
            )
        return Loaded(model.eval(), tokenizer, source)
    path = Path(source).expanduser()
    if not path.exists():
        raise _no_such_model("init_from", source)
    if not path.is_dir():
        ckpt, model = _load_file(path, dropout, mapped)
        return Loaded(model.eval(), ckpt.tokenizer, str(path), ckpt)
    runs.checkpoint_in_run(path)  # refuses a directory without checkpoints
    refused = []
    for candidate in runs.candidates_in_run(path):
        try:
            ckpt, model = _load_file(candidate, dropout, mapped)
        except TinyGPTError as e:
            refused.append(str(e))
            continue
        for reason in refused:  # the damaged file stays where it is: readers do not rearrange a run
            log(f"notice: {reason}; using {candidate.name} instead")
        return Loaded(model.eval(), ckpt.tokenizer, str(candidate), ckpt)
    raise TinyGPTError(f"no checkpoint of {path} loads ({refused[0]}); pass ckpt=<a checkpoint that loads>")


def _load_file(path: Path, dropout: float | None, mapped: bool = False) -> tuple[Checkpoint, nn.Module]:
    ckpt = checkpoint.load(path, training=False)  # the weights; the optimizer state is a resume's
    try:
        return ckpt, model_from_checkpoint(ckpt, dropout, mapped)
    except TinyGPTError as e:
        raise TinyGPTError(f"{path}: {e}") from None


def model_from_checkpoint(ckpt: Checkpoint, dropout: float | None = None, mapped: bool = False) -> nn.Module:
    """The plain model in a checkpoint; a LoRA finetune's adapters are folded in. A sharded
    checkpoint loaded without its tensors (placeholders: checkpoint.load(mmap=True)) gives a model
    on the meta device: its shapes checked against the checkpoint's, no values. `mapped`: the
    checkpoint's tensors themselves are the weights (see `load`)."""
    from gpt.model.lora import apply_lora, merge_lora

    config = dict(ckpt.model_config)
    if dropout is not None:
        config["dropout"] = dropout
    # built on the meta device: no initial values computed (or random numbers drawn) to be overwritten
    shapes_only = any(t.is_meta for t in ckpt.model.values())
    with meta.building():
        model = registry.build(registry.config_from_dict(config))
        if ckpt.lora:
            apply_lora(model, ckpt.lora["rank"], ckpt.lora["alpha"])
    _load_weights(model, ckpt, copy=not (mapped or shapes_only))
    if ckpt.lora:
        with meta.building() if shapes_only else contextlib.nullcontext():
            merge_lora(model)
        for p in model.parameters():
            p.requires_grad_(True)
    return model


def _load_weights(model: nn.Module, ckpt: Checkpoint, copy: bool) -> None:
    """The checkpoint's weights as `model`'s (built on the meta device): copies, or the tensors themselves."""
    try:
        meta.adopt(model, ckpt.model, copy=copy)
    except RuntimeError as e:
        detail = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e).splitlines()[0])
        raise TinyGPTError(
            f"the checkpoint's weights do not fit its own model settings ({detail}); it is damaged or was edited"
        ) from None
