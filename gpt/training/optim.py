"""Parameter groups, the optimizers (AdamW, and Muon for the hidden matrices) and the learning-rate
schedule every group follows (`CosineSchedule`: linear warmup, cosine decay, a floor).

AdamW is torch.optim.AdamW (its fused kernel where the device has one); Muon is a
torch.optim.Optimizer of its own (see `Muon` for why not torch's; under DDP and FSDP2 its ranks share
the Newton-Schulz work); `Optimizers` holds the run's optimizers as one torch optimizer, and skips a
step on a flag that stays on the device (`Optimizers.step_unless`). Being torch.optim optimizers
costs the first step an import of torch._dynamo (torch.optim's step is wrapped by it), measured
in docs/performance.md; what it buys is everything built on torch.optim.Optimizer: LR schedulers,
a compiled step, ZeRO and FSDP2's DTensor state, torch.distributed.checkpoint's optimizer helpers.
"""

from __future__ import annotations

import math
from collections import ChainMap
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim.optimizer import _get_fused_kernels_supported_devices

from gpt.config import AdamWSettings, MuonSettings
from gpt.errors import TinyGPTError
from gpt.runtime import devices
from gpt.training.parallel import is_sharded, local, shard_like

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


def _closure_loss(closure):
    """torch.optim's step(closure): the loss the closure recomputes (with gradients), if given."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Muon(torch.optim.Optimizer):
    """Muon: momentum (Nesterov), then each matrix's update replaced by the nearest semi-orthogonal
    matrix (all singular values ~1), so every direction of the weight moves at the same rate.

    Why not torch.optim.Muon: it runs Newton-Schulz in bfloat16 always and one matrix at a time.
    On CPUs without native bf16 that is ~10x slower than float32 (and a different result), and a
    small model's many small matrices are cheaper as one batch per shape. Its update rule is the
    same otherwise (Keller Jordan's coefficients and shape scaling, Nesterov, decoupled decay);
    tests/training/test_optim.py holds the two side by side in bfloat16."""

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        ns_steps: int = 5,
        ns_dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
    ):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, "ns_steps": ns_steps})
        self.ns_dtype = ns_dtype  # how the machine computes, not a hyperparameter: kept out of the state dict
        # Where Newton-Schulz runs (the run's device): under FSDP2's cpu_offload the shards and
        # their momentum sit in host memory, and the matrices are orthogonalised on the accelerator.
        self.device = device

    @torch.no_grad()
    def step(self, closure=None, *, found_inf: torch.Tensor | None = None):
        """With `found_inf` (a 0-dim tensor; non-zero: skip), the step moves nothing where the
        flag is set, decided on the device (see `Optimizers.step_unless`)."""
        loss = _closure_loss(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                skip = None if found_inf is None else found_inf.to(local(params[0]).device, non_blocking=True) != 0
                self._update(group, params, skip)
        return loss

    def _update(self, group: dict, params: list[torch.Tensor], skip: torch.Tensor | None) -> None:
        for p in params:
            if "momentum_buffer" not in self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        # Under FSDP2 the arithmetic runs on this process's rows as plain tensors, written through
        # to the shards (DTensor refuses the plain skip flag beside its tensors, and its dispatch
        # would cost every elementwise op); the whole matrices meet only in `_orthogonalized`.
        rows = [local(p) for p in params]
        grads = [local(p.grad) for p in params]
        bufs = [local(self.state[p]["momentum_buffer"]) for p in params]
        lr, momentum, decay = group["lr"], group["momentum"], 1 - group["lr"] * group["weight_decay"]
        if skip is not None:
            # A skipped step, on the device: its gradients are replaced by the momentum (a where,
            # not a product: NaN * 0 is NaN), which leaves the momentum as it was and every value
            # below finite, and then its update is multiplied by 0 and its decay is 1. Where the
            # step is kept, the gradients, the update times 1 and the decay are exactly step()'s.
            grads = [torch.where(skip, buf, grad) for buf, grad in zip(bufs, grads)]
            decay = torch.where(skip, 1.0, decay)
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, bufs, momentum)  # Nesterov: look one step ahead
        if skip is not None:
            torch._foreach_mul_(updates, (~skip).to(updates[0].dtype))  # Newton-Schulz takes 0 to 0
        torch._foreach_mul_(rows, decay)
        ortho = self._orthogonalized(updates, [p.shape for p in params], group["ns_steps"], is_sharded(params[0]))
        for p, row, o in zip(params, rows, ortho):
            # Keller Jordan's scale: tall matrices get sqrt(rows/cols) so their update RMS matches.
            row.add_(o, alpha=-lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))

    def _orthogonalized(self, updates: list[torch.Tensor], shapes: list[torch.Size], steps: int, sharded: bool):
        """Each update (this process's rows of it where `sharded`) orthogonalised as a whole
        matrix: returns the results, cut like `updates`.

        One process orthogonalises everything, matrices of one shape as one batch (a few large
        matmuls instead of many small ones). Several share the work: matrix j (numbered shape by
        shape) is orthogonalised by rank j % N only, and every rank then takes its results in one
        exchange for the whole group (a collective per matrix, ~96 a step at 124M, would each wait
        for the slowest rank). Under DDP every rank holds the same updates (momentum of all-reduced
        gradients): one all-gather hands each rank all the results. Under FSDP2 each rank holds
        rows of every update: one all-to-all brings each matrix's rows to its owner, and one more
        sends each rank its rows of the results. The momentum stays where it is, so the optimizer
        state, and the checkpoint, are what one process would hold."""
        rank, world = _replicas()
        by_shape: dict[torch.Size, list[int]] = {}
        for i, shape in enumerate(shapes):
            by_shape.setdefault(shape, []).append(i)
        numbered = [i for idx in by_shape.values() for i in idx]
        owned = [numbered[r::world] for r in range(world)]  # each rank's share, within one matrix of the others'
        if world == 1:
            mine = {i: u.to(self.device or u.device, non_blocking=True) for i, u in enumerate(updates)}
        elif sharded:
            mine = _rows_to_owners(updates, shapes, owned, self.device)
        else:
            mine = {i: updates[i] for i in owned[rank]}
        done: dict[int, torch.Tensor] = {}
        for idx in by_shape.values():
            idx = [i for i in idx if i in mine]
            if idx:
                done.update(zip(idx, orthogonalize(torch.stack([mine[i] for i in idx]), steps, self.ns_dtype)))
        if world == 1:
            return [done[i].to(u.device) for i, u in enumerate(updates)]  # (to host memory: blocking)
        if sharded:
            return _rows_from_owners(done, updates, shapes, owned)
        return _gathered(done, updates, owned)


def _flat(tensors: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """`tensors` flattened into one contiguous vector (empty where there are none): one message."""
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else like.new_empty(0)


def _gathered(done: dict[int, torch.Tensor], updates: list[torch.Tensor], owned: list[list[int]]) -> list[torch.Tensor]:
    """DDP: this rank's results (`done`) and every other rank's, from one all-gather of equal-size
    messages (a rank with fewer elements pads its own)."""
    rank, world = _replicas()
    sizes = [sum(updates[i].numel() for i in idx) for idx in owned]
    message = updates[0].new_zeros(max(sizes))
    message[: sizes[rank]] = _flat([done[i] for i in owned[rank]], message)
    gathered = message.new_empty(world * message.numel())  # rank r's message at r * len(message)
    # all_gather_single: newer torch's name for all_gather_into_tensor (deprecated in 2.13; older torch has only that).
    exchange = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    exchange(gathered, message)
    out: list[torch.Tensor | None] = [None] * len(updates)
    for r, idx in enumerate(owned):
        offset = r * message.numel()
        for i in idx:
            out[i] = gathered[offset : offset + updates[i].numel()].view(updates[i].shape)
            offset += updates[i].numel()
    return out


def _rows(shape: torch.Size, rank: int, world: int) -> slice:
    """The rows of a `shape` matrix that FSDP2 gives `rank`: torch.chunk's pieces of dim 0."""
    piece = -(-shape[0] // world)
    return slice(min(rank * piece, shape[0]), min((rank + 1) * piece, shape[0]))


def _rows_to_owners(updates: list[torch.Tensor], shapes: list[torch.Size], owned: list[list[int]], device):
    """FSDP2: every rank's rows of each update sent to the matrix's owner (one all-to-all), on
    `device` (the accelerator, also where cpu_offload keeps the rows in host memory); returns
    this rank's matrices whole."""
    rank, world = _replicas()
    for u, shape in zip(updates, shapes):
        part = _rows(shape, rank, world)
        if u.shape[0] != part.stop - part.start:  # FSDP2 cut it another way than this assumes: never mix rows up
            raise TinyGPTError(f"a shard of {tuple(shape)} holds {u.shape[0]} rows on rank {rank}; report this")
    send = _flat([updates[i] for idx in owned for i in idx], updates[0]).to(device or updates[0].device)
    mine = owned[rank]
    from_each = [[_size(shapes[i], r, world) for i in mine] for r in range(world)]  # rank r's rows of mine
    got = send.new_empty(sum(map(sum, from_each)))
    to_each = [sum(_size(shapes[i], rank, world) for i in idx) for idx in owned]
    dist.all_to_all_single(got, send, [sum(sizes) for sizes in from_each], to_each)
    pieces: dict[int, list[torch.Tensor]] = {i: [] for i in mine}
    offset = 0
    for sizes in from_each:  # rank by rank: its rows of each of this rank's matrices, in order
        for i, n in zip(mine, sizes):
            pieces[i].append(got[offset : offset + n].view(-1, shapes[i][1]))
            offset += n
    return {i: torch.cat(p) for i, p in pieces.items()}


def _size(shape: torch.Size, rank: int, world: int) -> int:
    part = _rows(shape, rank, world)
    return (part.stop - part.start) * shape[1]


def _rows_from_owners(done: dict[int, torch.Tensor], updates: list[torch.Tensor], shapes: list[torch.Size], owned):
    """FSDP2: each owner's results (`done`, whole) cut by rows and sent back (one all-to-all);
    returns this rank's rows of every result, where its update lies (host memory under cpu_offload)."""
    rank, world = _replicas()
    mine = owned[rank]
    like = next(iter(done.values())) if done else updates[0]
    send = _flat([done[i][_rows(shapes[i], r, world)] for r in range(world) for i in mine], like)
    got = send.new_empty(sum(updates[i].numel() for idx in owned for i in idx))
    dist.all_to_all_single(
        got,
        send,
        [sum(updates[i].numel() for i in idx) for idx in owned],
        [sum(_size(shapes[i], r, world) for i in mine) for r in range(world)],
    )
    got = got.to(updates[0].device)  # (to host memory: blocking, the rows are read next)
    out: list[torch.Tensor | None] = [None] * len(updates)
    offset = 0
    for idx in owned:
        for i in idx:
            out[i] = got[offset : offset + updates[i].numel()].view(updates[i].shape)
            offset += updates[i].numel()
    return out


def _replicas() -> tuple[int, int]:
    """(rank, world size) of the default process group (DDP's replicas, FSDP2's shards), or (0, 1) alone."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Optimizers(torch.optim.Optimizer):
    """The run's optimizers (torch.optim.AdamW, and Muon with optim=muon) as one torch optimizer,
    for the trainer, GradScaler, the schedule and checkpoints: `param_groups` are the parts' own
    groups (a learning rate set here is theirs), `step` and `zero_grad` cover all of them, and the
    state dict is laid out as one torch optimizer's over every group in order, AdamW's then
    Muon's: the layout of every tinygpt checkpoint so far, read either way. Hyperparameters come
    from the current settings, also on resume: a checkpoint supplies the moments and step
    counts only. (What the container leaves to the parts: torch's hooks on `step` and the
    profiler see one call.)"""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        if not parts:
            raise TinyGPTError("the model has no trainable parameters: nothing to optimize (check finetune.freeze_* settings)")
        self.parts = list(parts)
        # torch's bookkeeping (hooks, the step counter GradScaler and schedulers look for), then
        # the parts' own groups and state in place of the copies it makes
        super().__init__([p for o in self.parts for g in o.param_groups for p in g["params"]], {})
        self.param_groups = [g for o in self.parts for g in o.param_groups]
        self.state = ChainMap(*(o.state for o in self.parts))

    @property
    def ns_dtype(self) -> str | None:
        """Muon's Newton-Schulz dtype ("bfloat16"), None without Muon: a checkpoint records it."""
        return next((str(o.ns_dtype).removeprefix("torch.") for o in self.parts if isinstance(o, Muon)), None)

    def describe(self) -> str:
        """'muon on 16 tensors (786,432 parameters, peak lr 0.02, Newton-Schulz in float32) + ...'"""
        parts = {}
        for g in self.param_groups:
            n, size = parts.get(g["kind"], (0, 0))
            parts[g["kind"]] = (n + len(g["params"]), size + sum(p.numel() for p in g["params"]))
        peak = {g["kind"]: g["base_lr"] for g in self.param_groups}
        ns = self.ns_dtype
        return " + ".join(
            f"{kind} on {n} tensors ({size:,} parameters, peak lr {peak[kind]:g}"
            + (f", Newton-Schulz in {ns})" if kind == "muon" else ")")
            for kind, (n, size) in sorted(parts.items(), key=lambda kv: kv[0] != "muon")
        )

    @torch.no_grad()
    def step(self, closure=None, *, found_inf: torch.Tensor | None = None):
        """Every part steps; with `found_inf`, see `step_unless`."""
        loss = _closure_loss(closure)
        # Exactly 0.0 or 1.0 in float32: what torch's fused kernels compare against (and subtract
        # from their step counters), whatever the caller's dtype or non-zero value.
        skip = None if found_inf is None else (found_inf != 0).to(torch.float32)
        for o in self.parts:
            if skip is None:
                o.step()
            elif isinstance(o, Muon):
                o.step(found_inf=skip)
            elif getattr(o, "_step_supports_amp_scaling", False):
                # torch's fused AdamW (CPU and CUDA): the contract GradScaler uses. The kernel
                # returns early where found_inf is 1, and the step counter it has already
                # advanced is moved back by the flag, all on the device.
                o.found_inf = skip
                try:
                    o.step()
                finally:
                    del o.found_inf
            elif not skip.item():
                # An unfused AdamW (torch has no fused kernel for the device; build_optimizer fuses
                # it on CPU and CUDA) reads the flag on the host: free on a CPU, a sync elsewhere.
                o.step()
        return loss

    def step_unless(self, found_inf: torch.Tensor) -> None:
        """Step, unless `found_inf` (a 0-dim float32 tensor on the device, 1.0 when the step's
        loss or gradient norm is not finite; any non-zero value, or a bool, reads the same) says
        not to: then every parameter and every state tensor (AdamW's moments and step counts,
        Muon's momentum) is left exactly as it was. The flag is never read on the host where
        AdamW is fused (build_optimizer fuses it on CPU and CUDA), so the training loop does not
        wait for the GPU to decide. Under DDP every rank must pass the same flag (all-reduced):
        Muon's ranks exchange results whatever its value, and then each applies it alike."""
        self.step(found_inf=found_inf)

    def state_dict(self) -> dict:
        state, groups, offset = {}, [], 0
        for o in self.parts:
            sd = o.state_dict()
            state.update({offset + int(i): s for i, s in sd["state"].items()})
            groups += [{**g, "params": [offset + i for i in g["params"]]} for g in sd["param_groups"]]
            offset += sum(len(g["params"]) for g in sd["param_groups"])
        return {"state": state, "param_groups": groups}

    def saved_params(self, sd: dict) -> dict[int, torch.Tensor]:
        """The parameter each index of a saved state dict `sd` stands for, where `sd` fits this
        optimizer (the same kinds of groups with as many parameters); else a TinyGPTError."""
        # Checkpoints from torch.optim.AdamW carry no "kind" (they are AdamW's) and may hold an
        # empty group (LoRA trains matrices only), which this class does not keep.
        saved = [g for g in sd["param_groups"] if g["params"]]
        layout = [(g.get("kind", "adamw"), len(g["params"])) for g in saved]
        ours = [(g["kind"], len(g["params"])) for g in self.param_groups]
        if layout != ours:
            trained_with = "muon" if any(kind == "muon" for kind, _ in layout) else "adamw"
            raise TinyGPTError(
                f"the checkpoint's optimizer state does not fit: it holds {layout}, this run has {ours}; resume with "
                f"the optimizer it was trained with (optim={trained_with}) and the same trainable parameters"
            )
        return {old: p for g, s in zip(self.param_groups, saved) for p, old in zip(g["params"], s["params"])}

    def load_state_dict(self, sd: dict) -> None:
        saved = {id(p): old for old, p in self.saved_params(sd).items()}
        for o in self.parts:
            state, groups, new = {}, [], 0
            for g in o.param_groups:
                for param in g["params"]:
                    old = saved[id(param)]
                    if old in sd["state"] or str(old) in sd["state"]:
                        st = sd["state"].get(old, sd["state"].get(str(old)))
                        # copied (the source may be another optimizer's live state, or mapped from a
                        # file), and under FSDP2 cut to this process's shard of the parameter
                        state[new] = {k: shard_like(v, param) if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                    new += 1
                groups.append(
                    {k: v for k, v in g.items() if k != "params"} | {"params": list(range(new - len(g["params"]), new))}
                )
            o.load_state_dict({"state": state, "param_groups": groups})
        self.param_groups = [g for o in self.parts for g in o.param_groups]  # load_state_dict made new group dicts
        self.state = ChainMap(*(o.state for o in self.parts))


def ns_dtype_for(settings: MuonSettings, device: torch.device, recorded: str | None = None) -> torch.dtype:
    """bf16 where the hardware multiplies it natively: CUDA from Ampere (SM 80) on, and CPUs with
    AVX-512 BF16 or AMX (the quickstart's Newton-Schulz 2.7x faster than fp32 on an AVX-512 BF16
    EPYC; its final val 0.005-0.017 above fp32's at equal steps over two seeds, from steps ~15%
    shorter); fp32 elsewhere: older GPUs and CPUs with AVX2 alone emulate bf16, ~10x slower.
    A resumed run (`recorded`: its checkpoint's) keeps its own where this device computes it natively."""
    if settings.ns_dtype != "auto":
        return getattr(torch, settings.ns_dtype)
    if recorded in ("float32", "bfloat16") and devices.native(getattr(torch, recorded), device):
        return getattr(torch, recorded)
    return torch.bfloat16 if devices.native(torch.bfloat16, device) else torch.float32


def build_optimizer(
    model: nn.Module, settings: AdamWSettings, device: torch.device, ns_recorded: str | None = None
) -> Optimizers:
    """`settings` is AdamWSettings (optim=adamw) or MuonSettings (optim=muon). AdamW takes torch's
    fused kernel wherever torch has one for the device (CPU and CUDA included). `ns_recorded`: a
    resumed run's Newton-Schulz dtype (Optimizers.ns_dtype)."""
    groups = [{**g, "lr": g["base_lr"]} for g in param_groups(model, settings) if g["params"]]
    adamw = [g for g in groups if g["kind"] == "adamw"]
    muon = [g for g in groups if g["kind"] == "muon"]
    parts: list[torch.optim.Optimizer] = []
    if adamw:
        fused = device.type in _get_fused_kernels_supported_devices()
        betas = (settings.beta1, settings.beta2)
        parts.append(torch.optim.AdamW(adamw, lr=settings.lr, betas=betas, eps=settings.eps, fused=fused))
    if muon:
        ns_dtype = ns_dtype_for(settings, device, ns_recorded)
        hyper = {"lr": settings.muon_lr, "momentum": settings.momentum, "ns_steps": settings.ns_steps}
        parts.append(Muon(muon, **hyper, ns_dtype=ns_dtype, device=device))
    return Optimizers(parts)


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

    def set_lr(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Every group follows the same curve, scaled to its own peak (Muon's is higher).
        Returns the AdamW learning rate, the one logged."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * lr / self.lr
        return lr
