"""A sweep's leaderboard (Markdown + CSV, sorted by best val loss) and val-curve plot:

    tinygpt sweep outputs/sweeps/<stamp>          # or: tinygpt sweep dir=outputs/sweeps/<stamp>

Written automatically when a multirun ends (LeaderboardCallback below, registered in
configs/hydra/default.yaml); this command writes them on demand, e.g. while a sweep still runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from gpt.apps import common
from gpt.config import SweepConfig
from gpt.leaderboard import write_leaderboard
from gpt.tracking import logger


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
    """Keeps a multirun's leaderboard current: rewritten as each job ends (an interrupted or
    killed sweep still has one), and at the end a line on the best run and on any failures
    (then the exit status is 1)."""

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN or common.rank() != 0:
            return
        try:
            write_leaderboard(hydra_cfg.sweep.dir)
        except Exception as e:  # a plot or a full disk must not end the sweep
            logger.warning(f"could not write the leaderboard: {e}")

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = write_leaderboard(sweep_dir)
        best = next((r for r in rows if r["status"] == "finished" and r["best_val_loss"] is not None), None)
        if best is not None:
            print(
                f"leaderboard: {sweep_dir / 'leaderboard.md'} (best: run {best['run']}, val {best['best_val_loss']:.4f}, {best['overrides']})"
            )
        failed = sorted((r for r in rows if r["status"] == "failed"), key=lambda r: int(r["run"]))
        if failed:
            first = failed[0]
            print(
                f"error: {len(failed)} of {len(rows)} jobs failed (first: job {first['run']}: {first['error']}); "
                f"see {sweep_dir / 'leaderboard.md'}",
                file=sys.stderr,
            )
            sys.exit(1)


def search_space(config, trial) -> None:
    """Optuna's custom search space for tinygpt's search configs (hparams_search=...): the peak
    learning rates of the optimizer the run uses, drawn on a log scale from a quarter to four
    times their configured values, unless the search's own params name them; Muon's rate only
    when the run uses Muon (optim=adamw has none, and an experiment may pin AdamW). Centred on
    each recipe's values, and never below an absolute `optim.min_lr`, no draw is invalid.
    Under a grid sampler the grid alone decides."""
    import optuna

    if isinstance(trial.study.sampler, optuna.samplers.GridSampler):
        return
    optim = config.optim
    floor = optim.get("min_lr") or 0.0
    for key, base in (("optim.lr", optim.lr), ("optim.muon_lr", optim.get("muon_lr"))):
        if base is not None and key not in trial.params:
            low = max(base / 4, floor * base / optim.lr) if floor else base / 4
            trial.suggest_float(key, low, base * 4, log=True)
