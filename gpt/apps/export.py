"""Export a checkpoint to a Hugging Face folder: GPT-2's format for GPT-2's block, Llama's (or
Qwen2's / Qwen3's) for the Llama block, and for any other block (the quickstart's) tinygpt's own,
whose modeling code travels in the folder:

    tinygpt export run_dir=outputs/runs/<stamp> out=hf_model
    tinygpt export ckpt=path/to/best.pt out=hf_model
    tinygpt export out=hf_model                 # the newest run under paths.runs_dir
    tinygpt export init_from=<HF folder> out=hf_model   # an imported model, written again
    tinygpt export format=gguf quant=q8_0 out=model.gguf  # one file for llama.cpp / Ollama / LM Studio

Then `transformers.AutoModelForCausalLM.from_pretrained("hf_model")` loads it (with
`trust_remote_code=True` for tinygpt's own form; LoRA adapters are merged), and
`AutoTokenizer.from_pretrained("hf_model")` its tokenizer (char, byte, GPT-2's BPE, a trained BPE
or a Hugging Face tokenizer; with the chat template of a model finetuned on conversations).
format=gguf writes llama.cpp's format instead (gpt/interop/gguf.py: GPT-2's and the Llama
family's blocks; others are refused, naming the presets that export).
Settings and defaults: gpt/config/commands.py (ExportConfig).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpt.apps import common
from gpt.config import ExportConfig
from gpt.errors import TinyGPTError


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    common.run_command(argv, "export", "tinygpt export", __doc__, export, verbatim=("run_dir", "ckpt", "init_from", "out"))


def export(s: ExportConfig) -> Path:
    from gpt import interop
    from gpt.checkpoints import loading
    from gpt.interop import tinygpt

    if s.format == "gguf":
        return _export_gguf(s)
    interop.check_out(Path(s.out))  # before the checkpoint is read
    loaded = loading.load(loading.choose(s.ckpt, s.run_dir, s.init_from, s.paths.runs_dir), dropout=0.0)
    try:
        out, cls = interop.export(loaded.model, loaded.tokenizer(), s.out)
    except OSError as e:
        raise TinyGPTError(f"cannot write to {s.out} ({e.strerror or e}); pass out=<a folder you can write>") from None
    remote = ", trust_remote_code=True" if cls == tinygpt.CLASS else ""  # its modeling code is in the folder
    print(
        f"exported {loaded.source} -> {out} ({cls}: load with "
        f"transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}{remote}))"
    )
    return out


def _export_gguf(s: ExportConfig) -> Path:
    from gpt.checkpoints import loading
    from gpt.interop import gguf

    gguf.check_out(Path(s.out).expanduser().absolute())  # before the checkpoint is read
    loaded = loading.load(loading.choose(s.ckpt, s.run_dir, s.init_from, s.paths.runs_dir), dropout=0.0)
    gguf.architecture(loaded.model.config)  # a block llama.cpp has no architecture for: refused before anything is written
    out, arch = gguf.export(loaded.model, loaded.tokenizer(), s.out, s.quant or "f32")
    approx = " (llama.cpp's gpt2 computes GELU's tanh approximation; this model's exact GELU differs by ~1e-3)"
    note = approx if arch == "gpt2" and loaded.model.config.activation == "gelu" else ""
    print(f"exported {loaded.source} -> {out} (GGUF {arch}, {s.quant or 'f32'}: llama-cli -m {out}){note}")
    return out


if __name__ == "__main__":  # python -m gpt.apps.export, as `tinygpt export`
    main()
