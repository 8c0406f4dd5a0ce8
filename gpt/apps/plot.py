"""Draw a run: its loss curves, or the attention maps its model computes for a prompt.

    tinygpt plot                                      # the newest run's curves -> <run>/curves.png
    tinygpt plot run_dir=outputs/runs/<stamp>         # a run's train/val loss and learning rate
    tinygpt plot run_dir=outputs/runs/<stamp> attention="ROMEO: But soft" layers=[0,3]   # -> <run>/attention.png

Curves come from the run's metrics.jsonl (while it trains too); attention maps from its best
checkpoint. Settings and defaults: gpt/config/commands.py (PlotConfig).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpt.apps import common
from gpt.config import PlotConfig
from gpt.errors import TinyGPTError


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    common.run_command(argv, "plot", "tinygpt plot", __doc__, plot, verbatim=("run_dir", "attention", "out"))


def plot(s: PlotConfig) -> Path:
    from gpt.checkpoints import runs
    from gpt.tracking import plots

    if s.attention == "":  # (taken verbatim, after the settings checked themselves)
        raise TinyGPTError("attention= needs a prompt, e.g. attention='ROMEO: But soft'")
    if s.attention is not None:
        from gpt.generation.text import utf8

        utf8(s.attention, "attention=")
    if s.run_dir:
        run_dir = Path(s.run_dir).expanduser()
        if run_dir.is_file():
            raise TinyGPTError(f"run_dir={run_dir} is a file; pass its run's folder")
        if not run_dir.is_dir():
            raise TinyGPTError(f"run directory {run_dir} does not exist; check the path, or omit run_dir for the newest run")
    else:
        run_dir = runs.latest_run(s.paths.runs_dir)
    if s.attention is None:
        out = plots.plot_curves(run_dir, Path(s.out).expanduser() if s.out else run_dir / "curves.png")
    else:
        out = _attention(run_dir, s)
    print(f"wrote {out}")
    return out


def _attention(run_dir: Path, s: PlotConfig) -> Path:
    import torch

    from gpt.checkpoints import loading
    from gpt.generation import encode_prompt
    from gpt.tracking import plots

    loaded = loading.load(str(run_dir), dropout=0.0)
    model, tokenizer = loaded.model.eval(), loaded.tokenizer()
    if not hasattr(model, "attention_maps"):
        raise TinyGPTError(f"{run_dir} holds a recurrent model: it has no attention to draw (plot its curves without attention=)")
    n_layer = model.config.n_layer
    layers = list(range(n_layer)) if s.layers is None else list(s.layers)
    bad = [i for i in layers if not 0 <= i < n_layer]
    if bad or not layers:
        raise TinyGPTError(f"layers={s.layers}: this model's layers are 0..{n_layer - 1}")
    ids = encode_prompt(tokenizer, s.attention, model.config.block_size)
    with torch.no_grad():
        maps = model.attention_maps(torch.tensor([ids]))
    tokens = [tokenizer.decode([i]) for i in ids]
    return plots.plot_attention(maps, tokens, Path(s.out).expanduser() if s.out else run_dir / "attention.png", layers)


if __name__ == "__main__":  # python -m gpt.apps.plot, as `tinygpt plot`
    main()
