"""What the entry points share: config choice checks and one-line errors for user mistakes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable, TypeVar

from gpt.checkpoint import ensure_fresh_run_dir
from gpt.errors import TinyGPTError

T = TypeVar("T")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def preflight(argv: list[str], config_dir: Path) -> None:
    """Checks on the raw command line, before Hydra composes anything or creates a run directory.

    - `group=option` naming a config file that does not exist: Hydra reports it too, but over a
      dozen lines; a user who typed `model=gtp2` needs one line with the choices. Sweep values
      (`model=a,b`) are checked one by one.
    - `hydra.run.dir=` pointing at an earlier run: Hydra would overwrite that run's .hydra/
      files before our code runs, so refuse here.
    """
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        if key == "hydra.run.dir":
            guard(lambda: ensure_fresh_run_dir(Path(value).expanduser()))
        group = key.lstrip("+~")
        folder = config_dir / group
        if "/" in group or "." in group or not folder.is_dir() or "(" in value or value in ("", "null"):
            continue
        choices = sorted(p.stem for p in folder.glob("*.yaml"))
        for option in value.split(","):
            if option not in choices:
                fail(f"unknown {group} config {option!r}; choose one of: {', '.join(choices)} (files in {folder})")


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


def guard(fn: Callable[[], T]) -> T:
    """Run fn; a TinyGPTError becomes `error: <message>` on stderr and exit status 2."""
    try:
        return fn()
    except TinyGPTError as e:
        _log_to_files(f"error: {e}")
        fail(str(e))


def _log_to_files(message: str) -> None:
    """Record the error in the run's log file (under Hydra) without printing it twice."""
    record = logging.makeLogRecord({"msg": message, "levelno": logging.ERROR, "levelname": "ERROR"})
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
