"""What the entry points share: config choice checks and one-line errors for user mistakes."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Callable, TypeVar

from gpt.config import OptimSettings
from gpt.errors import TinyGPTError
from gpt.preemption import Preempted

T = TypeVar("T")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def preflight(argv: list[str], config_dir: Path) -> None:
    """Reject `group=option` overrides naming a config file that does not exist, before Hydra
    composes anything or creates a run directory. Hydra reports these too, but over a dozen
    lines; a user who typed `model=gtp2` needs one line with the choices. Sweep values
    (`model=a,b`) are checked one by one."""
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        if key == "hydra.run.dir" and _rank() == 0:
            _protect_earlier_run(Path(value).expanduser(), argv)
        group = key.lstrip("+~")
        folder = config_dir / group
        if "/" in group or "." in group or not folder.is_dir() or "(" in value or value in ("", "null"):
            continue
        choices = sorted(p.stem for p in folder.glob("*.yaml"))
        for option in value.split(","):
            if option not in choices:
                fail(f"unknown {group} config {option!r}; choose one of: {', '.join(choices)} (files in {folder})")


def check_keys(argv: list[str], config_dir: Path, config_name: str) -> None:
    """Compose the config once with the command line's overrides, so that a misspelt key
    (`train.max_iter=20`) is one line naming it instead of Hydra's multi-line report. Sweeps
    (-m) are left to Hydra: their comma lists only make sense to a sweeper."""
    if any(a in ("-m", "--multirun") for a in argv):
        return
    overrides = [a for a in argv if "=" in a and not a.startswith(("-", "hydra.", "hydra/", "+hydra", "~hydra"))]
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            compose(config_name=config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        text = f"{e}\n{e.__cause__ or ''}"
        bad = next((a for a in overrides if f"'{a.split('=', 1)[0].lstrip('+~')}'" in text), None)
        if "not in struct" in text and bad:
            key = bad.split("=", 1)[0]
            # A real optim setting the composed group lacks: one of optim=muon's, under optim=adamw.
            if key.startswith("optim.") and key.removeprefix("optim.") in {f.name for f in fields(OptimSettings)}:
                fail(f"{key} is a Muon setting and this run uses optim=adamw (an experiment may pin it); add optim=muon")
            fail(f"unknown setting {key!r}; list the valid keys with `python {config_name_script(config_name)} --cfg job`")
        fail(text.strip().splitlines()[0])


def config_name_script(config_name: str) -> str:
    return "sample.py" if config_name == "sample" else "train.py"


def _protect_earlier_run(run_dir: Path, argv: list[str]) -> None:
    """Training into a directory that already holds a run resumes it (resume=auto) or is refused
    (resume=false). Either way Hydra would overwrite that run's .hydra/ record before any of our
    code runs: refuse first, or keep the earlier record as .hydra-<n>/."""
    from gpt.checkpoint import has_run

    if not has_run(run_dir):
        return
    if any(a in ("resume=false", "resume=False", "resume=never") for a in argv):
        fail(f"{run_dir} already holds a run and resume=false; train into a new directory or use resume=auto")
    record = run_dir / ".hydra"
    if record.is_dir():
        n = 1
        while (run_dir / f".hydra-{n}").exists():
            n += 1
        record.rename(run_dir / f".hydra-{n}")


def take_verbatim(argv: list[str], key: str) -> tuple[list[str], str | None]:
    """Remove `key=value` from argv and return its value untouched by Hydra's override grammar,
    which rejects non-ASCII text and resolves `${...}`; free text such as a prompt needs neither."""
    rest, value = [], None
    for arg in argv:
        if arg.startswith(f"{key}="):
            value = arg[len(key) + 1 :]
        else:
            rest.append(arg)
    return rest, value


def _rank() -> int:
    """This process's rank under torchrun or SLURM (see gpt.distributed.from_env), 0 alone."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0") if "SLURM_NTASKS" in os.environ else "0"))


def quiet_non_zero_ranks(argv: list[str]) -> list[str]:
    """Under torchrun every rank runs the Hydra app; only rank 0 may create the run directory
    and its logs (the trainer hands rank 0's directory to the others)."""
    if _rank() == 0:
        return argv
    return [*argv, "hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]


def guard(fn: Callable[[], T]) -> T:
    """Run fn; a TinyGPTError becomes `error: <message>` on stderr and exit status 2."""
    try:
        return fn()
    except TinyGPTError as e:
        _log_to_files(f"error: {e}")
        fail(str(e))
    except Preempted:  # checkpoint saved and resume command printed: a clean exit
        sys.exit(0)
    except KeyboardInterrupt:  # a second Ctrl-C: stop now, without a traceback
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def _log_to_files(message: str) -> None:
    """Record the error in the run's log file (under Hydra) without printing it twice."""
    record = logging.makeLogRecord({"msg": message, "levelno": logging.ERROR, "levelname": "ERROR"})
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
