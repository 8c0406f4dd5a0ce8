"""A sweep's jobs before they train: a job folder that holds another sweep's run.

Hydra numbers a sweep's job folders (<sweep>/0, 1, ...), so rerunning a sweep into the same
folder gives each job the folder of the earlier sweep's job of the same number: the same sweep
resumes its jobs' runs (documented: rerun a sweep to finish it, or raise train.max_iters to train
it on), but a sweep with other values would resume, and relabel, runs of other settings.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpt.checkpoints import runs
from gpt.errors import TinyGPTError
from gpt.runtime import io
from gpt.tracking import read_json

# What a job may change when it resumes its own run: how long it trains, and how this machine runs it.
RESUMABLE = ("train.max_iters", "resume", "threads", "compile", "device")


class OtherSweepsRun(TinyGPTError):
    """A job refused because its folder holds a run of other settings; that run stays as it was."""


def refuse_another_sweeps_run(job_dir: Path, num: int, overrides: list[str]) -> None:
    """Refuse job `num` if its folder holds a run started with other overrides (its summary.json's,
    recorded at the run's last start) than this job's, but for RESUMABLE ones. Hydra has by now
    rewritten the folder's .hydra/overrides.yaml with this job's: the earlier run's are put back,
    as the leaderboard and a resume read them."""
    if not runs.has_run(job_dir):
        return
    earlier = read_json(Path(job_dir) / "summary.json").get("overrides")
    if not isinstance(earlier, list):  # no record of how it started: the run's own checks decide
        return
    was, now = _settings(earlier), _settings(overrides)
    if was == now:
        return
    try:
        io.write_bytes(Path(job_dir) / ".hydra" / "overrides.yaml", yaml.safe_dump([str(o) for o in earlier]).encode())
    except OSError:
        pass
    raise OtherSweepsRun(
        f"{job_dir} holds job {num} of an earlier sweep started with {_differing(was, now)} (this sweep's job {num}: "
        f"{_differing(now, was)}); a sweep job resumes only its own run: pass another hydra.sweep.dir or move {job_dir} away"
    )


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
