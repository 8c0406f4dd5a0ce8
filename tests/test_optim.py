"""Optimizer groups and the LR schedule. Run: pytest tests/test_optim.py"""

import math

import pytest
import torch

from gpt.config import OPTIMIZERS, AdamWSettings, MuonSettings
from gpt.errors import TinyGPTError
from gpt.model import GPT, GPTConfig
from gpt.model.lora import apply_lora
from gpt.model.registry import build, config_from_dict
from gpt.training.optim import CosineSchedule, Muon, build_optimizer, hidden_matrices, ns_dtype_for, orthogonalize, param_groups


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16))
    decay, no_decay = param_groups(model, AdamWSettings(weight_decay=0.1))
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    total = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert total == model.num_params()  # every parameter once, the tied one included


def test_warmup_then_cosine_then_floor():
    s = CosineSchedule(lr=1e-3, min_lr=1e-4, warmup_iters=10, decay_iters=110)
    assert s(0) < s(5) < s(9) <= 1e-3
    assert math.isclose(s(10), 1e-3)
    assert math.isclose(s(60), 1e-4 + 0.5 * (1e-3 - 1e-4))  # halfway down the cosine
    assert math.isclose(s(110), 1e-4) and math.isclose(s(500), 1e-4)
    assert all(s(i) >= s(i + 1) for i in range(10, 120))


def test_warmup_longer_than_schedule_is_shortened():
    s = CosineSchedule.from_settings(AdamWSettings(lr=1e-3, min_lr=1e-4, warmup_iters=100, decay_iters=20), max_iters=5000)
    assert s.warmup_iters == 2 and math.isclose(s(2), 1e-3) and math.isclose(s(20), 1e-4)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lr=1e-4, min_lr=1e-3), "min_lr"),
        (dict(lr="fast"), "optim.lr must be a number"),
        (dict(beta2=1.0), "beta"),
        (dict(warmup_iters=-1), "warmup"),
        (dict(name="sgd"), "sgd"),
        (dict(muon_lr=0), "muon_lr"),
        (dict(ns_dtype="fp8"), "ns_dtype"),
        (dict(weight_decay=-1), "weight_decay"),
    ],
)
def test_bad_optim_settings(kw, match):
    with pytest.raises(TinyGPTError, match=match):
        MuonSettings(**kw)


def _tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16))


def _train(model, opt, steps: int, lr_of=lambda step: None, seed: int = 1, start: int = 0) -> list[float]:
    """Steps start..steps-1 of a seeded batch stream (the first `start` batches are skipped)."""
    g = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        x = torch.randint(0, 32, (4, 8), generator=g)
        if step < start:
            continue
        _, loss = model(x, x.roll(-1, dims=1))
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = lr_of(step) or group["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_adamw_matches_torch_and_resumes_from_its_state():
    """Same kernel as torch.optim.AdamW(fused=True), so the same trajectory; and a state_dict
    written by torch.optim (older tinygpt checkpoints) continues here as it would have there."""
    settings = AdamWSettings(lr=3e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
    ours_model, ref_model = _tiny_gpt(), _tiny_gpt()
    ours = build_optimizer(ours_model, settings, torch.device("cpu"))
    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in param_groups(ref_model, settings)]
    ref = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
    lr_of = lambda step: 3e-3 * (0.9**step)  # noqa: E731  a changing lr, as the schedule does
    assert _train(ours_model, ours, 6, lr_of) == pytest.approx(_train(ref_model, ref, 6, lr_of), rel=1e-6)
    for a, b in zip(ours_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)

    # torch's state_dict -> ours, then both go on: still together
    resumed = build_optimizer(ref_model_copy := _tiny_gpt(), settings, torch.device("cpu"))
    ref_model_copy.load_state_dict(ref_model.state_dict())
    resumed.load_state_dict(ref.state_dict())
    later = lambda step: 1e-3  # noqa: E731
    assert _train(ref_model_copy, resumed, 4, later, seed=2) == pytest.approx(_train(ref_model, ref, 4, later, seed=2), rel=1e-6)


def test_optimizer_state_round_trip_continues_exactly():
    settings = MuonSettings(lr=3e-3, muon_lr=0.02)
    full_model = _tiny_gpt()
    full = build_optimizer(full_model, settings, torch.device("cpu"))
    full_losses = _train(full_model, full, 10)

    model = _tiny_gpt()
    opt = build_optimizer(model, settings, torch.device("cpu"))
    first = _train(model, opt, 5)
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    model2 = _tiny_gpt(seed=7)
    model2.load_state_dict(saved_model)
    opt2 = build_optimizer(model2, settings, torch.device("cpu"))
    opt2.load_state_dict(saved_opt)
    rest = _train(model2, opt2, 10, start=5)
    assert first + rest == full_losses  # bitwise


def test_muon_takes_the_hidden_matrices_only():
    model = _tiny_gpt()
    groups = param_groups(model, MuonSettings())
    muon = {id(p) for g in groups if g["kind"] == "muon" for p in g["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in muon}
    assert names == {
        f"transformer.h.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }
    assert sum(p.numel() for g in groups for p in g["params"]) == model.num_params()  # all, once
    adamw_only = param_groups(model, AdamWSettings())
    assert [g["kind"] for g in adamw_only] == ["adamw", "adamw"]

    lora_model = _tiny_gpt()  # adapters are low-rank factors: AdamW's
    apply_lora(lora_model, rank=2, alpha=4)
    for name, p in lora_model.named_parameters():
        p.requires_grad_(".lora_" in name)
    lora_groups = param_groups(lora_model, MuonSettings())
    assert [g["kind"] for g in lora_groups if g["params"]] == ["adamw"]

    rnn = build(config_from_dict({"arch": "lstm", "vocab_size": 32, "n_embd": 16, "n_hidden": 24, "n_layer": 2}))
    muon = {id(p) for g in param_groups(rnn, MuonSettings()) if g["kind"] == "muon" for p in g["params"]}
    assert {n for n, p in rnn.named_parameters() if id(p) in muon} == {
        f"rnn.weight_{k}_l{i}" for k in ("ih", "hh") for i in range(2)
    }


@pytest.mark.parametrize("shape", [(3, 48, 16), (2, 16, 40)])  # tall and wide
def test_newton_schulz_makes_singular_values_near_one(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 5
    o = orthogonalize(g, steps=5, dtype=torch.float32)
    s = torch.linalg.svdvals(o)
    assert o.shape == g.shape and o.dtype == g.dtype
    assert s.min() > 0.5 and s.max() < 1.3  # Muon's quintic lands in roughly [0.7, 1.2], not exactly 1
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    cos = (o * (u @ vh)).sum(dim=(-2, -1)) / (o.norm(dim=(-2, -1)) * (u @ vh).norm(dim=(-2, -1)))
    assert (cos > 0.98).all()  # pointing where U V^T points


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason=f"torch {torch.__version__} has no torch.optim.Muon (2.9 on)")
def test_muon_step_matches_torch_muon():
    """Our Muon against torch.optim.Muon on the same matrices: the same update rule (Keller
    Jordan's coefficients and shape scaling, Nesterov, decoupled decay) once ours runs
    Newton-Schulz in bfloat16 as torch's always does."""
    ours_model, ref_model = _tiny_gpt(), _tiny_gpt()
    names = [n for n, p in ours_model.named_parameters() if p in hidden_matrices(ours_model)]
    for model in (ours_model, ref_model):  # only the matrices train, so both see the same gradients
        for n, p in model.named_parameters():
            p.requires_grad_(n in names)
    ours_params, ref_params = dict(ours_model.named_parameters()), dict(ref_model.named_parameters())
    ours = Muon([ours_params[n] for n in names], lr=0.02, momentum=0.95, weight_decay=0.1, ns_dtype=torch.bfloat16)
    ref = torch.optim.Muon([ref_params[n] for n in names], lr=0.02, weight_decay=0.1, momentum=0.95)
    _train(ours_model, ours, 3), _train(ref_model, ref, 3)
    for n in names:
        # same bf16 arithmetic: equal here; the steps themselves move weights by ~1e-2
        torch.testing.assert_close(ours_params[n], ref_params[n], rtol=0, atol=1e-6)
    start = dict(_tiny_gpt().named_parameters())
    assert all((ref_params[n] - start[n]).abs().max() > 5e-3 for n in names)


def test_ns_precision_follows_the_device(monkeypatch):
    s = MuonSettings()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)  # AVX2 or plain AVX-512
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert ns_dtype_for(s, torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)  # Zen 4, Cooper Lake on
    assert ns_dtype_for(s, torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)  # Sapphire Rapids on
    assert ns_dtype_for(s, torch.device("cpu")) == torch.bfloat16
    assert ns_dtype_for(s, torch.device("mps")) == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # H100/H200
    assert ns_dtype_for(s, torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # T4: emulated bf16
    assert ns_dtype_for(s, torch.device("cuda")) == torch.float32
    assert ns_dtype_for(MuonSettings(ns_dtype="bfloat16"), torch.device("cpu")) == torch.bfloat16
    # a resumed run keeps its checkpoint's where this device computes it natively, else the rule's
    assert ns_dtype_for(s, torch.device("cuda"), recorded="bfloat16") == torch.float32  # the T4 would emulate it
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert ns_dtype_for(s, torch.device("cpu"), recorded="float32") == torch.float32
    assert ns_dtype_for(s, torch.device("cpu"), recorded="bfloat16") == torch.bfloat16
    assert ns_dtype_for(MuonSettings(ns_dtype="bfloat16"), torch.device("cpu"), recorded="float32") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    line = build_optimizer(_tiny_gpt(), s, torch.device("cpu")).describe()  # what the trainer prints
    assert line.startswith("muon on 8 tensors (6,144 parameters, peak lr 0.02, Newton-Schulz in float32) + adamw on 20 tensors")


def test_resuming_with_another_optimizer_is_a_clear_error():
    model = _tiny_gpt()
    adamw = build_optimizer(model, AdamWSettings(), torch.device("cpu"))
    _train(model, adamw, 1)
    muon = build_optimizer(model, MuonSettings(), torch.device("cpu"))
    with pytest.raises(TinyGPTError, match="optim=adamw"):
        muon.load_state_dict(adamw.state_dict())


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_optimizer_is_a_torch_optimizer_that_schedulers_drive(name):
    """What the ecosystem builds on torch.optim.Optimizer works on ours: an LR scheduler sets the
    groups' learning rates (the parts' own groups, so the parts step with them), and AdamW is
    torch.optim.AdamW with its fused kernel on this CPU."""
    model = _tiny_gpt()
    opt = build_optimizer(model, OPTIMIZERS[name](), torch.device("cpu"))
    assert isinstance(opt, torch.optim.Optimizer)
    adamw = [o for o in opt.parts if isinstance(o, torch.optim.AdamW)]
    assert len(adamw) == 1 and all(g["fused"] for g in adamw[0].param_groups)
    assert [type(o).__name__ for o in opt.parts] == (["AdamW", "Muon"] if name == "muon" else ["AdamW"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        model(x, x)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        scheduler.step()
    assert all(g["lr"] == pytest.approx(g["initial_lr"] / 4) for o in opt.parts for g in o.param_groups)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_grad_scaler_steps_and_skips_with_our_optimizer(name):
    """fp16 training on older GPUs goes through GradScaler: it must unscale our groups, step on
    finite gradients and skip (and lower the scale) on overflow. The CPU scaler runs the same code."""
    model = _tiny_gpt()
    opt = build_optimizer(model, OPTIMIZERS[name](), torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    for poison, should_move in ((1.0, True), (float("inf"), False)):
        before = [p.clone() for p in model.parameters()]
        scaler.scale(model(x, x)[1] * poison).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())) == should_move
    assert scaler.get_scale() == 2.0**9


def test_torch_state_with_an_empty_group_resumes():
    """Older LoRA checkpoints: torch.optim kept the (empty) no-decay group; this class drops it."""
    model = _tiny_gpt()
    for p in model.parameters():
        p.requires_grad_(p.dim() == 2)  # matrices only, as LoRA's adapters
    mats = [p for p in model.parameters() if p.requires_grad]
    ref = torch.optim.AdamW([{"params": mats, "weight_decay": 0.1}, {"params": [], "weight_decay": 0.0}], lr=1e-3)
    _train(model, ref, 2)
    ours = build_optimizer(model, AdamWSettings(), torch.device("cpu"))
    assert [len(g["params"]) for g in ours.param_groups] == [len(mats)]
    ours.load_state_dict(ref.state_dict())
    assert all(torch.equal(ours.state[p]["exp_avg"], ref.state[p]["exp_avg"]) for p in mats)
