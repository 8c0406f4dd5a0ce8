"""Loss, perplexity and bits per byte of a model on a token sequence (`tinygpt eval`).

Every token is scored once: the text is cut into consecutive windows of block_size + 1 tokens
(the first token of each window is context only). Bits per byte = total loss / ln 2 / the UTF-8
bytes of the scored text, which compares models with different tokenizers.
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
    return sum(len(tokenizer.decode([i]).encode("utf-8")) for i in ids if i != eot)


@torch.no_grad()
def evaluate_tokens(model, tokens: np.ndarray, tokenizer, device, batch_size: int = 16, max_tokens: int | None = None) -> dict:
    block = model.config.block_size
    tokens = np.asarray(tokens[: max_tokens + 1] if max_tokens else tokens)
    n_windows = (len(tokens) - 1) // block
    if n_windows < 1:
        raise TinyGPTError(f"the text has {len(tokens)} tokens; evaluating needs more than block_size={block}")
    model.eval()
    total_loss, total_tokens, total_bytes = 0.0, 0, 0
    for start in range(0, n_windows, batch_size):
        rows = range(start, min(start + batch_size, n_windows))
        windows = np.stack([tokens[r * block : r * block + block + 1] for r in rows]).astype(np.int64)
        x = torch.from_numpy(windows[:, :-1]).to(device)
        y = torch.from_numpy(windows[:, 1:]).to(device)
        logits, _ = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        total_loss += loss.item()
        total_tokens += y.numel()
        total_bytes += token_bytes(tokenizer, windows[:, 1:].ravel().tolist())
    mean = total_loss / total_tokens
    return {
        "tokens": total_tokens,
        "bytes": total_bytes,
        "loss": mean,
        "perplexity": math.exp(mean),
        "bits_per_byte": total_loss / math.log(2) / max(total_bytes, 1),
    }


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
