"""Optimizer groups and the LR schedule. Run: pytest tests/test_optim.py"""

import math

import pytest
import torch

from gpt.config import OptimSettings
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.optim import CosineSchedule, build_optimizer, param_groups


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16))
    decay, no_decay = param_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    total = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert total == model.num_params()  # every parameter once, the tied one included
    opt = build_optimizer(model, OptimSettings(lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95), torch.device("cpu"))
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.param_groups[0]["weight_decay"] == 0.1


def test_warmup_then_cosine_then_floor():
    s = CosineSchedule(lr=1e-3, min_lr=1e-4, warmup_iters=10, decay_iters=110)
    assert s(0) < s(5) < s(9) <= 1e-3
    assert math.isclose(s(10), 1e-3)
    assert math.isclose(s(60), 1e-4 + 0.5 * (1e-3 - 1e-4))  # halfway down the cosine
    assert math.isclose(s(110), 1e-4) and math.isclose(s(500), 1e-4)
    assert all(s(i) >= s(i + 1) for i in range(10, 120))


def test_warmup_longer_than_schedule_is_shortened():
    s = CosineSchedule.from_settings(OptimSettings(lr=1e-3, min_lr=1e-4, warmup_iters=100, decay_iters=20))
    assert s.warmup_iters == 2 and math.isclose(s(2), 1e-3) and math.isclose(s(20), 1e-4)


@pytest.mark.parametrize(
    "kw, match",
    [(dict(lr=1e-4, min_lr=1e-3), "min_lr"), (dict(lr="fast"), "optim.lr must be a number"),
     (dict(beta2=1.0), "beta"), (dict(warmup_iters=-1), "warmup"), (dict(name="sgd"), "sgd")],
)
def test_bad_optim_settings(kw, match):
    with pytest.raises(TinyGPTError, match=match):
        OptimSettings(**kw)
