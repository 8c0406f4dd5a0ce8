"""A sweep's leaderboard (Markdown + CSV, sorted by best val loss unless told) and val-curve plot:

    tinygpt sweep outputs/sweeps/<stamp>          # or: tinygpt sweep dir=outputs/sweeps/<stamp>
    tinygpt sweep outputs/sweeps/<stamp> rank_by=hellaswag/acc_norm   # by a train.eval_tasks figure

Written automatically when a multirun ends (LeaderboardCallback below, registered in
configs/hydra/default.yaml); this command writes them on demand, e.g. while a sweep still runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from gpt.apps import common
from gpt.config import SweepConfig
from gpt.errors import TinyGPTError
from gpt.tracking import logger
from gpt.tracking.leaderboard import run_order, write_leaderboard


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A bare first argument is the sweep folder: `tinygpt sweep outputs/sweeps/<stamp> [rank_by=...]`.
    if argv and "=" not in argv[0] and not argv[0].startswith("-"):
        argv = [f"dir={argv[0]}", *argv[1:]]
    common.run_command(argv, "sweep", "tinygpt sweep", __doc__, summarise, verbatim=("dir",))


def summarise(s: SweepConfig) -> list[dict]:
    rows = write_leaderboard(s.dir, s.rank_by)
    print((Path(s.dir) / "leaderboard.md").read_text(), end="")
    print(f"wrote leaderboard.md, leaderboard.csv and val_curves.png ({len(rows)} runs) in {s.dir}")
    return rows


# The failed jobs of the multirun in this process, by job number: filled by the train command's
# jobs and by the callback below, read at the sweep's end. (Launchers that run jobs elsewhere,
# e.g. SLURM, leave both empty: then the jobs' summaries tell.)
FAILED: dict[int, str] = {}
ENDED: set[int] = set()  # the job numbers that ended, failed or not


class LeaderboardCallback(Callback):
    """Keeps a multirun's leaderboard current: rewritten as each job ends (an interrupted or
    killed sweep still has one), and at the end a line on the best run and on the jobs of this
    sweep that failed (then the exit status is 1)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        FAILED.clear()
        ENDED.clear()

    def on_job_end(self, config, job_return=None, **kwargs) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN or common.rank() != 0:
            return
        ENDED.add(hydra_cfg.job.num)
        if job_return is not None and job_return.status == JobStatus.FAILED:  # JobFailed, or a bug
            FAILED.setdefault(hydra_cfg.job.num, str(job_return._return_value).splitlines()[0])
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
        failed, ended = dict(FAILED), ENDED | set(FAILED)
        if not ended:  # the jobs ran in other processes (SLURM, submitit): their summaries say how they ended
            failed = {r["run"]: r["error"] or "no reason recorded" for r in rows if r["status"] == "failed"}
            ended = {r["run"] for r in rows}
        if failed:
            first = min(failed, key=lambda num: run_order(str(num)))
            print(
                f"error: {len(failed)} of {len(ended)} jobs failed (first: job {first}: {failed[first]}); see {sweep_dir / 'leaderboard.md'}",
                file=sys.stderr,
            )
            sys.exit(1)


def search_space(config, trial) -> None:
    """Optuna's custom search space for tinygpt's search configs (hparams_search=...): the peak
    learning rates of the optimizer each trial uses, drawn on a log scale from a quarter to four
    times their configured values, unless the search names them itself (in its params, or as a
    fixed value on the command line); Muon's rate only for Muon (optim=adamw has none, and an
    experiment may pin AdamW; a search over `optim` itself gets each choice's own defaults).
    Centred on each recipe's values, and never below an absolute `optim.min_lr`, no draw is
    invalid. Under a grid sampler the grid alone decides."""
    import optuna

    from gpt.config import OPTIMIZERS

    if isinstance(trial.study.sampler, optuna.samplers.GridSampler):
        return
    chosen = trial.params.get("optim", trial.user_attrs.get("optim", config.optim.name))
    optim = config.optim if chosen == config.optim.name else OmegaConf.structured(OPTIMIZERS[chosen])
    # An absolute floor given on the command line applies to whichever optimizer is drawn.
    floor = config.optim.get("min_lr") or 0.0
    for key, base in (("optim.lr", optim.lr), ("optim.muon_lr", optim.get("muon_lr"))):
        if base is not None and key not in trial.params and key not in trial.user_attrs:
            low = max(base / 4, floor * base / optim.lr) if floor else base / 4
            if low >= base * 4:
                raise TinyGPTError(
                    f"optim.min_lr={floor:g} leaves no {key} to search for optim={chosen} (it searches "
                    f"{base / 4:g}..{base * 4:g}); lower optim.min_lr or use optim.min_lr_ratio"
                )
            trial.suggest_float(key, low, base * 4, log=True)


if __name__ == "__main__":  # python -m gpt.apps.sweep, as `tinygpt sweep`
    main()
