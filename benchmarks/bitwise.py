"""Record a run's every loss and a digest of its final weights and optimizer state, then compare
two records bit for bit: the check that a change of code changed no result.

    python benchmarks/bitwise.py record OUT.json [--resume-from RUN_DIR] [tinygpt overrides ...]
    python benchmarks/bitwise.py compare A.json B.json

`record` trains in this process through the public API (`gpt.train`) into a new run directory
(with --resume-from, into a copy of RUN_DIR, which it resumes), and writes every step's loss
and every eval's losses as exact float text (`float.hex`), and SHA-256 digests of the newest
checkpoint's weights and optimizer state. The overrides default to the quickstart at 300 steps
with threads=1 (results depend on the thread count, not on the machine's load). Another
checkout records the same way: `PYTHONPATH=<checkout> python benchmarks/bitwise.py record ...`
runs that checkout's tinygpt (only `gpt.train`, present in every version, is used).

`compare` prints the first difference and exits 1, or says they are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

QUICKSTART_300 = ["train.max_iters=300", "threads=1", "train.sample_tokens=0", "train.eval_sample_tokens=0"]


def digest(tree) -> str:
    """SHA-256 over a nested dict/list of tensors and plain values, keys in sorted order."""
    import torch

    h = hashlib.sha256()

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            for key in sorted(node, key=str):
                walk(node[key], f"{path}/{key}")
        elif isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                walk(item, f"{path}/{i}")
        elif isinstance(node, torch.Tensor):
            h.update(f"{path}:{node.dtype}:{tuple(node.shape)}".encode())
            h.update(node.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"{path}={node!r}".encode())

    walk(tree, "")
    return h.hexdigest()


def record(out: Path, overrides: list[str], resume_from: Path | None) -> None:
    import torch

    from gpt import train

    work = Path(tempfile.mkdtemp(prefix="bitwise-"))
    run_dir = work / "run"
    if resume_from is not None:
        shutil.copytree(resume_from, run_dir)
    losses, evals = {}, {}
    summary = train(
        [*overrides, f"paths.output_dir={run_dir}", "train.keep_last=100"],
        on_step=lambda step, loss: losses.__setitem__(step, float(loss).hex()),
        on_eval=lambda step, split: evals.__setitem__(step, {k: float(v).hex() for k, v in split.items()}),
    )
    newest = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))[-1]
    payload = torch.load(newest, map_location="cpu", weights_only=True)
    training = payload.get("training") or {}
    result = {
        "overrides": overrides,
        "resumed_from": str(resume_from) if resume_from else None,
        "steps": {str(k): v for k, v in sorted(losses.items())},
        "evals": {str(k): v for k, v in sorted(evals.items())},
        "best_val_loss": float(summary["best_val_loss"]).hex(),
        "checkpoint": newest.name,
        "weights": digest(payload["model"]),
        "optimizer_state": digest((training.get("optimizer") or {}).get("state", {})),
        "run_dir": str(run_dir),
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"{len(losses)} steps, {len(evals)} evals, best val {summary['best_val_loss']:.6f}; weights {result['weights'][:12]}")
    print(f"wrote {out} (the run: {run_dir})")


def compare(a: Path, b: Path) -> int:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    for key in ("steps", "evals", "best_val_loss", "checkpoint", "weights", "optimizer_state"):
        if x[key] != y[key]:
            if isinstance(x[key], dict):
                first = next((k for k in x[key] if x[key].get(k) != y[key].get(k)), None) or sorted(set(y[key]) - set(x[key]))[0]
                print(f"differ in {key} at {first}: {x[key].get(first)} vs {y[key].get(first)}")
            else:
                print(f"differ in {key}: {x[key]} vs {y[key]}")
            return 1
    print(f"bitwise equal: {len(x['steps'])} step losses, {len(x['evals'])} evals, weights and optimizer state")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--resume-from", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    args, rest = parser.parse_known_args()
    if args.verb == "record":
        record(args.out, rest or QUICKSTART_300, args.resume_from)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
