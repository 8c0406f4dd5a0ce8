"""What the entry points share: config choice checks and one-line errors for user mistakes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable, TypeVar

from gpt.errors import TinyGPTError

T = TypeVar("T")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_group_choices(argv: list[str], config_dir: Path) -> None:
    """Reject `group=option` overrides naming a config file that does not exist.

    Hydra would report these too, but over a dozen lines; a user who typed `model=gtp2` needs
    one line with the choices. Sweep values (`model=a,b`) are checked one by one.
    """
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            continue
        key, value = arg.split("=", 1)
        group = key.lstrip("+~")
        folder = config_dir / group
        if "/" in group or "." in group or not folder.is_dir() or "(" in value or value in ("", "null"):
            continue
        choices = sorted(p.stem for p in folder.glob("*.yaml"))
        for option in value.split(","):
            if option not in choices:
                fail(f"unknown {group} config {option!r}; choose one of: {', '.join(choices)} (files in {folder})")


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
