"""Models in and out of Hugging Face's formats, one module per family over shared plumbing:

    hf.py      the folder (local, or a Hub repository via the local cache), config.json, weights
               (safetensors, shards, or a weights-only pickle), tokenizer files
    gpt2.py    GPT2LMHeadModel
    llama.py   LlamaForCausalLM, and its relatives Qwen2ForCausalLM and Qwen3ForCausalLM
    tinygpt.py any other block: the export carries its modeling code (modeling_tinygpt.py,
               loaded with trust_remote_code=True)
    gguf.py    llama.cpp's one-file format, out only (`tinygpt export format=gguf`)

A family module offers `check(folder, config)` (refuses what it cannot compute, weights
unread), `load(folder, config, dropout, mapped) -> (GPT, tokenizer dict | None)` (`mapped`: the
weights left in the file's mapped pages, see gpt.checkpoints.loading.load),
`cannot_export(model_config) -> reason | None` and `export(model, tokenizer, out)`; a fourth
family is one more module and one more line in FAMILIES.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

from gpt.errors import TinyGPTError
from gpt.interop import gpt2, hf, llama, tinygpt

# config.json's model_type -> the module that reads it
FAMILIES = {"gpt2": gpt2, "llama": llama, "qwen2": llama, "qwen3": llama, "tinygpt": tinygpt}
HUB_MODELS = gpt2.HUB_MODELS  # the bare names that mean a Hub model (owner/name ones need no list)


def is_hf_source(source: str) -> bool:
    """A Hub model (gpt2, ..., or owner/name), or a folder holding a Hugging Face config.json."""
    return source in HUB_MODELS or (Path(source).expanduser() / "config.json").is_file() or hf.is_hub_id(source)


def check(source: str) -> None:
    """Refuse, before anything is written, a local folder whose config.json no family reads or
    whose model computes what tinygpt cannot (its weights are not read; a Hub name is checked
    when it is downloaded)."""
    folder = Path(source).expanduser()
    if not (folder / "config.json").is_file():
        return
    config = hf.read_config(folder)
    family = FAMILIES.get(config.get("model_type"))
    if family is None:
        raise TinyGPTError(
            f"{folder} holds a {config.get('model_type')!r} model; tinygpt loads {', '.join(FAMILIES)} (config.json's model_type)"
        )
    try:
        family.check(folder, config)
    except (KeyError, TypeError, ValueError) as e:  # a field missing or of the wrong kind
        raise TinyGPTError(
            f"{folder / 'config.json'} is not a {config['model_type']} config ({type(e).__name__}: {e}); download the model again"
        ) from None


def load(source: str, dropout: float = 0.0, mapped: bool = False):
    """(GPT, tokenizer dict | None) of a Hugging Face model: a Hub name or a local folder.
    `mapped`: see gpt.checkpoints.loading.load."""
    folder = hf.resolve_dir(source, HUB_MODELS)
    check(str(folder))
    config = hf.read_config(folder)
    return FAMILIES[config.get("model_type")].load(folder, config, dropout, mapped)


def export(model, tokenizer, out_dir: str | Path) -> tuple[Path, str]:
    """Write `model` as the Hugging Face folder of the first family that computes it exactly
    (GPT-2's block: GPT2LMHeadModel; Llama's: LlamaForCausalLM, Qwen2 or Qwen3; any other block:
    tinygpt's own, whose modeling code travels with it); returns the folder and the transformers
    class that loads it. A recurrent model is refused, saying so."""
    reason = tinygpt.cannot_export(model.config)
    if reason is not None:
        raise TinyGPTError(f"this model cannot be exported to a Hugging Face folder: {reason}")
    out = Path(out_dir).expanduser().absolute()
    check_out(out)
    # Written whole beside `out`, then put in its place (an earlier export's files all go: a chat
    # model's generation_config.json must not stay beside a plain model's weights).
    _remove_leftovers(out)
    staging = out.parent / f".{out.name}.exporting-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if gpt2.cannot_export(model.config) is None:
            gpt2.export(model, tokenizer, staging)
            cls = "GPT2LMHeadModel"
        elif llama.cannot_export(model.config) is None:
            cls = llama.export(model, tokenizer, staging)
        else:
            cls = tinygpt.export(model, tokenizer, staging)
        earlier = out.parent / f".{out.name}.replaced-{os.getpid()}"
        if out.exists():
            out.rename(earlier)
        staging.rename(out)
        shutil.rmtree(earlier, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out, cls


def _remove_leftovers(out: Path) -> None:
    """What an export to `out` that was killed (its process gone) left: its half-written folder
    goes; the earlier export it had moved aside, killed before its own took the place, comes back
    (this export then replaces it as usual). Another export still running keeps its own."""
    for path in sorted(out.parent.glob(f".{glob.escape(out.name)}.*-*")):  # out's own: hf_? names no other
        kind, _, pid = path.name[len(out.name) + 2 :].rpartition("-")
        if kind not in ("exporting", "replaced") or not pid.isdigit() or _alive(int(pid)):
            continue
        if kind == "replaced" and not out.exists():
            path.rename(out)
        else:
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


# Every file an export writes (each family some of them): a folder holding only these, its
# tokenizer record among them, is an earlier export, which a new one replaces.
EXPORT_FILES = frozenset(
    {"config.json", "generation_config.json", "model.safetensors", "vocab.json", "merges.txt", f"{tinygpt.MODULE}.py"}
    | set(hf.TOKENIZER_FILES)
)


def check_out(out: Path) -> None:
    """Where an export may go: a new or empty folder, or an earlier export (replaced whole);
    never over a folder of other files, which it would overwrite in part."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise TinyGPTError(f"out={out} is a file; name a folder for the Hugging Face files")
    try:
        held = {p.name for p in out.iterdir()} if out.is_dir() else set()
    except OSError as e:
        raise TinyGPTError(f"cannot read out={out} ({e.strerror or e}); pass out=<a folder you can write>") from None
    if held and not (hf.TOKENIZER_RECORD in held and held <= EXPORT_FILES):
        others = sorted(held - EXPORT_FILES) or sorted(held)
        raise TinyGPTError(
            f"out={out} holds files that are not an earlier export's ({', '.join(others[:4])}"
            f"{', ...' if len(others) > 4 else ''}); name a new or empty folder (an earlier export is replaced)"
        )
