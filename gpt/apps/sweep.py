"""A sweep's leaderboard (Markdown + CSV, sorted by best val loss) and val-curve plot:

    tinygpt sweep outputs/sweeps/<stamp>          # or: tinygpt sweep dir=outputs/sweeps/<stamp>

Written automatically when a multirun ends (LeaderboardCallback below, registered in
configs/hydra/default.yaml); this command writes them on demand, e.g. while a sweep still runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpt.apps import common
from gpt.config import SweepConfig
from gpt.leaderboard import write_leaderboard

try:  # the callback is only needed (and Hydra only importable) inside Hydra runs
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # One bare argument is the sweep folder: `tinygpt sweep outputs/sweeps/<stamp>`.
    if len(argv) == 1 and "=" not in argv[0] and not argv[0].startswith("-"):
        argv = [f"dir={argv[0]}"]
    common.run_command(argv, "sweep", "tinygpt sweep", __doc__, summarise, verbatim=("dir",))


def summarise(s: SweepConfig) -> list[dict]:
    rows = write_leaderboard(s.dir)
    print((Path(s.dir) / "leaderboard.md").read_text(), end="")
    print(f"wrote leaderboard.md, leaderboard.csv and val_curves.png ({len(rows)} runs) in {s.dir}")
    return rows


class LeaderboardCallback(Callback):
    """Writes the leaderboard when a multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        rows = write_leaderboard(config.hydra.sweep.dir)
        best = rows[0] if rows else None
        where = Path(config.hydra.sweep.dir) / "leaderboard.md"
        if best is not None and best["best_val_loss"] is not None:
            print(f"leaderboard: {where} (best: run {best['run']}, val {best['best_val_loss']:.4f}, {best['overrides']})")
