"""Whole commands: `python sample.py` against a script calling transformers' `generate`, each a
fresh process, on the same exported folder.

    python benchmarks/sample_commands.py                        # GPT-2 124M shape, 256 tokens, 3 pairs
    python benchmarks/sample_commands.py --modes eager compiled --repeats 5 --new-tokens 256

The model: the GPT-2 124M shape with random weights (seeded; speed does not depend on them),
exported once by `gpt.interop.export` to a Hugging Face folder (GPT2LMHeadModel), which both sides
load. One prompt, batch 1, greedy, end-of-text ignored (random weights would stop anywhere), fp32
on the CPU. Each timing is a whole process from launch to exit: imports, loading, any compiling,
the prompt and every new token. `compiled` is `sample.py compile=true` with this machine's
inductor cache as earlier runs left it (a warm cache after the first run: --cold empties it for
every run instead, in a temporary TORCHINDUCTOR_CACHE_DIR). The modes are alternated within each
round; figures are medians over --repeats rounds, with the ratio transformers / tinygpt (higher is
faster). Greedy ids are compared: transformers' text against sample.py's for each mode.

Needs GPT-2's BPE offline (TIKTOKEN_CACHE_DIR seeded as ../shared/data/README.md says). Run it
with nothing else running: two torch processes on 2 cores distort every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPT = "The meaning of life is"

HF_SCRIPT = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, new = sys.argv[1], int(sys.argv[2])
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
ids = tok(sys.argv[3], return_tensors="pt").input_ids
with torch.inference_mode():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                         eos_token_id=None, pad_token_id=0, min_new_tokens=new)
sys.stdout.write(tok.decode(out[0, ids.size(1):]))
"""


def export_folder(folder: Path) -> None:
    import torch

    from gpt.apps.common import compose
    from gpt.interop import export
    from gpt.model import GPT, registry
    from gpt.tokenizers.tiktoken import TiktokenTokenizer

    settings = compose("config", ["model=gpt2", "model.dropout=0.0"]).model
    tokenizer = TiktokenTokenizer("gpt2")
    torch.manual_seed(0)
    export(GPT(registry.with_vocab(settings, tokenizer.vocab_size)).eval(), tokenizer, str(folder))


def run(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def sample_cmd(folder: Path, new: int, mode: str) -> list[str]:
    return [
        sys.executable,
        "sample.py",
        f"init_from={folder}",
        f"prompt={PROMPT}",
        f"max_new_tokens={new}",
        "temperature=0",
        "num_samples=1",
        "stop_at_eot=false",
        "device=cpu",
        f"compile={'true' if mode == 'compiled' else 'false'}",
    ]


def generated(stdout: str) -> str:
    """sample.py's text after its header line and the prompt."""
    body = stdout.split("----------\n", 1)[1]
    return body[len(PROMPT) :].rstrip("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="an empty inductor cache for every compiled run")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryDirectory(prefix="tinygpt-sample-commands-") as tmp:
        folder = Path(tmp) / "gpt2-shape"
        export_folder(folder)
        times: dict[str, list[float]] = {m: [] for m in [*args.modes, "transformers"]}
        texts: dict[str, str] = {}
        for r in range(args.repeats):
            for mode in args.modes:
                run_env = env
                if mode == "compiled" and args.cold:
                    run_env = {**env, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=tmp)}
                seconds, out = run(sample_cmd(folder, args.new_tokens, mode), run_env)
                times[mode].append(seconds)
                texts[mode] = generated(out)
            seconds, out = run([sys.executable, "-c", HF_SCRIPT, str(folder), str(args.new_tokens), PROMPT], env)
            times["transformers"].append(seconds)
            texts["transformers"] = out.rstrip("\n")
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()), flush=True)
        hf = statistics.median(times["transformers"])
        print(f"GPT-2 124M shape, batch 1, greedy, {args.new_tokens} new tokens, whole processes, medians of {args.repeats}:")
        print(f"  transformers generate  {hf:6.1f} s")
        for mode in args.modes:
            t = statistics.median(times[mode])
            same = "equal" if texts[mode] == texts["transformers"] else "DIFFERENT"
            print(f"  sample.py {mode:<12} {t:6.1f} s  {hf / t:.2f}x transformers; greedy text {same}")


if __name__ == "__main__":
    main()
