"""Compute accounting: what a run costs in training FLOPs, and a horizon given as compute.

The formula is written once, in the model (`GPT.flops_per_token`, PaLM's appendix B):

    C_token = 6 N + 12 n_layer n_head head_dim T

N counts the weights that multiply (every parameter except the lookup tables: the position table
and an untied token table; a tied token table is also the LM head, so it counts once). 6 = 2 for
the forward multiply-add and 4 for the backward pass (gradients of activations and of weights).
The second term is the attention's QK^T and AV matmuls over the full T x T grid: the causal
mask's zeros are counted, as PaLM and nanoGPT count them (the kernels compute the full grid in
blocks; an exact causal count would be about half). Norms, softmax, activations and the
optimizer are left out. A run of S steps of B tokens costs C = C_token * B * S.
"""

from __future__ import annotations

import math

from gpt.errors import TinyGPTError


def counts(model) -> dict:
    """The figures a run reports (log and summary.json): its parameters with and without the
    lookup tables, and FLOPs per training token."""
    return {
        "params": model.num_params(),
        "params_non_embedding": model.num_params(non_embedding=True),
        "flops_per_token": float(model.flops_per_token()),
    }


def steps_for(train, flops_per_token: float, params_non_embedding: int, tokens_per_step: int) -> int | None:
    """train.max_iters as the horizon implies: floor(flops_budget / (C_token * tokens per step)),
    so a run never spends more than its budget, or round(tokens_per_param * N / tokens per step);
    None when the horizon is given in steps. A horizon below one step is refused."""
    if train.flops_budget is not None:
        per_step = flops_per_token * tokens_per_step
        steps = math.floor(train.flops_budget / per_step)
        if steps < 1:
            raise TinyGPTError(
                f"train.flops_budget={train.flops_budget:.3g} is less than one step of this model "
                f"({per_step:.3g} FLOPs: {flops_per_token:.3g} per token x {tokens_per_step:,} tokens); "
                f"give a budget of at least {per_step:.3g}, or a smaller model or batch"
            )
        return steps
    if train.tokens_per_param is not None:
        steps = round(train.tokens_per_param * params_non_embedding / tokens_per_step)
        if steps < 1:
            raise TinyGPTError(
                f"train.tokens_per_param={train.tokens_per_param:g} is less than one step of this model "
                f"({tokens_per_step:,} tokens for {params_non_embedding:,} parameters); raise it"
            )
        return steps
    return None


def describe(figures: dict, steps: int, tokens_per_step: int, recurrent: bool = False) -> str:
    """The start-up line: sizes, FLOPs per token (a recurrent model has no attention term), and
    what the whole run will cost. N leaves out the lookup tables only (a tied token table is the
    LM head's matmul too: then N is every parameter, which 'without embeddings' said wrongly)."""
    total = figures["flops_per_token"] * tokens_per_step * steps
    rule = "6N" if recurrent else "6N + attention"
    return (
        f"compute: N = {figures['params_non_embedding']:,} parameters in matmuls "
        f"({figures['params']:,} in all); {figures['flops_per_token']:.3g} FLOPs/token ({rule}); "
        f"{steps:,} steps x {tokens_per_step:,} tokens = {total:.3g} training FLOPs"
    )
