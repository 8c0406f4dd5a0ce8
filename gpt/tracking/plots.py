"""Pictures of a run: its loss curves (from metrics.jsonl) and a model's attention maps; and the
two helpers every picture of tinygpt's goes through (a sweep's val curves, a scaling study's
plots): `pyplot()` (files only: matplotlib's Agg backend, no display) and `save()` (a PNG written
atomically). `tinygpt plot` draws the first two.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpt.errors import TinyGPTError
from gpt.runtime.io import atomic_write


def pyplot():
    """matplotlib's pyplot, drawing to files only (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_scale(ax, axis: str = "x") -> None:
    """`ax`'s x (or y) axis on a log scale, its ticks labelled in plain text (1e+10). matplotlib's
    default labels (10 to a power) are mathtext, whose fonts (STIX, Computer Modern) a font cache
    built by another matplotlib may lack: one `findfont` line per font on every plot otherwise."""
    from matplotlib import ticker

    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_formatter(ticker.LogFormatter())
    scale.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))  # labels minor ticks when a decade spans the axis


def save(fig, path: Path) -> Path:
    """`fig` laid out and written as a PNG at `path`, atomically (a reader never sees half a
    picture); the figure is closed."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        fig.savefig(f, format="png")
    pyplot().close(fig)
    return path


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The run's logged training steps and its evals, in order (a line cut short by a crash is
    skipped; a resumed run's records follow its first attempt's; no metrics.jsonl: none)."""
    train, evals = [], []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return train, evals
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "train":
            train.append(record)
        elif record.get("kind") == "eval":
            evals.append(record)
    return train, evals


def plot_curves(run_dir: Path, out: Path) -> Path:
    """The training loss at every logged step, train and val loss at every eval, and the learning
    rate on a second axis; the best val loss is marked."""
    if not (run_dir / "metrics.jsonl").is_file():
        raise TinyGPTError(f"{run_dir} has no metrics.jsonl: is it a run directory of tinygpt's?")
    train, evals = read_metrics(run_dir)
    if not train and not evals:
        raise TinyGPTError(f"{run_dir}/metrics.jsonl holds no training steps yet; plot it once the run has logged some")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if train:
        ax.plot([r["step"] for r in train], [r["loss"] for r in train], color="#9ab", lw=1, label="train loss (logged steps)")
    if evals:
        steps = [r["step"] for r in evals]
        ax.plot(steps, [r["train"] for r in evals], "o-", color="#1f77b4", ms=3, label="train loss (eval)")
        ax.plot(steps, [r["val"] for r in evals], "o-", color="#d62728", ms=3, label="val loss (eval)")
        best = min(evals, key=lambda r: r["val"])
        ax.annotate(
            f"best val {best['val']:.4f} (step {best['step']})",
            (best["step"], best["val"]),
            textcoords="offset points",
            xytext=(-10, 18),
            ha="right",
            arrowprops={"arrowstyle": "->", "color": "#555"},
            fontsize=8,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    if train:
        lr = ax.twinx()
        lr.plot([r["step"] for r in train], [r["lr"] for r in train], color="#2ca02c", lw=0.8, ls="--", label="learning rate")
        lr.set_ylabel("learning rate", color="#2ca02c")
        lr.tick_params(axis="y", colors="#2ca02c")
        lr.set_ylim(bottom=0)
        lines = ax.get_legend_handles_labels()[0] + lr.get_legend_handles_labels()[0]
        ax.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="upper right")
    else:
        ax.legend(fontsize=8)
    ax.set_title(f"{run_dir.name}: loss curves", fontsize=10)
    return save(fig, out)


def plot_attention(maps: list, tokens: list[str], out: Path, layers: list[int] | None = None) -> Path:
    """Attention maps (one (B, heads, T, T) tensor per layer, row 0 drawn): a grid of layers x
    heads, query positions down, key positions across, each cell the weight a query gives a key."""
    layers = list(range(len(maps))) if layers is None else layers
    heads = maps[0].size(1)
    plt = pyplot()
    size = max(2.2, min(4.0, 0.09 * len(tokens)))
    fig, axes = plt.subplots(len(layers), heads, figsize=(size * heads, size * len(layers)), dpi=110, squeeze=False)
    labels = [{"\n": "⏎", " ": "␣", "": "·"}.get(t, t) for t in tokens]
    for row, layer in enumerate(layers):
        for head in range(heads):
            ax = axes[row][head]
            ax.imshow(maps[layer][0, head].float().cpu().numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            if len(tokens) <= 48:  # the characters themselves, where they stay legible
                ax.set_xticks(range(len(tokens)), labels, fontsize=5, rotation=90)
                ax.set_yticks(range(len(tokens)), labels, fontsize=5)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
    fig.suptitle("attention weights: each row a query position, each column a key it attends to", fontsize=9)
    return save(fig, out)
