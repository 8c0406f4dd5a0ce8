"""The GPT: token embedding (+ positions) -> n_layer blocks -> final norm -> LM head."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gpt.config.model import GPTConfig
from gpt.errors import TinyGPTError
from gpt.model.attention import CausalSelfAttention
from gpt.model.layers import make_mlp, make_norm, rope_tables, sinusoidal_table

if TYPE_CHECKING:  # only decoding makes a cache
    from gpt.model.cache import KVCache


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy of logits (B, T, V) against targets (B, T), over the targets that are
    not -1 (positions a finetune does not train: a chat's prompt, padding); None without targets.
    Upcast first (to float32 at least: a float64 model keeps float64): under bf16/fp16 autocast a
    low-precision softmax over the vocab is lossy."""
    if targets is None:
        return None
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def _head_loss_sum(head: nn.Module, h: torch.Tensor, targets: torch.Tensor, vocab: int, softcap: float | None) -> torch.Tensor:
    """Summed cross-entropy of one chunk of rows h (N, C) through the LM head: its logits live only
    inside this call (and again in its recomputation for the backward pass)."""
    logits = head(h)[:, :vocab]
    if softcap:
        logits = softcap * torch.tanh(logits.float() / softcap)
    return F.cross_entropy(logits.float(), targets, ignore_index=-1, reduction="sum")


class Block(nn.Module):
    """Pre-norm transformer block: normalise, transform, add back to the residual stream."""

    def __init__(self, config: GPTConfig, layer_idx: int = 0):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = make_norm(config)
        self.mlp = make_mlp(config)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, mask: torch.Tensor | None = None, rope=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, mask, rope)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    # Logits (rows x padded vocab) above this many elements are never materialised whole by the
    # training forward: the head and the loss run over chunks of rows, each recomputed in the
    # backward pass (torch has no fused linear + cross-entropy). 16 x 1024 rows of GPT-2's
    # vocabulary in fp32 would be 3.3 GB; below the limit (every CPU recipe) the plain path is
    # faster. `loss_chunk_elements`, where set, replaces it: a GPU's runtime sizes it from the
    # device's memory (gpt.runtime.devices.Runtime.tune), so that logits that fit go whole.
    LOSS_CHUNK_ELEMENTS = 2**25
    loss_chunk_elements: int | None = None

    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.vocab_size is None:
            raise TinyGPTError("GPTConfig.vocab_size is null: set it (a run takes the tokenizer's) before building the model")
        self.config = config
        layers = dict(wte=nn.Embedding(config.padded_vocab_size, config.n_embd))
        if config.pos_encoding == "learned":
            layers["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        layers.update(
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=make_norm(config),
        )
        self.transformer = nn.ModuleDict(layers)
        # Fixed tables are buffers: they follow .to(device) but are neither trained nor saved.
        # Computed on the CPU and moved where the model is built: on the meta device (shapes only,
        # gpt.model.meta.building) torch computes them through its Python references, whose first
        # use imports torch._dynamo (0.3 s of every sample, eval, serve and export start).
        with torch.device("cpu"):
            tables = self.fixed_tables()
        for name, table in tables.items():
            self.register_buffer(name, table.to(torch.get_default_device()), persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            # Weight tying: the input embedding and the output projection share one matrix, which
            # saves vocab_size * n_embd parameters and trains better for small models.
            self.lm_head.weight = self.transformer.wte.weight

        self.apply(self._init_weights)
        # GPT-2: scale residual projections by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth (two residual additions per block).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def fixed_tables(self) -> dict[str, torch.Tensor]:
        """The position tables (sinusoidal, or RoPE's cos and sin) by buffer name, computed from the
        config: at construction, and again for a model built on the meta device once it has memory
        (gpt.training.parallel.materialize), since a buffer is not in any checkpoint."""
        c = self.config
        if c.pos_encoding == "sinusoidal":
            return {"pos_table": sinusoidal_table(c.block_size, c.n_embd)}
        if c.pos_encoding == "rope":
            cos, sin = rope_tables(c.block_size, c.head_dim, c.rope_theta)
            return {"rope_cos": cos, "rope_sin": sin}
        return {}

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
        """idx: (B, T) token ids. Without targets, returns (logits (B, T, vocab_size), None); with
        targets (B, T), returns (None, the mean cross-entropy loss): the training forward keeps no
        logits. Logits cover the tokenizer's vocab_size, never the padded rows.

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
            pos, mask = cache.positions(T, self.config.block_size, idx.device)
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
        recompute = self.config.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            x = checkpoint(block, x, cache, mask, rope, use_reentrant=False) if recompute else block(x, cache, mask, rope)
        if cache is not None:
            cache.advance(T)
        if last_only:
            x = x[:, -1:, :]
        x = self.transformer.ln_f(x)
        if targets is not None:
            return None, self._loss(x, targets)
        return self._logits(x), None

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x)
        if self.config.padded_vocab_size != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]
        if self.config.logit_softcap:  # c tanh(z / c): near z for small z, never beyond +-c (in fp32)
            cap = self.config.logit_softcap
            logits = cap * torch.tanh(logits.float() / cap)
        return logits

    def _loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the targets that are not -1 (see next_token_loss)."""
        rows, limit = x.size(0) * x.size(1), self.loss_chunk_elements or self.LOSS_CHUNK_ELEMENTS
        if rows * self.config.padded_vocab_size <= limit:
            return next_token_loss(self._logits(x), targets)
        h, y = x.reshape(rows, -1), targets.reshape(-1)
        chunk = max(1, limit // self.config.padded_vocab_size)
        c = self.config
        total = sum(
            checkpoint(_head_loss_sum, self.lm_head, hc, yc, c.vocab_size, c.logit_softcap, use_reentrant=False)
            for hc, yc in zip(h.split(chunk), y.split(chunk))
        )
        return total / (y != -1).sum()

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; tied weights count once. `non_embedding` drops the position table
        and, untied, the token table (a lookup; tied, it stays: it is also the LM head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        if non_embedding and not self.config.tie_embeddings:
            n -= self.transformer.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token, as in the PaLM paper's appendix:
        6 per weight, plus 12 * n_layer * (n_head * head_dim) * T for the attention score/value
        matmuls."""
        c = self.config
        T = seq_len or c.block_size
        return 6 * self.num_params(non_embedding=True) + 12 * c.n_layer * c.n_head * c.head_dim * T

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
