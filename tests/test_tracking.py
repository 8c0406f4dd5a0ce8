"""gpt/tracking/__init__.py: a run's summary.json as a sweep reads it: stale when its writer is gone, and
a failure recorded without ever writing over another run's record.
Run: pytest tests/test_tracking.py"""

from __future__ import annotations

import json

from gpt.tracking.records import record_failure


def test_status_of_a_run_written_elsewhere_follows_its_heartbeat():
    from gpt.runtime.runlock import STALE_AFTER
    from gpt.tracking.records import status_of

    now = 1_000_000.0
    running = {"status": "running", "host": "another-host", "pid": 1, "heartbeat": now - 60}
    assert status_of(running, now) == "running"
    assert status_of({**running, "heartbeat": now - STALE_AFTER - 1}, now) == "stale"
    assert status_of({**running, "status": "failed"}, now) == "failed" and status_of({}, now) == "no summary"


def test_a_failure_is_recorded_once_and_never_over_another_runs_record(tmp_path):
    record_failure(tmp_path / "new", "lower optim.lr", overrides=["optim.lr=9"])
    summary = json.loads((tmp_path / "new" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == "lower optim.lr" and summary["overrides"] == ["optim.lr=9"]

    earlier = tmp_path / "earlier"  # a finished run a refused resume must not touch
    earlier.mkdir()
    (earlier / "summary.json").write_text(json.dumps({"status": "finished", "best_val_loss": 1.5}))
    before = (earlier / "summary.json").read_bytes()
    record_failure(earlier, "refused", replaces="refused")
    record_failure(earlier, "refused")
    assert (earlier / "summary.json").read_bytes() == before

    # a run that failed while training said it itself; the sweep's fuller line replaces exactly that
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "summary.json").write_text(json.dumps({"status": "failed", "error": "KeyError: 'x'", "step": 7}))
    record_failure(crashed, "KeyError: 'x'; traceback in crashed/traceback.txt", replaces="something else")
    assert json.loads((crashed / "summary.json").read_text())["error"] == "KeyError: 'x'"
    record_failure(crashed, "KeyError: 'x'; traceback in crashed/traceback.txt", replaces="KeyError: 'x'")
    again = json.loads((crashed / "summary.json").read_text())
    assert again["error"] == "KeyError: 'x'; traceback in crashed/traceback.txt" and again["step"] == 7


def test_a_histogram_bins_the_finite_values_and_skips_a_tensor_with_none(tmp_path):
    """Gradients of a step the non-finite guard then skips may be NaN throughout: TensorBoard
    would refuse them ("the histogram is empty") and end the run; the finite ones are binned."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpt.tracking.tensorboard import TensorBoardTracker

    tb = TensorBoardTracker(tmp_path)
    tb.histogram("grads/all_nan", torch.full((4, 4), float("nan")), 1)
    tb.histogram("grads/some", torch.tensor([1.0, float("inf"), 2.0, float("nan"), 3.0]), 1)
    tb.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0}).Reload()
    assert events.Tags()["histograms"] == ["grads/some"]
    assert events.Histograms("grads/some")[0].histogram_value.num == 3
