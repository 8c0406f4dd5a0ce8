"""Export a tinygpt checkpoint to a Hugging Face GPT-2 folder:

    python -m gpt.export run_dir=outputs/runs/<stamp> out=hf_model
    python -m gpt.export ckpt=path/to/best.pt out=hf_model
    python -m gpt.export out=hf_model [runs_dir=outputs]     # the newest run under runs_dir

Then `transformers.GPT2LMHeadModel.from_pretrained("hf_model")` loads it (LoRA adapters are
merged; GPT-2 BPE models also get vocab.json + merges.txt for GPT2Tokenizer).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from gpt import checkpoint
    from gpt.cli import fail, guard
    from gpt.errors import TinyGPTError
    from gpt.pretrained import export_hf, load_initial
    from gpt.tokenizer import tokenizer_from_dict

    if any(a in ("-h", "--help") for a in argv) or not argv:
        print(__doc__)
        return
    opts = dict(a.partition("=")[::2] for a in argv)
    unknown = set(opts) - {"run_dir", "ckpt", "out", "runs_dir"}
    if unknown:
        fail(f"unknown option(s) {', '.join(sorted(unknown))}; use run_dir=, ckpt=, runs_dir= and out=")

    def run():
        if not opts.get("out"):
            raise TinyGPTError("pass out=<folder> for the Hugging Face files")
        source = checkpoint.resolve(opts.get("ckpt"), opts.get("run_dir"), opts.get("runs_dir", checkpoint.RUNS_DIR))
        model, tokenizer_spec = load_initial(str(source), dropout=0.0)
        out = export_hf(model, tokenizer_from_dict(tokenizer_spec), opts["out"])
        print(f"exported {source} -> {out} (load with transformers.GPT2LMHeadModel.from_pretrained({str(out)!r}))")

    guard(run)


if __name__ == "__main__":
    main(sys.argv[1:])
