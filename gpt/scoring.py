"""Log-likelihood of continuations given contexts: the one measurement behind zero-shot tasks
(HellaSwag, LAMBADA, ARC) and the lm-evaluation-harness adapter.

Token-level and model-agnostic: any tinygpt model (transformer or recurrent) called as
`model(idx) -> (logits, _)`. A request is (context ids, continuation ids); its score is the sum
of log p(continuation token | everything before it), plus whether greedy decoding would have
produced exactly the continuation. Context that does not fit the model's window is cut from the
left (the harness's rule), so the continuation is always scored whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpt.errors import TinyGPTError


@dataclass(frozen=True)
class Score:
    logprob: float  # sum of the continuation tokens' log-probabilities (natural log)
    tokens: int  # continuation length in tokens
    greedy: bool  # argmax at every continuation position is the continuation's token


def window(context: list[int], continuation: list[int], block_size: int) -> list[int]:
    """The model input for one request: context + continuation minus its last token, cut from
    the left to block_size tokens. The continuation's targets are the input's last len(continuation)
    positions' next tokens."""
    if not continuation:
        raise TinyGPTError("a continuation needs at least one token to score")
    if not context:
        raise TinyGPTError("a context needs at least one token (use the end-of-text token for an empty one)")
    if len(continuation) > block_size:
        raise TinyGPTError(f"a continuation of {len(continuation)} tokens does not fit the model's context of {block_size}")
    return (context + continuation)[-(block_size + 1) : -1]


@torch.no_grad()
def score(model, requests: list[tuple[list[int], list[int]]], device, batch_size: int = 16) -> list[Score]:
    """One Score per (context, continuation) request, in order. Requests are batched longest
    first, padded on the right: causal models never look right, so padding changes nothing."""
    block = model.config.block_size
    inputs = [window(ctx, cont, block) for ctx, cont in requests]
    order = sorted(range(len(requests)), key=lambda i: -len(inputs[i]))
    scores: list[Score | None] = [None] * len(requests)
    was_training = model.training
    model.eval()
    try:
        _score_batches(model, requests, inputs, order, scores, device, batch_size)
    finally:
        model.train(was_training)  # training scores its tasks mid-run
    return scores


def _score_batches(model, requests, inputs, order, scores, device, batch_size: int) -> None:
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = len(inputs[batch[0]])
        x = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):
            x[row, : len(inputs[i])] = torch.tensor(inputs[i])
        logits, _ = model(x.to(device))
        for row, i in enumerate(batch):
            cont = requests[i][1]
            end = len(inputs[i])
            logp = F.log_softmax(logits[row, end - len(cont) : end].float(), dim=-1)
            target = torch.tensor(cont, device=logp.device)
            picked = logp.gather(1, target[:, None]).squeeze(1)
            scores[i] = Score(picked.sum().item(), len(cont), bool((logp.argmax(-1) == target).all()))
