"""gpt/training/step.py: one optimizer step (accumulation, clipping) and the guard that skips
non-finite updates and stops a run that keeps diverging.
Run: pytest tests/training/test_step.py"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from gpt.checkpoints import checkpoint, runs
from gpt.data.loader import Batch
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.runtime import devices
from gpt.training import train, train_step
from helpers import ENGINE_RUN, compose, poison_forward


class FixedBatches:
    """Given (x, y) pairs, drawn in turn as text batches (every target trained)."""

    def __init__(self, parts):
        self.parts, self.i = parts, 0

    def next(self) -> Batch:
        x, y = self.parts[self.i % len(self.parts)]
        self.i += 1
        return Batch(x, y, tokens=x.numel())


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_accumulating_half_batches_equals_one_full_batch(clip):
    rt = devices.setup("cpu", "float32", False)
    torch.manual_seed(0)
    a = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16))
    b = copy.deepcopy(a)
    before = copy.deepcopy(a)
    x = torch.randint(0, 32, (8, 8))
    y = torch.randint(0, 32, (8, 8))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.5)
    one = train_step(a, FixedBatches([(x, y)]), opt_a, scaler, rt, accum_steps=1, grad_clip=clip)
    two = train_step(b, FixedBatches([(x[:4], y[:4]), (x[4:], y[4:])]), opt_b, scaler, rt, accum_steps=2, grad_clip=clip)
    (loss_a, norm_a), (loss_b, norm_b) = (one.loss, one.norm), (two.loss, two.norm)
    assert one.tokens == two.tokens == 64
    assert torch.allclose(loss_a, loss_b, atol=1e-6) and torch.allclose(norm_a, norm_b, atol=1e-6)
    if clip:  # clipped: the applied gradient has norm `clip`, the reported norm is the raw one
        total = torch.cat([p.grad.flatten() for p in a.parameters()]).norm()
        assert norm_a > clip and abs(total.item() - clip) < 1e-4
    opt_a.step()
    opt_b.step()
    moved = max((pa - p0).abs().max().item() for pa, p0 in zip(a.parameters(), before.parameters()))
    assert moved > 1e-4
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_isolated_nan_steps_are_skipped(tmp_path, data_root, monkeypatch, caplog):
    root, data_overrides = data_root
    poison_forward(monkeypatch, {4, 9})
    caplog.set_level(logging.INFO, logger="tinygpt")
    train(compose([*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_iters=15"], tmp_path))
    assert caplog.text.count("update skipped") == 2 and "2 non-finite step(s) skipped" in caplog.text
    ckpt = checkpoint.load(runs.latest(tmp_path))
    assert ckpt.step == 15 and ckpt.training.bad_steps == 2
    assert all(torch.isfinite(v).all() for v in ckpt.model.values())


def test_divergence_stops_with_last_good_checkpoint_untouched(tmp_path, data_root, monkeypatch):
    root, data_overrides = data_root
    poison_forward(monkeypatch, set(range(13, 1000)))
    cfg = compose([*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.max_bad_steps=3"], tmp_path)
    with pytest.raises(TinyGPTError, match="diverged: 3 non-finite steps in a row at step 15.*ckpt-0000010.pt"):
        train(cfg)
    assert [p.name for p in runs.step_checkpoints(tmp_path)] == ["ckpt-0000010.pt"]
    assert all(torch.isfinite(v).all() for v in checkpoint.load(runs.latest(tmp_path)).model.values())


class ConversationLike(FixedBatches):
    """Batches with untrained targets (-1), counted as gpt.data.chat.ConversationBatches counts them."""

    def next(self) -> Batch:
        batch = super().next()
        batch.trained = batch.tokens = int((batch.y != -1).sum())
        return batch


def test_every_trained_token_weighs_the_same_across_micro_batches():
    """A long reply and a short one in two micro-batches: the step's gradient is that of the mean
    over all 12 trained tokens, not the mean of the two micro-batches' means."""
    rt = devices.setup("cpu", "float32", False)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=12, n_layer=1, n_head=2, n_embd=16))
    by_hand = copy.deepcopy(model)
    x = torch.randint(0, 32, (2, 12))
    y = torch.full((2, 12), -1)
    y[0, 2:12] = x[0, 2:12]  # a long reply: 10 trained tokens
    y[1, 10:12] = x[1, 10:12]  # a short one: 2
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    result = train_step(model, ConversationLike([(x[:1], y[:1]), (x[1:], y[1:])]), opt, scaler, rt, accum_steps=2, grad_clip=0.0)
    logits, _ = by_hand(x)
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), y.reshape(-1), ignore_index=-1, reduction="sum")
    (per_token / 12).backward()
    assert torch.allclose(result.loss, per_token.detach() / 12, atol=1e-6) and result.tokens == 12
    for a, b in zip(model.parameters(), by_hand.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_the_first_logged_speed_leaves_out_the_first_step(tmp_path, data_root, monkeypatch):
    """The first step compiles (compile=true) and warms up: it is not in the first interval's
    ms/step, tokens/s or MFU."""
    import json
    import time

    from gpt.training import step as steps

    root, data_overrides = data_root
    real, calls = steps.train_step, []

    def slow_first(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(2.0)  # what compiling a model costs the first step
        return real(*a, **k)

    monkeypatch.setattr(steps, "train_step", slow_first)
    overrides = [*ENGINE_RUN, *data_overrides, f"paths.data_dir={root}", "train.log_interval=5", "train.max_iters=10"]
    train(compose(overrides, tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["kind"] == "train")
    assert first["step"] == 5 and first["ms_per_step"] < 400, first  # 2 s over 5 steps would be >= 400
