"""What a run records, and the log it prints.

__init__     the `tinygpt` logger and the console (log lines that do not break a progress bar)
records.py   metrics.jsonl, summary.json (with its heartbeat), a run's status, its records as one
tensorboard.py  TensorBoard events; `NullTracker` stands in on non-zero ranks, so the loop has
             no `if writer:` branches
leaderboard.py  a sweep's runs ranked, as Markdown, CSV and a plot of their val curves
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger("tinygpt")


def ensure_console_logging() -> None:
    """Under Hydra the job logging config routes our messages to the console and <run>/train.log.
    Called from plain Python (tests, notebooks) nothing is configured: print INFO to stdout."""
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def console_redirected(bar_shown: bool):
    """While a progress bar is on screen, log lines go through tqdm.write so they do not break
    it. Only the loggers that print to the console are redirected (tqdm would otherwise add a
    console handler of its own to the root logger, and every line would appear twice)."""
    if not bar_shown:
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    def prints(lg: logging.Logger) -> bool:
        return any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr) for h in lg.handlers)

    return logging_redirect_tqdm(loggers=[lg for lg in (logging.getLogger(), logger) if prints(lg)])
