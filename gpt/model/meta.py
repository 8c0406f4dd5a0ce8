"""Models without memory of their own: a model built as shapes only (`building`), a model's
weights dropped to shapes on the meta device (`to_meta`), or a model built on the meta device
that takes a state dict's own tensors as its weights (`adopt`), with no values computed or
copied first. Weight tying survives both, which
torch's own moves do not (Module.to("meta") and load_state_dict(assign=True) give each module a
parameter of its own)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

# In-place methods that overwrite what they reach (a constant, a copy, random draws): what
# torch.nn.init's fills come down to, and what a build may call on a part of a weight.
OVERWRITES = {
    "fill_", "zero_", "copy_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
    "geometric_", "log_normal_", "cauchy_",
}  # fmt: skip


class _NoFills(TorchFunctionMode):
    """torch.nn.init's fills of a meta tensor skipped, and the overwriting methods they come down
    to: they give it no values anyway, but torch runs a meta tensor's normal_ through its Python
    reference, whose first call imports torch._dynamo (0.3 s of every sample, eval, serve and
    export start, which build the model on the meta device before taking the checkpoint's
    weights)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if isinstance(target, torch.Tensor) and target.is_meta:
            if getattr(func, "__module__", None) == "torch.nn.init" or getattr(func, "__name__", "") in OVERWRITES:
                return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def building():
    """Modules built inside have shapes only: torch.device("meta"), their initialisation skipped."""
    with torch.device("meta"), _NoFills():
        yield


def _places(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Where each parameter sits: [(module, attribute name), ...] per parameter, a tied one's
    every place in one list."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                places.setdefault(id(p), []).append((module, name))
    return list(places.values())


def tied_names(model: nn.Module) -> dict[str, str]:
    """{name: the parameter's first name} for each parameter reached under a second name (a tied
    LM head: {"lm_head.weight": "transformer.wte.weight"})."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        first.setdefault(id(p), name)
    return aliases


def _retie(places: list[list[tuple[nn.Module, str]]]) -> None:
    for (first, name), *others in places:
        for module, other in others:
            setattr(module, other, getattr(first, name))


def to_meta(model: nn.Module) -> None:
    """`model`'s weights dropped, their shapes kept on the meta device as a model built there
    holds them: contiguous and float32 (a base mapped from its file may hold bf16, or GPT-2's
    weights as transposed views, which FSDP2 refuses to shard), tied weights still one parameter."""
    places = _places(model)
    model.to("meta")
    for (first, name), *others in places:
        p = getattr(first, name)
        dtype = torch.promote_types(p.dtype, torch.float32) if p.is_floating_point() else p.dtype
        fresh = nn.Parameter(torch.empty(p.shape, dtype=dtype, device="meta"), requires_grad=p.requires_grad)
        for module, attr in ((first, name), *others):
            setattr(module, attr, fresh)


def adopt(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True, copy: bool = False):
    """`model`, built on the meta device, given `state`'s tensors themselves as its weights (in
    their dtype, on their device; a file's mapped pages stay mapped: nothing is read until used),
    or with `copy` private contiguous copies in the model's own dtypes (what load_state_dict into
    a built model gives, without building values first: no initialisation drawn from the random
    generator, or computed, only to be overwritten); tied weights tied again, and its fixed tables
    (position tables, which no state dict holds) computed beside them. Returns load_state_dict's
    missing and unexpected keys; a shape that does not fit raises its RuntimeError."""
    places = _places(model)
    if copy:
        dtypes = {k: t.dtype for k, t in model.state_dict().items()}
        # a tied weight is copied once, under its first name: the others are re-tied to it below
        # (a file may hold it as two tensors: torch.load gives the tied keys one object each)
        alias = {name: first for name, first in tied_names(model).items() if first in state}
        copies = {
            k: v.to(dtypes.get(k, v.dtype), copy=True, memory_format=torch.contiguous_format)
            for k, v in state.items()
            if isinstance(v, torch.Tensor) and k not in alias
        }
        state = {k: copies.get(alias.get(k, k), v) for k, v in state.items()}
    result = model.load_state_dict(state, strict=strict, assign=True)
    _retie(places)
    device = next((t.device for t in state.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    for name, table in getattr(model, "fixed_tables", dict)().items():
        setattr(model, name, table.to(device))
    return result
