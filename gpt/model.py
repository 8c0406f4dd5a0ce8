"""A decoder-only GPT, readable top to bottom.

    tokens -> token embedding (+ positional embedding) -> dropout
           -> n_layer x Block( x + attn(ln_1(x)); x + mlp(ln_2(x)) )
           -> final LayerNorm -> LM head (tied to the token embedding) -> logits

Positions enter either as a table added to the token embeddings (learned, as in GPT-2, or
fixed sinusoids, as in the original Transformer), as rotations of queries and keys inside
attention (RoPE), or not at all (causal masking alone still lets a model infer order).

No Hydra and no file I/O here: the model is built from a plain `GPTConfig` so it can be used
from a notebook, a test or another framework.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.errors import TinyGPTError

ATTENTION_IMPLS = ("sdpa", "manual")
POS_ENCODINGS = ("learned", "sinusoidal", "rope", "none")


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64  # longest context the model can attend over
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm layers, as in GPT-2
    attention: str = "sdpa"  # "sdpa" (fused/flash kernels) or "manual" (explicit math)
    pos_encoding: str = "learned"  # learned | sinusoidal | rope | none
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None = n_head
    rope_theta: float = 10000.0  # RoPE base: rotation frequencies are theta^(-2i/head_dim)
    activation: str = "gelu"  # gelu (exact, erf) | gelu_tanh (the approximation OpenAI's GPT-2 used)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TinyGPTError(f"model.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.dropout, (int, float)) or isinstance(self.dropout, bool):
            raise TinyGPTError(f"model.dropout must be a number in [0, 1), got {self.dropout!r}")
        if not isinstance(self.bias, bool):
            raise TinyGPTError(f"model.bias must be true or false, got {self.bias!r}")
        if self.n_embd % self.n_head:
            raise TinyGPTError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}; "
                f"pick n_embd as a multiple of n_head (e.g. model.n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise TinyGPTError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ATTENTION_IMPLS:
            raise TinyGPTError(f"model.attention={self.attention!r} is unknown; use one of {', '.join(ATTENTION_IMPLS)}")
        if self.pos_encoding not in POS_ENCODINGS:
            raise TinyGPTError(f"model.pos_encoding={self.pos_encoding!r} is unknown; use one of {', '.join(POS_ENCODINGS)}")
        if self.n_kv_head is not None and (
            not isinstance(self.n_kv_head, int) or self.n_kv_head < 1 or self.n_head % self.n_kv_head
        ):
            raise TinyGPTError(
                f"model.n_kv_head={self.n_kv_head!r} must divide model.n_head={self.n_head} (each key/value head serves "
                f"n_head / n_kv_head query heads); use a divisor of {self.n_head} or null"
            )
        if self.activation not in ("gelu", "gelu_tanh"):
            raise TinyGPTError(f"model.activation={self.activation!r} is unknown; use gelu or gelu_tanh")
        if self.pos_encoding == "rope" and (self.n_embd // self.n_head) % 2:
            raise TinyGPTError(f"RoPE rotates pairs of channels: n_embd / n_head = {self.n_embd // self.n_head} must be even")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        """Build from a mapping such as a model preset; its `name` is a label and its `arch`
        (always "gpt" here) picks this class, neither is a field."""
        if d.get("arch", "gpt") != "gpt":
            raise TinyGPTError(f"model.arch={d['arch']!r} is not a GPT; build it with gpt.architectures")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known - {"name", "arch"})
        if unknown:
            raise TinyGPTError(
                f"unknown model setting(s) {', '.join('model.' + k for k in unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy of logits (B, T, V) against targets (B, T); None without targets.
    Upcast first: under bf16/fp16 autocast a low-precision softmax over the vocab is lossy."""
    if targets is None:
        return None
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(p / 10000^(2i/dim)): each channel
    pair is a clock of its own frequency, so relative offsets are linear functions of the table.
    Computed in float64, then rounded: in float32 the angle p * freq loses digits as p grows
    (an error of 6.7e-5 at position 1023 of a 768-wide table)."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    freq = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()


def rope_tables(n_pos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of angle p * theta^(-2i/head_dim), each (n_pos, head_dim / 2); in float64,
    then rounded, as for the sinusoidal table."""
    freq = torch.pow(theta, -torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * freq
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x_i, x_{i+d/2}) of x (B, H, T, d) by their position's angles. A dot
    product of two rotated vectors depends only on the difference of their positions."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class KVCache:
    """Keys and values of positions already processed, so that generating the next token costs
    one position's work instead of the whole context's.

    One (B, n_kv_head, max_len, head_dim) buffer per layer, allocated on first use in the dtype
    the layer computes in. Prompts of different lengths share a batch by left-padding: `pad[b]` is
    the number of padding columns in front of row b, which no query ever attends to.
    """

    def __init__(self, n_layer: int, max_len: int, pad: torch.Tensor):
        self.max_len = max_len
        self.pad = pad  # (B,) long
        self.min_pad = int(pad.min())
        self.length = 0  # columns filled so far
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values at the current columns; return all columns so far."""
        if self.k[layer] is None:
            shape = (k.size(0), k.size(1), self.max_len, k.size(3))
            self.k[layer] = torch.zeros(shape, dtype=k.dtype, device=k.device)
            self.v[layer] = torch.zeros(shape, dtype=v.dtype, device=v.device)
        end = self.length + k.size(2)
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head attention where position t only attends to positions <= t."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx  # which KV-cache slot is ours
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.head_dim = config.n_embd // config.n_head
        self.impl = config.attention
        self.rope = config.pos_encoding == "rope"
        self.dropout = config.dropout
        self.capture = False  # set by GPT.attention_maps: keep the attention weights
        self.last_weights: torch.Tensor | None = None
        # Q=XWq, K=XWk, V=XWv computed as one matmul with the three weights stacked. With
        # grouped-query attention K and V have fewer heads than Q (a smaller KV cache).
        kv_dim = self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
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
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split([C, kv_dim, kv_dim], dim=2)
        # Split channels into heads: (B, T, C) -> (B, heads, T, head_dim).
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.store(self.layer_idx, k, v)
        if self.n_kv_head != self.n_head:  # each K/V head serves a group of query heads
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)

        if self.impl == "sdpa" and not self.capture:
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None,
                dropout_p=self.dropout if self.training else 0.0,
            )
        else:
            y = self._manual_attention(q, k, v, mask)

        # Concatenate heads back: (B, n_head, T, head_dim) -> (B, T, C).
        y = y.transpose(1, 2).contiguous().view(B, T, C)
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


class MLP(nn.Module):
    """Position-wise feed-forward network: expand 4x, GELU, project back."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: normalise, transform, add back to the residual stream."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, mask, rope)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        layers = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos_encoding == "learned":
            layers["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        layers.update(
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        )
        self.transformer = nn.ModuleDict(layers)
        # Fixed tables are buffers: they follow .to(device) but are neither trained nor saved.
        if config.pos_encoding == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(config.block_size, config.n_embd), persistent=False)
        if config.pos_encoding == "rope":
            cos, sin = rope_tables(config.block_size, config.n_embd // config.n_head, config.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying: the input embedding and the output projection share one matrix, which
        # saves vocab_size * n_embd parameters and trains better for small models.
        self.lm_head.weight = self.transformer.wte.weight

        self.apply(self._init_weights)
        # GPT-2: scale residual projections by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth (two residual additions per block).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: (B, T) token ids. Returns logits (B, T, vocab) and the mean cross-entropy loss
        against `targets` (B, T), or None when no targets are given.

        With a `cache`, idx holds only the positions after those already cached, and the cache
        advances by T (see `KVCache`); that is how generation runs one token at a time.
        `last_only` computes logits for the last position only (B, 1, vocab): all that
        generation needs, and for a 50k vocabulary the LM head is a large share of the work."""
        B, T = idx.shape
        mask = None
        if cache is None:
            if T > self.config.block_size:
                raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
            pos = torch.arange(T, device=idx.device)
        else:
            pos, mask = self._cached_positions(cache, T, idx.device)
        x = self.transformer.wte(idx)
        rope = None
        if self.config.pos_encoding == "learned":
            x = x + self.transformer.wpe(pos)
        elif self.config.pos_encoding == "sinusoidal":
            x = x + self.pos_table[pos]
        elif self.config.pos_encoding == "rope":
            # (T, d/2) or (B, T, d/2) -> broadcastable over heads: (1 or B, 1, T, d/2)
            cos, sin = self.rope_cos[pos], self.rope_sin[pos]
            rope = (cos.view(-1, 1, T, cos.size(-1)), sin.view(-1, 1, T, sin.size(-1)))
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, cache, mask, rope)
        if cache is not None:
            cache.length += T
        if last_only:
            x = x[:, -1:, :]
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, next_token_loss(logits, targets)

    def _cached_positions(self, cache: KVCache, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids (B, T) and attention mask (B, 1, T, columns) for T new columns.

        Row b's first real token sits at column pad[b] and gets position 0. A query at column c
        sees columns pad[b]..c; a padding query sees only itself (its output is never used, but
        a row with nothing to attend to would turn into NaNs)."""
        start = cache.length
        if start + T > cache.max_len or start + T - cache.min_pad > self.config.block_size:
            raise ValueError(f"KV cache holds {start} columns; {T} more exceed its size or block_size")
        q_col = torch.arange(start, start + T, device=device)
        k_col = torch.arange(start + T, device=device)
        pad = cache.pad.to(device)
        pos = (q_col[None, :] - pad[:, None]).clamp(min=0)
        visible = (k_col[None, None, :] <= q_col[None, :, None]) & (k_col[None, None, :] >= pad[:, None, None])
        visible |= k_col[None, None, :] == q_col[None, :, None]
        return pos, visible[:, None]

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; tied weights count once. `non_embedding` drops the position table
        (the token table stays: it is also the LM head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token, as in the PaLM paper's appendix:
        6 per weight, plus 12 * n_layer * n_embd * T for the attention score/value matmuls."""
        c = self.config
        T = seq_len or c.block_size
        return 6 * self.num_params(non_embedding=True) + 12 * c.n_layer * c.n_embd * T

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every layer for idx (B, T): a list of (B, n_head, T, T) tensors,
        computed with the explicit softmax(QK^T/sqrt(d_k)) path whatever `attention` says."""
        attns = [block.attn for block in self.transformer.h]
        was_training = self.training
        self.eval()
        try:
            for a in attns:
                a.capture = True
            self(idx)
            return [a.last_weights for a in attns]
        finally:
            for a in attns:
                a.capture, a.last_weights = False, None
            self.train(was_training)
