"""Causal multi-head self-attention, A = softmax(QK^T / sqrt(d_k)) V, reading and filling the KV
cache (gpt.model.cache) when generation runs one position at a time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.config.model import GPTConfig
from gpt.model.layers import apply_rope, make_norm

if TYPE_CHECKING:  # only decoding makes a cache
    from gpt.model.cache import KVCache


class CausalSelfAttention(nn.Module):
    """Multi-head attention where position t only attends to positions <= t."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx  # which KV-cache slot is ours
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        self.impl = config.attention
        self.rope = config.pos_encoding == "rope"
        self.dropout = config.dropout
        self.capture = False  # set by GPT.attention_maps: keep the attention weights
        self.last_weights: torch.Tensor | None = None
        # Query lengths below which attention runs in fp32 under autocast: a setting of the device
        # the model runs on (gpt.runtime.devices.Runtime.place), 0 (never) in the model itself.
        self.fp32_below = 0
        # Q=XWq, K=XWk, V=XWv computed as one matmul with the three weights stacked. With
        # grouped-query attention K and V have fewer heads than Q (a smaller KV cache).
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, q_dim + 2 * kv_dim, bias=config.qkv_bias)
        self.c_proj = nn.Linear(q_dim, config.n_embd, bias=config.bias)
        # QK-norm: each head's queries and keys normalised (one gain per channel, shared by the
        # heads), so that attention logits cannot grow without bound as the weights do.
        self.q_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        self.k_norm = make_norm(config, self.head_dim) if config.qk_norm else None
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x: (B, T, C). Without a cache, attention is plainly causal over x. With one, x holds
        the new positions only, and `mask` (B, 1, T, columns so far) says what each may see.
        `rope` holds the cos/sin of the positions of x when RoPE is on."""
        B, T, C = x.shape
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([q_dim, kv_dim, kv_dim], dim=2)
        # Split channels into heads, (B, T, heads, head_dim), and normalise and rotate in that
        # layout, where each head's vector is a contiguous row (in (B, heads, T, head_dim) it is
        # strided, and so is every elementwise kernel over it, forward and backward).
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim)
        # Queries and keys go to attention in its dtype: fp32 where _sdpa upcasts anyway, so they
        # skip a round trip through bf16 (with the layout above, the quickstart's step on a CPU is
        # ~3% shorter, 5 alternated pairs); else the compute dtype (the norm computes in fp32, and
        # an fp32 K would make the KV cache fp32 and be re-cast at every generated token).
        fused = self.impl == "sdpa" and not self.capture  # the explicit path's matmuls autocast to bf16 anyway
        dtype = torch.float32 if fused and cache is None and _upcast(q, self.fp32_below) else v.dtype
        if self.q_norm is not None:  # before the rotation: it scales a head's vector, RoPE turns it
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.to(dtype), k.to(dtype)
        if self.rope:
            cos, sin = (t.transpose(1, 2) for t in rope)  # (.., T, 1, d/2): over (B, T, heads, d)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, head_dim)
        if cache is not None:
            k, v = cache.store(self.layer_idx, k, v)
        grouped = self.n_kv_head != self.n_head  # each K/V head serves a group of query heads
        if fused:
            y = _sdpa(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None,
                below=self.fp32_below,
                dropout_p=self.dropout if self.training else 0.0,
                enable_gqa=grouped,  # reads each K/V head for its group in place, no copy
            )
        else:
            if grouped:  # the explicit path spells the groups out
                k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
                v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            y = self._manual_attention(q, k, v, mask)

        # Concatenate heads back: (B, n_head, T, head_dim) -> (B, T, n_head * head_dim).
        y = y.transpose(1, 2).contiguous().view(B, T, q_dim)
        return self.resid_dropout(self.c_proj(y))

    def _manual_attention(self, q, k, v, mask=None) -> torch.Tensor:
        """A = softmax(QK^T / sqrt(d_k)) with future positions masked out; output A V."""
        if mask is None:  # plain causal: query t sees keys 0..t
            T = q.size(-2)
            mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        if self.capture:
            self.last_weights = weights.detach()
        return self.attn_dropout(weights) @ v


def _upcast(q: torch.Tensor, below: int) -> bool:
    """Whether attention over these queries (B, T, heads, head_dim) runs in fp32 under autocast
    (`below`: CausalSelfAttention.fp32_below). The length is read last: compiled, reading it puts a
    guard on it, and so a graph of its own for `below` positions and more (tinygpt serve
    compile=true warms up each shape it may take)."""
    return below > 0 and q.device.type == "cpu" and torch.is_autocast_enabled("cpu") and q.size(1) < below


def _sdpa(q, k, v, below: int = 0, **kw) -> torch.Tensor:
    if _upcast(q.transpose(1, 2), below):
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kw).to(v.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kw)
