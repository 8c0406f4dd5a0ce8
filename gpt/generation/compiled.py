"""torch.compile for decoding (sample.py's compile=true), and on a CPU one rewrite before
inductor: a linear layer applied to a single row becomes a multiply-and-sum.

Why: at batch 1 every decoding step multiplies one row by each weight matrix, a matrix-vector
product whose speed is how fast the weights stream from memory. Inductor hands every matmul to
MKL, whose matrix-vector product reads fp32 weights at 12-22 GB/s on the 2-core EPYC we measure
on; the same product spelled (x * W).sum(-1) compiles to inductor's own vectorised reduction,
which reads them at ~35 GB/s, what a plain sum over the weights reaches (benchmarks/
generate_vs_hf.py: the GPT-2 124M shape decodes 2.2x faster than eager at batch 1). torch has
no switch for it: inductor's own decomposition of mm rewrites only vector-vector products on a
CPU. Batches of several rows keep MKL's matrix product, which reads each weight once for all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F

_LINEARS = (F.linear, torch._C._nn.linear)


def compile_for_generation(model, backend: str | Callable | None = None, graphs: int | None = None) -> None:
    """torch.compile the model's forward in place, for decoding. The compiled forward is traced
    once for a prompt and once for one-token calls, not once per token: the decoder's cache
    (gpt.model.cache.StaticKVCache) keeps its shapes and holds its position in a tensor, and the
    serving engine's growing KVCache has a length that is symbolic (dynamic=True) rather than a
    value the graph is guarded on (a window re-encoded past the context is a prompt too: see
    gpt.model.cache.SPARE). The decoder hands the model fresh input tensors, whose strides do not
    change from step to step (see decoder._fresh). `backend`:
    inductor, with the one-row rewrite on a CPU (None), or any torch.compile backend.

    `graphs`: how many compiled variants this model keeps, counted apart from any other compiled
    model's. By default torch keeps 8 per function, shared by every model whose forward it is,
    and runs calls of any further shape eagerly; a serving engine's steps take up to 8 shapes
    per model (gpt.serve.engine.Engine.warm_up). torch.compile takes the count from 2.13 on; before,
    the default stands. (Setting torch._dynamo.config.recompile_limit instead does not do: in
    2.13 a setting made in one thread is not seen by another, such as a server's engine.)"""
    if backend is None:
        backend = cpu_decoding_backend if next(model.parameters()).device.type == "cpu" else "inductor"
    kwargs = {}
    if graphs is not None and "isolate_recompiles" in inspect.signature(torch.compile).parameters:
        kwargs = dict(recompile_limit=graphs, isolate_recompiles=True)
    model.compile(dynamic=True, backend=backend, **kwargs)


def cpu_decoding_backend(gm: fx.GraphModule, example_inputs) -> Callable:
    """Inductor, after `rows_as_reductions`. The rewritten graph is what inductor's caches key
    on, so a cached plain compile of the same model is never served in its place."""
    from torch._inductor.compile_fx import compile_fx

    rows_as_reductions(gm)
    return compile_fx(gm, example_inputs)


def rows_as_reductions(gm: fx.GraphModule) -> int:
    """Replace each fp32 CPU linear layer whose input is statically a single row (batch 1, one
    new position: dynamo specialises sizes of 1) by `row_linear`. Graphs traced under autocast
    (entered around the call, which dynamo guards on, or enabled inside it) are left as they
    are: there the matmul's dtype is autocast's to choose. Returns how many were replaced."""
    nodes = list(gm.graph.nodes)
    if torch.is_autocast_enabled("cpu") or any(_enables_autocast(n) for n in nodes):
        return 0
    replaced = 0
    for node in nodes:
        if node.op != "call_function" or node.target not in _LINEARS:
            continue
        if len(node.args) < 2 or set(node.kwargs) - {"bias"}:  # as the model calls it: (x, weight[, bias])
            continue
        x, w = (a.meta.get("example_value") if isinstance(a, fx.Node) else None for a in node.args[:2])
        if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or w.dim() != 2:
            continue
        if x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != torch.float32:
            continue
        if not all(isinstance(d, int) and d == 1 for d in x.shape[:-1]):
            continue
        with gm.graph.inserting_after(node):
            new = gm.graph.call_function(row_linear, node.args, node.kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def _enables_autocast(node: fx.Node) -> bool:
    """Whether the node enters an autocast region that is on (a recurrent model enters one with
    enabled=False around its fp32 recurrence)."""
    if node.op != "call_function" or node.target is not torch.amp.autocast_mode._enter_autocast:
        return False
    enabled = node.args[2] if len(node.args) > 2 else node.kwargs.get("enabled", True)
    return bool(enabled)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear as a multiply-and-sum over the input dimension (equal within float rounding)."""
    y = (x.unsqueeze(-2) * weight).sum(-1)
    return y if bias is None else y + bias
