"""Loss, perplexity and bits per byte of a model on a token sequence (`tinygpt eval`).

Every token after the first is scored exactly once, the last partial window included, with a
sliding window (the Hugging Face recipe): windows of up to block_size tokens start every
`stride` tokens, and each scores only the targets no earlier window scored, so each of those is
predicted with at least block_size - stride tokens of context it does not score. stride =
block_size (the default) gives back-to-back windows: fastest, least context for each window's
first targets; a smaller stride costs block_size / stride times the compute. Bits per byte =
total loss / ln 2 / the UTF-8 bytes of the scored text, which compares models with different
tokenizers. Conversations (a chat finetune's data) are scored as the finetune trains on them:
each whole, only its replies (`evaluate_conversations`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gpt.errors import TinyGPTError


def token_bytes(tokenizer, ids) -> int:
    """UTF-8 bytes the ids stand for, token by token: end-of-text counts 0, and a character
    split over several BPE/byte tokens counts once (decoding windows whole would not)."""
    kind = getattr(tokenizer, "kind", None)
    eot = getattr(tokenizer, "eot_id", None)
    if kind == "tiktoken":
        return sum(len(tokenizer.enc.decode_single_token_bytes(i)) for i in ids if i != eot)
    if kind == "byte":
        return sum(1 for i in ids if i < 256)
    if kind in ("bpe", "hf"):
        return sum(tokenizer.piece_bytes(i) for i in ids)
    return sum(len(tokenizer.decode([i]).encode("utf-8")) for i in ids if i != eot)


def windows(n_tokens: int, block: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored) per window over n_tokens tokens: inputs tokens[begin:end]
    predict tokens[begin + 1:end + 1], and targets from `first scored` on count. Target j (the
    token j + 1) is scored by exactly one window."""
    n_targets = n_tokens - 1
    out, scored, begin = [], 0, 0
    while scored < n_targets:
        end = min(begin + block, n_targets)
        out.append((begin, end, scored))
        scored, begin = end, begin + stride
    return out


@torch.no_grad()
def evaluate_tokens(
    model, tokens: np.ndarray, tokenizer, device, batch_size: int = 16, max_tokens: int | None = None, stride: int | None = None
) -> dict:
    block = model.config.block_size
    stride = stride or block
    if not 1 <= stride <= block:
        raise TinyGPTError(f"stride={stride}: use 1..block_size ({block}); smaller strides give each target more context")
    tokens = np.asarray(tokens[: max_tokens + 1] if max_tokens else tokens)
    if len(tokens) < 2:
        raise TinyGPTError(f"the text has {len(tokens)} token(s); scoring needs at least 2 (one to predict from, one to predict)")
    model.eval()
    total_loss, total_tokens, total_bytes = 0.0, 0, 0
    spans = windows(len(tokens), block, stride)
    by_length: dict[int, list[tuple[int, int, int]]] = {}
    for span in spans:  # only the last window can be shorter: batch windows of one length together
        by_length.setdefault(span[1] - span[0], []).append(span)
    for length, group in by_length.items():
        for start in range(0, len(group), batch_size):
            rows = group[start : start + batch_size]
            chunk = np.stack([tokens[b : e + 1] for b, e, _ in rows]).astype(np.int64)
            x = torch.from_numpy(chunk[:, :-1]).to(device)
            y = torch.from_numpy(chunk[:, 1:]).to(device)
            logits, _ = model(x)
            losses = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none"
            ).view(len(rows), length)
            for r, (b, e, first) in enumerate(rows):
                total_loss += losses[r, first - b :].sum().item()
                total_tokens += e - first
                total_bytes += token_bytes(tokenizer, tokens[first + 1 : e + 1].tolist())
    return _figures(total_loss, total_tokens, total_bytes) | {"stride": stride}


def split_tokens(shards: list[np.ndarray], max_tokens: int | None) -> np.ndarray:
    """A split's tokens as one array, reading only what is evaluated out of the memmaps (a train
    split can be far larger than RAM)."""
    need = (max_tokens + 1) if max_tokens else None
    taken, have = [], 0
    for shard in shards:
        taken.append(np.asarray(shard if need is None else shard[: need - have]))
        have += len(taken[-1])
        if need is not None and have >= need:
            break
    return np.concatenate(taken)


@torch.no_grad()
def evaluate_conversations(model, split, tokenizer, device, batch_size: int = 16, max_tokens: int | None = None) -> dict:
    """Loss over a split of conversations (gpt.data.chat.ChatSplit) as a chat finetune trains and
    validates on them: each conversation whole from its start, only its trained ids (the
    assistant's replies) scored, conversations longer than the context left out as training
    leaves them. Scoring the ids one after another instead would score the prompts and the
    template too, which the model was never trained to predict (a loss twice training's val).
    `max_tokens`: stop once that many replies' ids are scored (whole conversations)."""
    block = model.config.block_size
    fits = [i for i, n in enumerate(split.lengths()) if n <= block + 1]
    if not fits:
        raise TinyGPTError(f"none of the split's {len(split):,} conversations fits the model's context ({block + 1} tokens)")
    model.eval()
    total_loss, total_tokens, total_bytes, used = 0.0, 0, 0, 0
    for start in range(0, len(fits), batch_size):
        chosen = [split.conversation(i) for i in fits[start : start + batch_size]]
        width = max(len(ids) for ids, _ in chosen) - 1
        x, y = np.zeros((len(chosen), width), np.int64), np.full((len(chosen), width), -1, np.int64)
        for r, (ids, mask) in enumerate(chosen):
            x[r, : len(ids) - 1] = ids[:-1]
            y[r, : len(ids) - 1] = np.where(mask[1:] == 1, ids[1:].astype(np.int64), -1)
        used += len(chosen)
        scored = y[y != -1]
        if not len(scored):
            continue
        _, loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))  # the mean over the scored ids
        total_loss += loss.item() * len(scored)
        total_tokens += len(scored)
        total_bytes += token_bytes(tokenizer, scored.tolist())
        if max_tokens and total_tokens >= max_tokens:
            break
    if not total_tokens:
        raise TinyGPTError("the conversations hold no replies to score (no trained ids)")
    return _figures(total_loss, total_tokens, total_bytes) | {"conversations": used, "left_out": len(split) - len(fits)}


def _figures(total_loss: float, tokens: int, n_bytes: int) -> dict:
    """What a score reports from its summed loss (nats) over `tokens` tokens of `n_bytes` bytes."""
    mean = total_loss / tokens
    return {
        "tokens": tokens,
        "bytes": n_bytes,
        "loss": mean,
        "perplexity": math.exp(mean),
        "bits_per_byte": total_loss / math.log(2) / max(n_bytes, 1),
    }
