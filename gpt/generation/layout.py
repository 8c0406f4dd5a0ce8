"""Weights laid out for decoding on a CPU: each linear layer's weight kept input-major in memory.

Why: a decoding step at batch 1 multiplies one row by every weight matrix, and its speed is how
fast the weights stream from memory. nn.Linear keeps a weight output-major ((out, in), each output's
row contiguous), and MKL's product of a row with such a matrix's transpose reads it slower than
the same matrix stored input-major, which is how transformers' GPT-2 keeps its Conv1D weights.
Measured on the 2-core EPYC this project is timed on (benchmarks/layout.py: fp32, every weight
of the GPT-2 124M shape, so that nothing stays in cache): one row 27.6 -> 21.7 ms a pass, two rows
44.4 -> 31.6 ms, and no slower from 8 to 256 rows; eager decoding at batch 1 went from 0.84x
transformers' `generate` to 1.05x (docs/performance.md). torch has no such switch; the weight
keeps its shape and values and only its strides change, so everything that calls F.linear works
unchanged.

Not on a GPU (cuBLAS reads either layout at the memory's speed) and not before torch.compile
(gpt.generation.compiled rewrites one-row products as reductions tuned to the output-major
layout). Training keeps nn.Linear's layout: this is for a model that only decodes.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def input_major(model: nn.Module) -> int:
    """Store each nn.Linear weight of `model` that lies in CPU memory transposed in memory
    (same shape, same values, strides (1, out)), in place: the Parameter objects stay, so a
    weight tied to the token embedding stays tied (a lookup of one row reads `in` values
    `out` apart, a cost paid once per token, not per weight byte). Returns how many weights
    were re-laid (0 when there is nothing to do: a GPU model, or one laid out already)."""
    moved = 0
    seen: set[int] = set()
    for module in model.modules():
        w = getattr(module, "weight", None) if isinstance(module, nn.Linear) else None
        if not isinstance(w, nn.Parameter) or id(w) in seen:
            continue
        seen.add(id(w))
        # a single row or column is the same in either layout (and would count as re-laid again)
        if w.device.type != "cpu" or w.dim() != 2 or not w.is_contiguous() or min(w.shape) == 1:
            continue
        with torch.no_grad():
            w.data = w.data.t().contiguous().t()
        moved += 1
    return moved
