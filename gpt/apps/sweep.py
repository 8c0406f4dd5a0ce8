"""A sweep's leaderboard (Markdown + CSV, sorted by best val loss unless told) and val-curve plot:

    tinygpt sweep outputs/sweeps/<stamp>          # or: tinygpt sweep dir=outputs/sweeps/<stamp>
    tinygpt sweep outputs/sweeps/<stamp> rank_by=hellaswag/acc_norm   # by a train.eval_tasks figure

Written automatically when a multirun ends (gpt.apps.train.LeaderboardCallback, registered in
configs/hydra/default.yaml); this command writes them on demand, e.g. while a sweep still runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from gpt.apps import common
from gpt.config import SweepConfig
from gpt.errors import TinyGPTError
from gpt.tracking.leaderboard import write_leaderboard


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A bare first argument is the sweep folder: `tinygpt sweep outputs/sweeps/<stamp> [rank_by=...]`.
    if argv and "=" not in argv[0] and not argv[0].startswith("-"):
        argv = [f"dir={argv[0]}", *argv[1:]]
    common.run_command(argv, "sweep", "tinygpt sweep", __doc__, summarise, verbatim=("dir",))


def summarise(s: SweepConfig) -> list[dict]:
    _refuse_a_folder_without_jobs(Path(s.dir))
    rows = write_leaderboard(s.dir, s.rank_by)
    print((Path(s.dir) / "leaderboard.md").read_text(), end="")
    print(f"wrote leaderboard.md, leaderboard.csv and val_curves.png ({len(rows)} runs) in {s.dir}")
    return rows


def _refuse_a_folder_without_jobs(folder: Path) -> None:
    """A folder with no job folders (0, 1, ... or any holding a .hydra/ record or a summary.json),
    no sweep folders and no multirun.yaml (Hydra's, there from a sweep's start, e.g. one queued on
    SLURM) is no sweep: nothing is written into it. (A run directory, a folder of sweeps:
    write_leaderboard names them.)"""

    def job(p: Path) -> bool:
        return p.is_dir() and (p.name.isdigit() or (p / ".hydra").is_dir() or (p / "summary.json").is_file())

    if not folder.is_dir() or (folder / "summary.json").is_file() or (folder / "checkpoints").is_dir():
        return
    if (folder / "multirun.yaml").is_file() or any(
        job(p) or (p.is_dir() and any(map(job, p.iterdir()))) for p in folder.iterdir()
    ):
        return
    raise TinyGPTError(
        f"{folder} holds no sweep (no job folders, no multirun.yaml); pass the folder of a multirun (outputs/sweeps/<stamp>)"
    )


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
