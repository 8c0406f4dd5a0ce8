"""The CPU scaling study behind README "Scaling laws" and docs/scaling.md: the command a user
types, `tinygpt scaling preset=cpu check=true`, timed end to end, its figures printed as the
README shows them and its plots copied to docs/img/ (with --plots).

    python benchmarks/scaling.py [--out outputs/scaling/cpu] [--plots]

Run it with nothing else running: two torch processes on 2 cores distort every figure. A rerun
into the same --out reuses the finished jobs (then the wall time is not the study's).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/scaling/cpu")
    parser.add_argument("--plots", action="store_true", help="copy the plots to docs/img/scaling-*.png")
    args = parser.parse_args()
    out = Path(args.out).absolute()
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "gpt", "scaling", "preset=cpu", f"out={out}", "check=true"], cwd=REPO)
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"the study failed (exit status {proc.returncode}); see {out / 'report.md'}")
    fit = json.loads((out / "fit.json").read_text())
    pred, check, seconds = fit["prediction"], fit["check"], fit["seconds"]
    print(
        f"\nwall clock {wall / 60:.1f} min: jobs {seconds['jobs'] / 60:.1f} min, check {(seconds.get('check') or 0) / 60:.1f} min"
    )
    print(f"a = {fit['a']:.3f}, b = {fit['b']:.3f}, a + b = {fit['a'] + fit['b']:.3f}, loss exponent {fit['loss_exponent']:.4f}")
    print("| budget (FLOPs) | N_opt | D_opt (tokens) | L_opt |\n|---|---|---|---|")
    for o in fit["optima"]:
        print(f"| {o['budget']:.0e} | {o['params'] / 1e3:,.0f}k | {o['tokens'] / 1e6:.1f}M | {o['loss']:.3f} |")
    print(f"| {pred['budget']:.1e} predicted | {pred['params'] / 1e3:,.0f}k | {pred['tokens'] / 1e6:.1f}M | {pred['loss']:.3f} |")
    if check.get("loss") is not None:
        print(
            f"| {pred['budget']:.1e} measured: depth {check['depth']} | {check['params'] / 1e3:,.0f}k | "
            f"{check['tokens'] / 1e6:.1f}M | {check['loss']:.3f} |"
        )
    if args.plots:
        for name in ("isoflops.png", "frontier.png", "loss_vs_compute.png"):
            shutil.copyfile(out / name, REPO / "docs" / "img" / f"scaling-{name}")
        print("copied the plots to docs/img/")


if __name__ == "__main__":
    main()
