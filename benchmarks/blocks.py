"""What each block option buys at the quickstart's budget: GPT-2's block, each option alone and
combined, and the quickstart as it is, side by side in one run (alternated), to val <= --target and to the end.

    python benchmarks/blocks.py [--repeats 2] [--target 1.89] [--only gpt2,quickstart ...] [train.py overrides ...]

Each variant is the whole `python train.py` (the quickstart: 2000 steps, Muon + AdamW) with its
options, run to the end with evals every 125 steps instead of 250 (to place the target more
finely; each eval still averages 50 batches); the variants take turns, --repeats rounds. From
each run's metrics.jsonl: `elapsed_s` of the first eval at or below --target (the run's own
clock: from the start of the process's set-up, evals included), that step, the step where the val curve crosses --target (linear between the two evals
around it: a finer figure than the eval grid), the val at the end,
and the median ms/step of its logged steps. Medians over the rounds. Run it with nothing else
running: two torch processes on 2 cores distort every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Every variant starts from GPT-2's block at the quickstart's shape (model=gpt-micro) and changes
# what its name says; "quickstart" is `python train.py` as it is (model=gpt-micro-modern).
GPT2 = ["model=gpt-micro"]
MODERN = ["model.norm=rmsnorm", "model.pos_encoding=rope", "model.qk_norm=true", "model.bias=false"]
VARIANTS = {
    "gpt2": GPT2,
    "rmsnorm": [*GPT2, "model.norm=rmsnorm"],
    "swiglu": [*GPT2, "model.mlp=swiglu", "model.mlp_hidden=384"],
    "relu2": [*GPT2, "model.mlp=relu2"],
    "qk_norm": [*GPT2, "model.qk_norm=true"],
    "untied": [*GPT2, "model.tie_embeddings=false"],
    "no_bias": [*GPT2, "model.bias=false"],
    "softcap": [*GPT2, "model.logit_softcap=15.0"],
    "rope": [*GPT2, "model.pos_encoding=rope"],
    "llama": ["model=llama-nano"],  # rmsnorm + swiglu 384 + rope + no bias + untied head
    "rope_qk_norm": [*GPT2, "model.pos_encoding=rope", "model.qk_norm=true"],
    # rmsnorm + rope + qk-norm + no bias, GPT-2's GELU MLP and tied head: the quickstart's block
    "gelu_modern": [*GPT2, *MODERN],
    "gelu_modern_untied": [*GPT2, *MODERN, "model.tie_embeddings=false"],
    # modded-nanogpt / nanochat's choices: the same with relu2 and soft-capped logits
    "modern": [*GPT2, *MODERN, "model.mlp=relu2", "model.logit_softcap=15.0"],
    "modern_untied": [*GPT2, *MODERN, "model.mlp=relu2", "model.logit_softcap=15.0", "model.tie_embeddings=false"],
    "quickstart": [],
}


def run(name: str, overrides: list[str], work: Path, target: float) -> dict:
    run_dir = work / f"{name}-{time.time_ns()}"
    cmd = [sys.executable, str(REPO / "train.py"), *VARIANTS[name], *overrides]
    cmd += ["train.eval_interval=125", "train.sample_tokens=0", "train.eval_sample_tokens=0", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["kind"] == "eval"]
    reached = next((r for r in evals if r["val"] <= target), None)
    crossed = None
    if reached is not None and reached is not evals[0]:
        before = evals[evals.index(reached) - 1]
        crossed = before["step"] + (before["val"] - target) / (before["val"] - reached["val"]) * (
            reached["step"] - before["step"]
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "seconds": reached["elapsed_s"] if reached else float("nan"),
        "step": reached["step"] if reached else None,
        "crossed": crossed if crossed is not None else float("nan"),
        "final": evals[-1]["val"],
        "best": summary["best_val_loss"],
        "ms": statistics.median(r["ms_per_step"] for r in rows if r["kind"] == "train"),
        "wall": summary["elapsed_s"],
        "params": summary["params"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--target", type=float, default=1.89)
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()  # overrides before or after the options
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    work = Path(tempfile.mkdtemp(prefix="tinygpt-blocks-"))
    results: dict[str, list[dict]] = {n: [] for n in names}
    for round_ in range(args.repeats):
        for name in names:
            r = run(name, args.overrides, work, args.target)
            results[name].append(r)
            print(
                f"round {round_ + 1} {name:>14}: val <= {args.target} at {r['seconds']:6.1f} s (step {r['step']}, crossed at {r['crossed']:.0f}), "
                f"final {r['final']:.4f}, {r['ms']:.1f} ms/step, {r['params']:,} params, {r['wall']:.0f} s in all",
                flush=True,
            )
    print(f"\nmedians over {args.repeats} round(s), alternated (time: the run's elapsed_s at the first eval <= {args.target}):")
    base = statistics.median(r["seconds"] for r in results[names[0]])
    print(
        f"| variant | params | ms/step | time to val <= {args.target:.2f} | step | crossed at | val at step 2000 | vs {names[0]} |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rs in results.items():
        t = statistics.median(r["seconds"] for r in rs)
        steps = sorted(r["step"] for r in rs if r["step"] is not None)
        print(
            f"| {name} | {rs[0]['params']:,} | {statistics.median(r['ms'] for r in rs):.1f} | {t:.1f} s | "
            f"{steps[len(steps) // 2] if steps else '-'} | {statistics.median(r['crossed'] for r in rs):.0f} | {statistics.median(r['final'] for r in rs):.4f} | {base / t:.2f}x |"
        )


if __name__ == "__main__":
    main()
