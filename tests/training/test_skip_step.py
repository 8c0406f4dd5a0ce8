"""Optimizers.step_unless: a step flagged non-finite on the device changes no parameter and no
optimizer state, the next step is the one an optimizer that never saw it takes, and the flag is
not read on the host. Run: pytest tests/training/test_skip_step.py (the CUDA cases are skipped
without a GPU)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpt.config import AdamWSettings, MuonSettings
from gpt.model import GPT, GPTConfig
from gpt.training.optim import build_optimizer

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
]
# weight decay on Muon too (its default is 0), so that a decay left unmasked would show
SETTINGS = {"adamw": AdamWSettings(lr=1e-2), "muon": MuonSettings(lr=1e-2, muon_lr=0.02, weight_decay=0.1)}


def _model_and_optimizer(name: str, device: str):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)).to(device)
    return model, build_optimizer(model, SETTINGS[name], torch.device(device))


def _backward(model, seed: int) -> None:
    x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(seed)).to(next(model.parameters()).device)
    model.zero_grad(set_to_none=True)
    model(x, x.roll(-1, dims=1))[1].backward()


def _copy(sd):
    """A deep copy of a state dict's tensors (the live state changes in place)."""
    if isinstance(sd, dict):
        return {k: _copy(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_copy(v) for v in sd]
    return sd.clone() if isinstance(sd, torch.Tensor) else sd


def _assert_same(a, b, where: str = "") -> None:
    """Equal structure, tensors bitwise (torch.equal: NaN is never equal, so NaN that leaked fails)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def _snapshot(model, opt) -> dict:
    return {"params": _copy(model.state_dict()), "optimizer": _copy(opt.state_dict())}


class _NoHostReads(TorchDispatchMode):
    """Fails any op that hands a tensor's value to Python (item, bool, float, int, is_nonzero,
    equal): on a GPU each of those waits for the device. The CPU stands in for it here."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            raise AssertionError(f"{func} read a tensor on the host during step_unless")
        return func(*args, **(kwargs or {}))


def _no_host_reads(device: str):
    if device == "cuda":
        return _CudaSyncsAreErrors()
    return _NoHostReads()


class _CudaSyncsAreErrors:
    """torch's own check: any operation that synchronises with the GPU raises."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_a_flagged_step_changes_nothing_and_the_next_is_the_unflagged_one(name, device):
    model, opt = _model_and_optimizer(name, device)
    twin, twin_opt = _model_and_optimizer(name, device)  # never sees the flagged step
    zero, one = torch.zeros((), device=device), torch.ones((), device=device)

    # a normal step: step_unless(0) is step(), bitwise
    _backward(model, seed=1)
    opt.step_unless(zero)
    _backward(twin, seed=1)
    twin_opt.step()
    _assert_same(_snapshot(model, opt), _snapshot(twin, twin_opt))

    # the flagged step: half the gradients NaN, half finite (a skip that only NaN would reveal,
    # or only a finite update would, is caught either way)
    before = _snapshot(model, opt)
    _backward(model, seed=2)
    for i, p in enumerate(model.parameters()):
        if i % 2 == 0:
            p.grad.fill_(float("nan"))
    with _no_host_reads(device):
        opt.step_unless(one)
    _assert_same(_snapshot(model, opt), before)

    # the next step, normal again, is the twin's second step
    _backward(model, seed=3)
    with _no_host_reads(device):
        opt.step_unless(zero)
    _backward(twin, seed=3)
    twin_opt.step()
    _assert_same(_snapshot(model, opt), _snapshot(twin, twin_opt))


@pytest.mark.parametrize("flag", [torch.tensor(True), torch.tensor(2.0), torch.tensor(float("nan"))])
def test_any_non_zero_flag_skips(flag):
    """Torch's fused kernel skips only on exactly 1.0 and moves its step counter back by the
    flag's value; a bool, a sum of flags or NaN must skip all the same."""
    model, opt = _model_and_optimizer("muon", "cpu")
    _backward(model, seed=1)
    opt.step()
    before = _snapshot(model, opt)
    _backward(model, seed=2)
    opt.step_unless(flag)
    _assert_same(_snapshot(model, opt), before)


def test_an_unfused_adamw_reads_the_flag_on_the_host_and_skips():
    """A part without torch's fused kernel (not what build_optimizer makes; a device without
    one) still skips, through a host read of the flag."""
    model, opt = _model_and_optimizer("muon", "cpu")
    for group in opt.parts[0].param_groups:
        group["fused"], group["foreach"] = False, True
    del opt.parts[0]._step_supports_amp_scaling
    _backward(model, seed=1)
    opt.step()
    before = _snapshot(model, opt)
    _backward(model, seed=2)
    opt.step_unless(torch.ones(()))
    _assert_same(_snapshot(model, opt), before)
