"""TensorBoard events of a run (scalars, text, its settings as HParams, histograms, attention
maps); `NullTracker` is the same interface doing nothing, for ranks other than 0."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpt.runtime import io

if TYPE_CHECKING:
    import torch


SESSION_FILE = "events.out.tfevents"  # TensorBoard reads the files whose names hold "tfevents"


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


class NullTracker:
    def scalars(self, step: int, values: dict) -> None: ...

    def text(self, tag: str, text: str, step: int = 0) -> None: ...

    def config(self, cfg: dict) -> None: ...

    def hparams(self, cfg: dict, metric_tags: list[str]) -> None: ...

    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None: ...

    def attention_images(self, step: int, maps: list) -> None: ...

    def end(self, status: str) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker(NullTracker):
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: it is slow to import

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.session: list = []  # the HParams experiment and session start, once declared

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
        folder; the trainer then writes those scalars at every eval. (`add_hparams` would open a
        separate sub-run, and the HParams tab would not line a sweep's runs up with their
        curves.) The session reads as unknown until `end` says how it ended."""
        from torch.utils.tensorboard.summary import hparams

        flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flatten(cfg).items()}
        experiment, start, _ = hparams(flat, {tag: 0.0 for tag in metric_tags})  # torch's end says "success"
        self.session = [experiment, start]
        self._write_session("unknown")

    def end(self, status: str) -> None:
        """The HParams session's end: success, failure, or unknown (interrupted, resumable)."""
        if self.session:
            self._write_session(status)

    def _write_session(self, status: str) -> None:
        """The session (experiment, start with this start's settings, end) in a file of its own
        that sorts before every earlier one of the folder. TensorBoard reads a run's event files
        in name order and keeps the first `_hparams_/*` it meets of each tag (its event
        accumulator, and the Rust data server alike), and each start of a resumed run declares
        its session again: written into the writer's file, the tab would show the run's first
        start (its settings before a train-on, its end as interrupted), not this one."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.plugins.hparams import metadata
        from tensorboard.plugins.hparams.api_pb2 import Status
        from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo
        from tensorboard.summary.writer.record_writer import RecordWriter

        code = {"finished": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}.get(status, "STATUS_UNKNOWN")
        info = HParamsPluginData(session_end_info=SessionEndInfo(status=Status.Value(code)), version=metadata.PLUGIN_DATA_VERSION)
        plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=info.SerializeToString())
        end = Summary(value=[Summary.Value(tag=metadata.SESSION_END_INFO_TAG, metadata=SummaryMetadata(plugin_data=plugin))])
        # Each write's number is one below the folder's lowest: the newest sorts first ("0..." sorts
        # before the writers' files, named by a Unix time), whatever the clock says.
        folder = Path(self.writer.log_dir)
        numbers = [int(p.name.split(".")[3]) for p in folder.glob(f"{SESSION_FILE}.0*.hparams")]
        now = time.time()
        with io.atomic_write(folder / f"{SESSION_FILE}.{min(numbers, default=10**10) - 1:011d}.hparams") as f:
            records = RecordWriter(f)
            records.write(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
            for summary in (*self.session, end):
                records.write(Event(wall_time=now, summary=summary).SerializeToString())

    def histogram(self, tag: str, values: torch.Tensor, step: int) -> None:
        """Of the finite values (gradients of a step the guard then skips may be NaN, and
        TensorBoard refuses a histogram with nothing to bin); none finite: none written."""
        import torch

        values = values.detach().float().cpu()
        values = values[torch.isfinite(values)]
        if values.numel():
            self.writer.add_histogram(tag, values, step)

    def attention_images(self, step: int, maps: list) -> None:
        """One grey-scale image per layer: the heads' T x T attention maps side by side, each
        query's row scaled to its own maximum. Scaled by the global maximum, row 0 (which can
        only attend to itself: weight 1) would be the one bright row and the rest near black."""
        for layer, weights in enumerate(maps):
            heads = weights[0].float().cpu()  # (H, T, T) of the first sequence
            heads = heads / heads.amax(dim=-1, keepdim=True).clamp(min=1e-8)
            image = heads.permute(1, 0, 2).reshape(heads.size(1), -1)  # (T, H*T)
            self.writer.add_image(f"attention/layer_{layer}", image, step, dataformats="HW")

    def close(self) -> None:
        self.writer.close()
