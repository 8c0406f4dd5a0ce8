"""Turning a row's logits into its next token under the sampling controls (the fields of
gpt.config.SamplingSettings): the repetition penalty, greedy, temperature, top-k / top-p /
min-p / typical-p, and a draw from the row's own generator. A new control is a field there and
its use in `next_tokens`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError


def filter_logits(logits: torch.Tensor, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """Set the logits of tokens that top_k / top_p / min_p rule out to -inf. logits: (B, V)."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p on their own;
        # the most likely token therefore always stays.
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if min_p is not None and min_p > 0:
        probs = F.softmax(logits, dim=-1)
        floor = min_p * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def keep_typical(logits: torch.Tensor, mass: float) -> torch.Tensor:
    """Locally typical sampling (Meister et al., 2022): rank tokens by how far their surprise,
    -log p, lies from the distribution's entropy (the expected surprise), and keep the nearest
    ones until they hold `mass` of the probability. As in top_p, a token is dropped when the
    tokens ranked before it already reach `mass`, so the nearest always stays. logits: (B, V)."""
    logp = F.log_softmax(logits, dim=-1)
    p = logp.exp()
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(dim=-1, keepdim=True)  # 0 log 0 = 0
    distance = (-logp - entropy).abs()  # inf for tokens already filtered out: ranked last
    order = distance.argsort(dim=-1)
    ranked = p.gather(-1, order)
    drop_ranked = ranked.cumsum(dim=-1) - ranked >= mass
    drop = torch.zeros_like(drop_ranked).scatter(-1, order, drop_ranked)
    return logits.masked_fill(drop, float("-inf"))


def penalize_repeats(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """CTRL-style repetition penalty: shrink positive logits of seen tokens, grow negative ones.
    seen: (B, V) bool."""
    if penalty == 1.0:
        return logits
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scaled, logits)


def next_tokens(
    logits: torch.Tensor, cfg: SamplingSettings, seen: torch.Tensor | None, generators, checks: list | None = None
) -> torch.Tensor:
    """The next token of each row under `cfg`'s controls (every control is applied here): the
    repetition penalty, then greedy at temperature 0, else temperature, top-k / top-p / min-p,
    and a draw from each row's own generator. logits: (B, V); seen: (B, V) bool, the tokens in
    each row's text (None without a repetition penalty). Shape (B,).

    Sampling raises TinyGPTError when the probabilities are not finite (a diverged model), which
    makes the host wait for the device to read that flag. Given a list `checks`, it appends the
    flag instead, a (B,) bool tensor on the device (row b's probabilities were finite), for the
    caller to read when it next reads the tokens and raise with `not_finite()`."""
    logits = penalize_repeats(logits, seen, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)
    if cfg.typical_p is not None and cfg.typical_p < 1.0:
        logits = keep_typical(logits, cfg.typical_p)
    probs = F.softmax(logits, dim=-1)
    finite = torch.isfinite(probs).all(dim=-1)  # NaN/inf probabilities: the outputs were not finite
    if checks is not None:
        checks.append(finite)
    elif not bool(finite.all()):
        raise not_finite()
    return draw(probs, generators)


def draw(probs: torch.Tensor, generators) -> torch.Tensor:
    """One token per row of probs (B, V), row b drawn with generators[b]: the token
    torch.multinomial(probs[b], 1, generator=generators[b]) would draw, and the same use of the
    generator, since ATen draws one sample as argmax(p / q) with q ~ Exp(1) (the exponential
    race, a form of the Gumbel-max trick). Only the noise is drawn row by row, each row from its
    own seeded stream (so a row's text does not depend on the rows batched with it); the rest is
    one batched op, and nothing waits for the device (multinomial reads two checks of its input
    back to the host, for each row)."""
    noise = torch.empty_like(probs)
    for row, generator in zip(noise, generators):
        row.exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def not_finite() -> TinyGPTError:
    return TinyGPTError(
        "the model's outputs are not finite numbers (its weights hold NaN or inf: a diverged run); "
        "sample from an earlier checkpoint (ckpt=<run>/checkpoints/ckpt-<step>.pt)"
    )
