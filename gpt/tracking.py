"""Console and TensorBoard logging.

The trainer always talks to a tracker; `NullTracker` stands in when TensorBoard is off, so the
loop has no `if writer:` branches.
"""

from __future__ import annotations

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


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


class MetricsFile:
    """Appends one JSON object per line to <run>/metrics.jsonl, at full float precision (for
    tools, plots and exact comparisons); a None path makes it a no-op."""

    def __init__(self, path: Path | None):
        self.f = open(path, "a", encoding="utf-8") if path is not None else None

    def write(self, **record) -> None:
        if self.f is not None:
            self.f.write(json.dumps(record) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class NullTracker:
    def scalars(self, step: int, values: dict) -> None: ...

    def text(self, tag: str, text: str, step: int = 0) -> None: ...

    def config(self, cfg: dict) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker(NullTracker):
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: it is slow to import

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def scalars(self, step: int, values: dict) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        # TensorBoard renders text as Markdown; indent four spaces so it shows verbatim.
        self.writer.add_text(tag, "    " + text.replace("\n", "\n    "), step)

    def config(self, cfg: dict) -> None:
        lines = [f"{k}: {v}" for k, v in sorted(_flatten(cfg).items())]
        self.text("config", "\n".join(lines))

    def close(self) -> None:
        self.writer.close()
