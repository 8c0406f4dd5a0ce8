"""A study's outputs: fit.json, report.md and three plots (isoflops.png: loss against size per
budget with the fitted parabolas and their minima; frontier.png: N_opt and D_opt against compute
with their power laws; loss_vs_compute.png: every run's loss against the FLOPs it spent, with
L_opt(C) and the prediction). Written atomically, so a report on disk is always a whole one."""

from __future__ import annotations

import json
import math
from pathlib import Path

from gpt.runtime import io
from gpt.scaling.fit import Point
from gpt.tracking.plots import log_scale, pyplot, save

PLOTS = ("isoflops.png", "frontier.png", "loss_vs_compute.png")


def write(out: Path, result: dict, points: list[Point], failed: dict, unfinished: dict, header: list[str]) -> None:
    """fit.json (the fit plus the runs, failures and check), the plots, then report.md."""
    record = {
        **result,
        "runs": [p.__dict__ for p in points],
        "failed": failed,
        "unfinished": unfinished,
    }
    io.write_bytes(out / "fit.json", (json.dumps(record, indent=2) + "\n").encode())
    _plot_isoflops(out / PLOTS[0], result, points)
    _plot_frontier(out / PLOTS[1], result)
    _plot_loss(out / PLOTS[2], result, points)
    io.write_bytes(out / "report.md", markdown(result, points, failed, unfinished, header).encode())


def markdown(result: dict, points: list[Point], failed: dict, unfinished: dict, header: list[str]) -> str:
    a, b, c = result["a"], result["b"], result["loss_exponent"]
    pred = result["prediction"]
    lines = [*header, ""]
    lines += [
        "## Fitted laws",
        "",
        f"- N_opt ∝ C^**{a:.3f}** (`a`), D_opt ∝ C^**{b:.3f}** (`b`); a + b = {a + b:.3f} (C ≈ 6ND makes it about 1)",
        f"- L_opt ∝ C^{c:.4f}",
    ]
    left_out = [o for o in result["optima"] if not o["in_fit"]]
    if left_out:
        every = result["all_vertices"]
        lines.append(
            f"- through the vertices inside their ladders only ({len(result['optima']) - len(left_out)} of "
            f"{len(result['optima'])}); through every vertex: a = {every['a']:.3f}, b = {every['b']:.3f}, "
            f"L_opt ∝ C^{every['loss_exponent']:.4f}"
        )
    elif not all(o["inside"] for o in result["optima"]):
        lines.append("- through every vertex, extrapolated ones included (fewer than 2 lie inside their ladders)")
    lines += [
        "",
        "## Compute-optimal model per budget",
        "",
        "| budget (FLOPs) | N_opt | D_opt (tokens) | D/N | L_opt | vertex |",
        "|---|---|---|---|---|---|",
    ]
    for o in result["optima"]:
        where = "inside the ladder" if o["inside"] else "**outside the ladder (extrapolated)**"
        if not o["in_fit"]:
            where += ", left out of the laws"
        lines.append(
            f"| {o['budget']:.3g} | {o['params']:,.0f} | {o['tokens']:,.0f} | {o['tokens'] / o['params']:.1f} | {o['loss']:.4f} | {where} |"
        )
    for budget, reason in result["skipped"].items():
        lines.append(f"| {budget} | not fitted: {reason} | | | | |")
    lines += [
        "",
        f"## Prediction for {pred['budget']:.3g} FLOPs",
        "",
        f"N_opt = {pred['params']:,.0f} parameters, D_opt = {pred['tokens']:,.0f} tokens, L_opt = {pred['loss']:.4f}.",
    ]
    check = result.get("check")
    if check:
        lines.append("")
        if check.get("loss") is None:
            lines.append(f"Check: the run at depth {check['depth']} did not finish ({check.get('status')}); see {check['run']}.")
        else:
            lines.append(
                f"Check: depth {check['depth']} ({check['params']:,} parameters, the nearest size to N_opt) trained on "
                f"{check['flops']:.3g} FLOPs ({check['tokens']:,} tokens): measured val loss **{check['loss']:.4f}** vs predicted "
                f"**{pred['loss']:.4f}** ({100 * (check['loss'] - pred['loss']) / pred['loss']:+.2f}%)."
            )
    lines += ["", *(f"![{name}]({name})" for name in PLOTS), "", "## Runs", ""]
    lines += ["| budget | depth | N | D (tokens) | FLOPs spent | val loss | run |", "|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p.budget, p.params)):
        lines.append(f"| {p.budget:.3g} | {p.depth} | {p.params:,} | {p.tokens:,} | {p.flops:.3g} | {p.loss:.4f} | `{p.run}` |")
    if failed or unfinished:
        lines += ["", "## Jobs left out of the fit", ""]
        lines += [f"- `{name}`: failed: {' '.join(str(e).split())}" for name, e in failed.items()]
        lines += [f"- `{name}`: {status} (rerun the study to finish it)" for name, status in unfinished.items()]
    return "\n".join(lines) + "\n"


def _figure(path: Path, draw, size=(7, 5)) -> None:
    fig = pyplot().figure(figsize=size, dpi=100)
    draw(fig)
    save(fig, path)


def _finish(ax, xlabel: str, ylabel: str, title: str | None = None) -> None:
    """Every plot's axes: compute and sizes on a log scale, a light grid, the legend."""
    log_scale(ax, "x")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _colours(n: int):
    import matplotlib

    cmap = matplotlib.colormaps["viridis"]
    return [cmap(i / max(1, n - 1) * 0.85) for i in range(n)]


def _plot_isoflops(path: Path, result: dict, points: list[Point]) -> None:
    import numpy as np

    budgets = sorted({p.budget for p in points})
    optima = {o["budget"]: o for o in result["optima"]}

    def draw(fig):
        ax = fig.add_subplot(1, 1, 1)
        for colour, budget in zip(_colours(len(budgets)), budgets):
            mine = sorted((p for p in points if p.budget == budget), key=lambda p: p.params)
            ax.plot([p.params for p in mine], [p.loss for p in mine], "o", color=colour, label=f"C = {budget:.2g}")
            o = optima.get(budget)
            if o is not None:
                p2, p1, p0 = o["coefficients"]
                lo, hi = math.log(mine[0].params), math.log(mine[-1].params)
                lo, hi = min(lo, math.log(o["params"])), max(hi, math.log(o["params"]))
                x = np.linspace(lo - 0.2, hi + 0.2, 100)
                ax.plot(np.exp(x), p2 * x * x + p1 * x + p0, "-", color=colour, alpha=0.7)
                ax.plot([o["params"]], [o["loss"]], "*", color=colour, markersize=14, markeredgecolor="black")
        _finish(ax, "parameters N (without embeddings)", "final val loss", "IsoFLOP curves (star: each budget's fitted minimum)")

    _figure(path, draw)


def _plot_frontier(path: Path, result: dict) -> None:
    import numpy as np

    optima, pred, laws = result["optima"], result["prediction"], result["laws"]

    def draw(fig):
        c = np.geomspace(min(o["budget"] for o in optima) / 1.5, pred["budget"] * 1.5, 50)
        for i, (key, label, exp_name) in enumerate((("params", "N_opt (parameters)", "a"), ("tokens", "D_opt (tokens)", "b"))):
            ax = fig.add_subplot(1, 2, i + 1)
            law = laws[key]
            used = [o for o in optima if o["in_fit"]]
            out = [o for o in optima if not o["in_fit"]]
            ax.plot([o["budget"] for o in used], [o[key] for o in used], "o", color="C0", label="per-budget optimum")
            if out:
                ax.plot(
                    [o["budget"] for o in out],
                    [o[key] for o in out],
                    "o",
                    mfc="none",
                    color="C0",
                    label="outside its ladder (not fitted)",
                )
            ax.plot(
                c,
                law["coefficient"] * c ** law["exponent"],
                "-",
                color="C0",
                alpha=0.6,
                label=f"fit: {exp_name} = {law['exponent']:.3f}",
            )
            ax.plot([pred["budget"]], [pred[key]], "*", color="C3", markersize=14, label=f"prediction at {pred['budget']:.2g}")
            log_scale(ax, "y")
            _finish(ax, "compute C (training FLOPs)", label)

    _figure(path, draw, size=(11, 4.5))


def _plot_loss(path: Path, result: dict, points: list[Point]) -> None:
    import numpy as np

    optima, pred, law = result["optima"], result["prediction"], result["laws"]["loss"]
    depths = sorted({p.depth for p in points})

    def draw(fig):
        ax = fig.add_subplot(1, 1, 1)
        for colour, depth in zip(_colours(len(depths)), depths):
            mine = sorted((p for p in points if p.depth == depth), key=lambda p: p.flops)
            ax.plot([p.flops for p in mine], [p.loss for p in mine], "o-", color=colour, alpha=0.8, label=f"depth {depth}")
        c = np.geomspace(min(o["budget"] for o in optima) / 1.5, pred["budget"] * 1.5, 50)
        ax.plot(c, law["coefficient"] * c ** law["exponent"], "--", color="black", label="L_opt(C) fit")
        ax.plot([pred["budget"]], [pred["loss"]], "*", color="C3", markersize=14, label="predicted")
        check = result.get("check") or {}
        if check.get("loss") is not None:
            ax.plot([check["flops"]], [check["loss"]], "X", color="C1", markersize=11, label=f"measured (depth {check['depth']})")
        _finish(ax, "compute C (training FLOPs spent)", "final val loss", "Loss against compute")

    _figure(path, draw)
