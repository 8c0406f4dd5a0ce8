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

from gpt.errors import TinyGPTError

# In-place methods that overwrite what they reach (a constant, a copy, random draws): what
# torch.nn.init's fills come down to, and what a build may call on a part of a weight.
OVERWRITES = {
    "fill_", "zero_", "copy_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
    "geometric_", "log_normal_", "cauchy_",
}  # fmt: skip
# In-place methods that change no values.
NO_VALUES = {"requires_grad_", "share_memory_", "retain_grad"}


def _changes_values(name: str) -> bool:
    """Whether an in-place method of this name changes a tensor's values (`mul_`, `p[0] = 1`)."""
    in_place = name.endswith("_") and not name.startswith("_")
    return (in_place and name not in NO_VALUES) or name == "__setitem__" or (name.startswith("__i") and name.endswith("__"))


class _NoFills(TorchFunctionMode):
    """torch.nn.init's fills of a meta tensor skipped, and the overwriting methods they come down
    to: they give it no values anyway, but torch runs a meta tensor's normal_ through its Python
    reference, whose first call imports torch._dynamo (0.3 s of every sample, eval, serve and
    export start, which build the model on the meta device before taking the checkpoint's
    weights). With `fills`, each skipped fill is recorded there in order (its function, its
    tensor, its arguments): what a build with memory would have done, to be replayed later
    (`named_fills`); so is any other in-place change of a meta tensor's values (run as ever),
    which no replay could make."""

    def __init__(self, fills: list | None = None):
        super().__init__()
        self.fills = fills

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        target = args[0] if args else kwargs.get("tensor")
        if isinstance(target, torch.Tensor) and target.is_meta:
            rest = (tuple(args[1:]), {k: v for k, v in kwargs.items() if k != "tensor"})
            if getattr(func, "__module__", None) == "torch.nn.init" or name in OVERWRITES:
                if self.fills is not None:
                    self.fills.append(("fill", func, target, *rest))
                return target
            if self.fills is not None and _changes_values(name):
                self.fills.append(("change", func, target, *rest))
        return func(*args, **kwargs)


@contextlib.contextmanager
def building(fills: list | None = None):
    """Modules built inside have shapes only: torch.device("meta"), their initialisation skipped
    (and recorded into `fills` when given: see `named_fills`)."""
    with torch.device("meta"), _NoFills(fills):
        yield


def named_fills(model: nn.Module, fills: list) -> list[tuple]:
    """The initialisation recorded while `model` was built (`building(fills)`) as
    [(parameter name or None, fill, the filled tensor's shape, dtype, its place in the parameter
    or None, args, kwargs), ...] in the order it ran, which is the order a build with memory draws
    its random numbers in: replayed on whole tensors from the same generator state, it gives the
    same values. A fill reaches its parameter through the parameter's storage, so a fill of a
    part (an embedding's padding row zeroed) or through `.data` counts; its place is (size,
    stride, offset) where it covers less than the whole parameter. None names a tensor the model
    no longer holds (an LM head's own weight, drawn before the head was tied to the embedding):
    its draws still count. A parameter changed in place otherwise (`p.data.mul_(2)`), or filled
    from a meta tensor, cannot be replayed: refused here, never started with other values."""
    held = {p.untyped_storage()._cdata: (name, p) for name, p in model.named_parameters()}
    out = []
    for kind, func, t, args, kwargs in fills:
        name, p = held.get(t.untyped_storage()._cdata, (None, None))
        unreplayable = kind == "change" or any(isinstance(a, torch.Tensor) and a.is_meta for a in (*args, *kwargs.values()))
        if name is not None and unreplayable:
            raise TinyGPTError(
                f"{name}: the model's construction changes it in place ({getattr(func, '__name__', func)}), which a "
                "sharded start cannot replay; use distributed=ddp, or report this"
            )
        if unreplayable:
            continue  # a tensor the model does not hold: nothing of it is kept
        whole = p is None or (t.shape == p.shape and t.stride() == p.stride() and t.storage_offset() == p.storage_offset())
        place = None if whole else (t.shape, t.stride(), t.storage_offset() - p.storage_offset())
        out.append((name, func, t.shape, t.dtype, place, args, kwargs))
    return out


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
