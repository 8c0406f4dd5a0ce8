"""What a run records: console lines, TensorBoard events, metrics.jsonl and summary.json.

The trainer always talks to a tracker; `NullTracker` stands in on non-zero ranks, so the loop
has no `if writer:` branches.
"""

from __future__ import annotations

import json
import logging
import os
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


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


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


class RunSummary:
    """<run>/summary.json: where a run stands, rewritten (atomically) at start, at every eval
    and at the end, so that a crashed or killed run still leaves a truthful record."""

    def __init__(self, path: Path | None, **fixed):
        self.path = path
        self.data = {"status": "running", **fixed}

    def update(self, **values) -> None:
        self.data.update(values)
        if self.path is not None:
            write_json_atomic(self.path, self.data)


class NullTracker:
    def scalars(self, step: int, values: dict) -> None: ...

    def text(self, tag: str, text: str, step: int = 0) -> None: ...

    def config(self, cfg: dict) -> None: ...

    def hparams(self, cfg: dict, metric_tags: list[str]) -> None: ...

    def histograms(self, step: int, model) -> None: ...

    def attention_images(self, step: int, maps: list) -> None: ...

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
        lines = [f"{k}: {v}" for k, v in sorted(flatten(cfg).items())]
        self.text("config", "\n".join(lines))

    def hparams(self, cfg: dict, metric_tags: list[str]) -> None:
        """Declare the run's hyperparameters and the scalar tags that score it, in this run's own
        event file; the trainer then writes those scalars at every eval. (`add_hparams` would
        open a separate sub-run, and the HParams tab would not line a sweep's runs up with their
        curves.)"""
        from torch.utils.tensorboard.summary import hparams

        flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flatten(cfg).items()}
        for summary in hparams(flat, {tag: 0.0 for tag in metric_tags}):
            self.writer.file_writer.add_summary(summary)

    def histograms(self, step: int, model) -> None:
        for name, p in model.named_parameters():
            self.writer.add_histogram(f"weights/{name}", p.detach().float().cpu(), step)
            if p.grad is not None:
                self.writer.add_histogram(f"grads/{name}", p.grad.detach().float().cpu(), step)

    def attention_images(self, step: int, maps: list) -> None:
        """One grey-scale image per layer: the heads' T x T attention maps side by side."""
        for layer, weights in enumerate(maps):
            heads = weights[0].float().cpu()  # (H, T, T) of the first sequence
            image = heads.permute(1, 0, 2).reshape(heads.size(1), -1)  # (T, H*T)
            self.writer.add_image(f"attention/layer_{layer}", image / image.max().clamp(min=1e-8), step, dataformats="HW")

    def close(self) -> None:
        self.writer.close()
