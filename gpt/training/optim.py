"""Parameter groups, the optimizers (AdamW, and Muon for hidden matrices) and the LR schedule.

Why not torch.optim: its `Optimizer` imports torch._dynamo the first time a group is added or a
step is taken, even when nothing is compiled. That import costs ~70 MB of resident memory and
~0.8 s, a fifth of the CPU quickstart's footprint. The update rules here call the same fused
AdamW kernel torch.optim uses, and their state_dict has torch's layout, so checkpoints written
with torch.optim.AdamW resume here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt.config import AdamWSettings, MuonSettings
from gpt.errors import TinyGPTError

# Newton-Schulz quintic coefficients from Keller Jordan's Muon: they push every singular value
# of the normalised matrix towards 1 in 5 steps, without needing to converge exactly.
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def hidden_matrices(model: nn.Module) -> set[nn.Parameter]:
    """The 2-D weights inside the network: not the token embedding or the LM head (tied or not),
    which map between the vocabulary and the residual stream and are better left to AdamW, and
    not LoRA's low-rank factors (rank x d: orthogonalising those rescales the adapter, it does
    not condition a weight matrix's update)."""
    edge = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or name.split(".")[-1] == "lm_head":
            edge.update(module.parameters(recurse=False))
    lora = {p for name, p in model.named_parameters() if ".lora_" in f".{name}"}
    return {p for p in model.parameters() if p.dim() == 2 and p not in edge and p not in lora}


def param_groups(model: nn.Module, settings: AdamWSettings) -> list[dict]:
    """AdamW decays only matrices (weights, embeddings); biases and LayerNorm gains stay free,
    since shrinking them towards zero only hurts. With optim=muon the hidden matrices form a
    group of their own, updated by Muon at `muon_lr`."""
    muon = hidden_matrices(model) if settings.name == "muon" else set()
    trainable = [p for p in model.parameters() if p.requires_grad]  # .parameters() yields a tied weight once
    groups = [
        {
            "kind": "adamw",
            "base_lr": settings.lr,
            "weight_decay": settings.weight_decay,
            "params": [p for p in trainable if p.dim() >= 2 and p not in muon],
        },
        {"kind": "adamw", "base_lr": settings.lr, "weight_decay": 0.0, "params": [p for p in trainable if p.dim() < 2]},
    ]
    if muon:
        groups.append(
            {
                "kind": "muon",
                "base_lr": settings.muon_lr,
                "weight_decay": settings.weight_decay,
                "params": [p for p in trainable if p in muon],
            }
        )
    return groups


class Optimizer:
    """AdamW and Muon groups behind the interface the trainer, GradScaler and DDP use from
    torch.optim: param_groups (each with its "lr"), state, step, zero_grad, state_dict and
    load_state_dict. Hyperparameters come from the current settings, also on resume: a
    checkpoint supplies the moments and step counts only."""

    def __init__(self, groups: list[dict], settings: AdamWSettings, ns_dtype: torch.dtype):
        self.settings = settings
        self.ns_dtype = ns_dtype
        self.param_groups = [{**g, "lr": g["base_lr"]} for g in groups if g["params"]]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def describe(self) -> str:
        """'muon on 16 tensors (786,432 parameters, peak lr 0.02, Newton-Schulz in float32) + ...'"""
        parts = {}
        for g in self.param_groups:
            n, size = parts.get(g["kind"], (0, 0))
            parts[g["kind"]] = (n + len(g["params"]), size + sum(p.numel() for p in g["params"]))
        peak = {g["kind"]: g["base_lr"] for g in self.param_groups}
        return " + ".join(
            f"{kind} on {n} tensors ({size:,} parameters, peak lr {peak[kind]:g}"
            + (f", Newton-Schulz in {str(self.ns_dtype).removeprefix('torch.')})" if kind == "muon" else ")")
            for kind, (n, size) in sorted(parts.items(), key=lambda kv: kv[0] != "muon")
        )

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._adamw if group["kind"] == "adamw" else self._muon)(group, params)

    def _adamw(self, group: dict, params: list[torch.Tensor]) -> None:
        s = self.settings
        for p in params:
            if p not in self.state:
                # torch's layout: a float32 step count, on the parameter's device for the fused kernel
                self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p),
                    "exp_avg_sq": torch.zeros_like(p),
                }
        states = [self.state[p] for p in params]
        steps = [st["step"] for st in states]
        torch._foreach_add_(steps, 1)
        # One kernel for the whole group: decay, both moments, bias correction, update.
        torch._fused_adamw_(
            params,
            [p.grad for p in params],
            [st["exp_avg"] for st in states],
            [st["exp_avg_sq"] for st in states],
            [],
            steps,
            lr=group["lr"],
            beta1=s.beta1,
            beta2=s.beta2,
            weight_decay=group["weight_decay"],
            eps=s.eps,
            amsgrad=False,
            maximize=False,
        )

    def _muon(self, group: dict, params: list[torch.Tensor]) -> None:
        """Momentum, then replace each matrix's update by the nearest semi-orthogonal matrix
        (all singular values ~1), so every direction of the weight moves at the same rate."""
        s = self.settings
        for p in params:
            if p not in self.state:
                self.state[p] = {"momentum_buffer": torch.zeros_like(p)}
        grads = [p.grad for p in params]
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - s.momentum)
        updates = torch._foreach_lerp(grads, bufs, s.momentum)  # Nesterov: look one step ahead
        torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        # Matrices of one shape go through Newton-Schulz as one batch: a few large matmuls
        # instead of many small ones.
        by_shape: dict[torch.Size, list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(p.shape, []).append(i)
        for shape, idx in by_shape.items():
            ortho = orthogonalize(torch.stack([updates[i] for i in idx]), s.ns_steps, self.ns_dtype)
            # Keller Jordan's scale: tall matrices get sqrt(rows/cols) so their update RMS matches.
            scale = math.sqrt(max(1.0, shape[0] / shape[1]))
            for j, i in enumerate(idx):
                params[i].add_(ortho[j], alpha=-group["lr"] * scale)

    def state_dict(self) -> dict:
        index = {p: i for i, p in enumerate(self._params())}
        return {
            "state": {index[p]: dict(st) for p, st in self.state.items()},
            "param_groups": [
                {**{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                for g in self.param_groups
            ],
        }

    def load_state_dict(self, sd: dict) -> None:
        saved = sd["param_groups"]
        # Checkpoints from torch.optim.AdamW carry no "kind" (they are AdamW's) and may hold an
        # empty group (LoRA trains matrices only), which this class does not keep.
        layout = [(g.get("kind", "adamw"), len(g["params"])) for g in saved if g["params"]]
        ours = [(g["kind"], len(g["params"])) for g in self.param_groups]
        if layout != ours:
            trained_with = "muon" if any(kind == "muon" for kind, _ in layout) else "adamw"
            raise TinyGPTError(
                f"the checkpoint's optimizer state does not fit: it holds {layout}, this run has {ours}; resume with "
                f"the optimizer it was trained with (optim={trained_with}) and the same trainable parameters"
            )
        params = self._params()
        self.state = {}
        for i, st in sd["state"].items():
            p = params[int(i)]
            # copied: the source may be another optimizer's live state
            self.state[p] = {k: v.to(p.device, dtype=torch.float32 if k == "step" else p.dtype, copy=True) for k, v in st.items()}


def ns_dtype_for(settings: MuonSettings, device: torch.device) -> torch.dtype:
    """bf16 where the hardware has it natively (CUDA from Ampere, SM 80, on); fp32 elsewhere:
    older GPUs and CPUs without native bf16 (AVX2) emulate it, ~10x slower than fp32 here."""
    if settings.ns_dtype != "auto":
        return getattr(torch, settings.ns_dtype)
    native = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)
    return torch.bfloat16 if native else torch.float32


def build_optimizer(model: nn.Module, settings: AdamWSettings, device: torch.device) -> Optimizer:
    """`settings` is AdamWSettings (optim=adamw) or MuonSettings (optim=muon)."""
    ns_dtype = ns_dtype_for(settings, device) if isinstance(settings, MuonSettings) else torch.float32
    return Optimizer(param_groups(model, settings), settings, ns_dtype)


@torch.no_grad()
def orthogonalize(g: torch.Tensor, steps: int, dtype: torch.dtype, eps: float = 1e-7) -> torch.Tensor:
    """Approximate U V^T of each matrix's SVD U S V^T in a (batch, rows, cols) stack, by a
    quintic Newton-Schulz iteration (Muon's zeroth power). Returns g's dtype."""
    a, b, c = NS_COEFFS
    x = g.to(dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide form: X X^T is then the smaller Gram matrix
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)  # singular values <= 1
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return (x.mT if tall else x).to(g.dtype)


@dataclass
class CosineSchedule:
    """Linear warmup from 0 to `lr`, then cosine decay to `min_lr` at `decay_iters`, then flat."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int

    @classmethod
    def from_settings(cls, s: AdamWSettings, max_iters: int) -> CosineSchedule:
        """Decay over `optim.decay_iters`, or over the whole run (`max_iters`) when that is null,
        down to `optim.min_lr`, or to lr * `optim.min_lr_ratio` when that is null."""
        decay = s.decay_iters or max_iters
        # A warmup as long as the whole schedule (a 20-step smoke run of a recipe that warms up
        # for 100) would never reach the peak: warm up for a tenth of the schedule instead.
        warmup = s.warmup_iters if s.warmup_iters < decay else decay // 10
        floor = s.min_lr if s.min_lr is not None else s.lr * s.min_lr_ratio
        return cls(lr=s.lr, min_lr=floor, warmup_iters=warmup, decay_iters=decay)

    def __call__(self, step: int) -> float:
        if step < self.warmup_iters:
            return self.lr * (step + 1) / (self.warmup_iters + 1)
        if step >= self.decay_iters:
            return self.min_lr
        progress = (step - self.warmup_iters) / max(1, self.decay_iters - self.warmup_iters)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def set_lr(self, optimizer: Optimizer, step: int) -> float:
        """Every group follows the same curve, scaled to its own peak (Muon's is higher).
        Returns the AdamW learning rate, the one logged."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * lr / self.lr
        return lr
