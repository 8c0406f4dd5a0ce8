"""Log-likelihood of continuations given contexts: the one measurement behind zero-shot tasks
(HellaSwag, LAMBADA, ARC) and the lm-evaluation-harness adapter.

Token-level and model-agnostic: any tinygpt model (transformer or recurrent) called as
`model(idx) -> (logits, _)`. A request is (context ids, continuation ids); its score is the sum
of log p(continuation token | everything before it), plus whether greedy decoding would have
produced exactly the continuation. Context that does not fit a transformer's window is cut from
the left (the harness's rule); a continuation longer than the window is scored a window at a
time (see `pieces`); recurrent models read the whole request.
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


def pieces(context: list[int], continuation: list[int], block_size: int | None) -> list[tuple[list[int], list[int]]]:
    """The model inputs that score one request: (input ids, the continuation tokens its last
    positions predict). One piece when the continuation fits the window: context +
    continuation minus its last token, cut from the left to block_size. A longer continuation
    (a HellaSwag ending in characters, for a 64-character model) is scored block_size tokens at
    a time in back-to-back windows (the harness's rolling windows): a window's first token is
    its only context for the next, so such a choice is scored with less of the item's context.
    block_size None (recurrent models): no window, everything in one piece."""
    if not continuation:
        raise TinyGPTError("a continuation needs at least one token to score")
    if not context:
        raise TinyGPTError("a context needs at least one token (use the end-of-text token for an empty one)")
    full, start = context + continuation, len(context)
    step = block_size or len(continuation)
    out = []
    for begin in range(0, len(continuation), step):
        end = min(begin + step, len(continuation))  # continuation[begin:end] scored by this piece
        stop = start + end - 1  # the input ends just before the last scored token
        out.append((full[max(0, stop - block_size) if block_size else 0 : stop], continuation[begin:end]))
    return out


@torch.no_grad()
def score(model, requests: list[tuple[list[int], list[int]]], device, batch_size: int = 16) -> list[Score]:
    """One Score per (context, continuation) request, in order. Pieces are batched longest
    first, padded on the right: causal models never look right, so padding changes nothing."""
    block = None if getattr(model, "recurrent", False) else model.config.block_size
    work = [(i, inp, targets) for i, (ctx, cont) in enumerate(requests) for inp, targets in pieces(ctx, cont, block)]
    work.sort(key=lambda w: -len(w[1]))
    sums, greedy = [0.0] * len(requests), [True] * len(requests)
    was_training = model.training
    model.eval()
    try:
        for at in range(0, len(work), batch_size):
            _score_batch(model, work[at : at + batch_size], sums, greedy, device)
    finally:
        model.train(was_training)  # training scores its tasks mid-run
    return [Score(sums[i], len(cont), greedy[i]) for i, (_, cont) in enumerate(requests)]


def _score_batch(model, batch, sums: list[float], greedy: list[bool], device) -> None:
    x = torch.zeros(len(batch), len(batch[0][1]), dtype=torch.long)
    for row, (_, inp, _) in enumerate(batch):
        x[row, : len(inp)] = torch.tensor(inp)
    logits, _ = model(x.to(device))
    for row, (i, inp, targets) in enumerate(batch):
        target = torch.tensor(targets, device=logits.device)
        logp = F.log_softmax(logits[row, len(inp) - len(targets) : len(inp)].float(), dim=-1)
        sums[i] += logp.gather(1, target[:, None]).sum().item()
        greedy[i] &= bool((logp.argmax(-1) == target).all())
