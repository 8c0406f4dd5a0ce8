"""A sweep's jobs before they train: every job's settings checked before the first starts
(check_sweep), and a job folder that holds another sweep's run (refuse_another_sweeps_run).

Hydra numbers a sweep's job folders (<sweep>/0, 1, ...), so rerunning a sweep into the same
folder gives each job the folder of the earlier sweep's job of the same number: the same sweep
resumes its jobs' runs (documented: rerun a sweep to finish it, or raise train.max_iters to train
it on), but a sweep with other values would resume, and relabel, runs of other settings. Hydra
rewrites a job folder's .hydra/ record before the job's code runs: EarlierRecords (gpt.apps.train) keeps a copy of
each from the sweep's start, which a refused job puts back.
"""

from __future__ import annotations

import filecmp
import itertools
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from gpt.apps import common
from gpt.checkpoints import runs
from gpt.errors import TinyGPTError
from gpt.runtime import io
from gpt.tracking import read_json

# The most jobs of a sweep whose settings are composed before the first starts (~60 ms each).
MAX_JOBS = 256

# What a job may change when it resumes its own run: how long it trains, and how this machine runs it.
RESUMABLE = ("train.max_iters", "resume", "threads", "compile", "device")


class OtherSweepsRun(TinyGPTError):
    """A job refused because its folder holds a run of other settings; that run stays as it was."""


def refuse_another_sweeps_run(job_dir: Path, num: int, overrides: list[str]) -> None:
    """Refuse job `num` if its folder holds a run started with other overrides (its summary.json's,
    recorded at the run's last start) than this job's, but for RESUMABLE ones. Hydra has by now
    rewritten the folder's .hydra/ with this job's settings: the earlier run's record is put back
    as it was (EarlierRecords' copy), as the leaderboard and a resume read it."""
    if not runs.has_run(job_dir):
        return
    earlier = read_json(Path(job_dir) / "summary.json").get("overrides")
    if not isinstance(earlier, list):  # no record of how it started: the run's own checks decide
        return
    was, now = _settings(earlier), _settings(overrides)
    if was == now:
        return
    try:
        _put_back_record(Path(job_dir), [str(o) for o in earlier])
    except OSError:
        pass
    raise OtherSweepsRun(
        f"{job_dir} holds job {num} of an earlier sweep started with {_differing(was, now)} (this sweep's job {num}: "
        f"{_differing(now, was)}); a sweep job resumes only its own run: pass another hydra.sweep.dir or move {job_dir} away"
    )


def _copy_aside(record: Path) -> Path:
    n = 1
    while (record.parent / f".hydra-{n}").exists():
        n += 1
    shutil.copytree(record, record.parent / f".hydra-{n}")
    return record.parent / f".hydra-{n}"


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    _, differ, unread = filecmp.cmpfiles(a, b, names, shallow=False)
    return names == sorted(p.name for p in b.iterdir()) and not differ and not unread


def _put_back_record(job_dir: Path, earlier: list[str]) -> None:
    """The job folder's .hydra/ as it was before this sweep: the newest copy EarlierRecords made,
    if it is the record of the run's last start (its overrides are summary.json's); without one
    (hydra.callbacks replaced), at least the earlier overrides.yaml, which the leaderboard reads."""
    record = job_dir / ".hydra"
    numbered = [(int(p.name[7:]), p) for p in job_dir.glob(".hydra-*") if p.name[7:].isdigit()]
    copy = max(numbered)[1] if numbered else None
    try:
        told = yaml.safe_load((copy / "overrides.yaml").read_text()) if copy is not None else None
    except (OSError, yaml.YAMLError):
        told = None
    if isinstance(told, list) and [str(o) for o in told] == earlier:
        shutil.rmtree(record, ignore_errors=True)
        copy.rename(record)
    else:
        io.write_bytes(record / "overrides.yaml", yaml.safe_dump(earlier).encode())


def _settings(overrides: list[str]) -> dict[str, object]:
    """key -> value of each override but the RESUMABLE ones, values as Hydra reads them (a sweep's
    `optim.lr=1e-3,3e-3` gives its job `optim.lr=0.001`, a plain `optim.lr=1e-3` the text)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    given = {}
    for text in overrides:
        key, _, value = str(text).partition("=")
        try:
            override = parser.parse_override(str(text))
            key, value = override.get_key_element(), override.value()
        except Exception:  # unreadable now (another tinygpt wrote it): compared as text
            pass
        if key.lstrip("+~") not in RESUMABLE:
            given[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return given


def _differing(these: dict, others: dict) -> str:
    """The overrides of `these` that `others` lacks or gives another value."""
    told = [f"{k}={_text(v)}" for k, v in these.items() if k not in others or others[k] != v]
    told += [f"no {k}" for k in others if k not in these]
    return " ".join(told)


def _text(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


# --- before the first job ----------------------------------------------------------------------


def check_sweep(config_name: str, overrides: list[str], command: str, then: Callable[[object, bool], None] | None = None) -> None:
    """Before a multirun starts, so that a mistake is one line now, not a failure in job 7: the key
    and type of every value it can give a job (each value of a comma list with the other keys at
    their first value; each choice and both ends of each interval of a search space,
    `hydra.sweeper.params`, e.g. Optuna's); then, for Hydra's basic sweeper, the settings of each
    job it will run (up to MAX_JOBS: ranges and the checks across settings, as the job makes
    them), and for a sweeper that draws its jobs, each value of its space, refused when it fails
    with every combination of the other values (up to 64). When every job fails `then(settings,
    here)` (e.g. device=cuda without a GPU), the sweep is refused with the first reason. `here`:
    whether the jobs run on this machine (not under a SLURM launcher, whose nodes have their own
    devices)."""
    parsed = _parse(overrides)
    options = [_values(o) for o in parsed]
    firsts = [opts[0] for opts in options if opts]
    cfg = common.compose_raw(config_name, firsts, command, hydra=True)
    space = cfg.hydra.sweeper.get("params") or {}
    drawn = [_values(o) for o in _parse([f"{k}={v}" for k, v in space.items()])]
    for opts in options + drawn:
        for choice in opts:
            key = choice.split("=", 1)[0]
            common.compose_raw(config_name, [o for o in firsts if o.split("=", 1)[0] != key] + [choice], command)
    listed = [opts for opts in options if opts]
    every_job = str(cfg.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper") and all(options)
    if every_job:  # (a glob() lists no values here: its jobs check themselves)
        swept = [o.is_sweep_override() for o in parsed]
        jobs = [_job(config_name, list(c), swept, command) for c in itertools.islice(itertools.product(*listed), MAX_JOBS)]
    else:
        _check_space(config_name, listed + [d for d in drawn if d], command)
    if then is not None:
        target = str(cfg.hydra.launcher.get("_target_", ""))
        here = target.endswith(("BasicLauncher", "LocalLauncher", "JoblibLauncher"))
        if every_job:
            _refuse_if_no_job_can_run(jobs, lambda s: then(s, here))
        else:
            combinations = itertools.islice(itertools.product(*listed, *(d for d in drawn if d)), 64)
            _refuse_if_no_job_can_run(
                (lambda c=c: common.compose(config_name, list(c), command) for c in combinations), lambda s: then(s, here)
            )


def _job(config_name: str, combination: list[str], swept: list[bool], command: str):
    """One job's settings, as the job composes them; its error names the job by its swept values."""
    try:
        return common.compose(config_name, combination, command)
    except TinyGPTError as e:
        which = " ".join(o for o, s in zip(combination, swept, strict=True) if s)
        raise TinyGPTError(f"the sweep's job {which}: {e}") from None


def _check_space(config_name: str, options: list[list[str]], command: str) -> None:
    """Each value a search can give (its space's, and the command line's comma lists and
    intervals) with the other values: refused when no combination of them takes it."""
    for i, opts in enumerate(options):
        others = [o for j, o in enumerate(options) if j != i]
        for choice in opts:
            first_error = None
            for combination in itertools.islice(itertools.product(*others), 64):
                try:
                    common.compose(config_name, [*combination, choice], command)
                    break
                except TinyGPTError as e:
                    first_error = first_error or e
            else:
                if first_error is not None:
                    raise TinyGPTError(f"the search's {choice}: {first_error}")


def _refuse_if_no_job_can_run(jobs, then) -> None:
    first_error = None
    for job in jobs:
        try:
            return then(job() if callable(job) else job)
        except TinyGPTError as e:
            first_error = first_error or e
    if first_error is not None:
        raise TinyGPTError(f"no job of this sweep can run: {first_error}")


def _parse(overrides: list[str]):
    """Hydra's reading of the overrides; its grammar's error in one line (common.explain)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise TinyGPTError(common.explain(e)) from None


def _values(override) -> list[str]:
    """The values a sweep override can take, as `key=value` overrides (an interval: its ends;
    a sweep that cannot be listed here, such as glob(): none, its jobs check themselves)."""
    from hydra.core.override_parser.types import IntervalSweep

    if not override.is_sweep_override():
        return [override.input_line]
    value = override.value()
    try:
        values = [value.start, value.end] if isinstance(value, IntervalSweep) else list(override.sweep_string_iterator())
    except Exception:  # e.g. glob(...), which needs Hydra's config loader to expand
        return []
    return [f"{override.get_key_element()}={v}" for v in values]
