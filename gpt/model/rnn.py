"""Recurrent language models: the Elman RNN, the LSTM and the GRU, the baselines transformers
replaced. Same interface as `GPT` (forward(idx, targets) -> logits, loss), so they train,
checkpoint, resume and sample through the same train.py and sample.py.

    tokens -> embedding E x_t -> dropout -> n_layer recurrent layers -> dropout -> V h_t -> logits

Each step's equations are written out below (`elman_step`, `lstm_step`, `gru_step`) and used by
`impl="explicit"`; the default `impl="fused"` runs the same math in PyTorch's nn.RNN / nn.LSTM /
nn.GRU kernels (cuDNN on GPUs), on the same parameters, so checkpoints work with either.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.config.model import RECURRENT, RNNConfig
from gpt.errors import TinyGPTError
from gpt.model import next_token_loss

ARCHS = RECURRENT  # the arch names of the recurrent configs


# --- one time step of each cell, as in the textbook (weights in PyTorch's layout) ----------------


def elman_step(x, h, w_ih, w_hh, b_ih, b_hh):
    """h_t = tanh(W x_t + U h_{t-1} + b)   (W = w_ih, U = w_hh, b = b_ih + b_hh)"""
    return torch.tanh(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)


def lstm_step(x, state, w_ih, w_hh, b_ih, b_hh):
    """Gates from the input and the previous hidden state (PyTorch order: input, forget, cell, output):
    i = sigmoid(W_i x + U_i h + b_i)     how much new content to write
    f = sigmoid(W_f x + U_f h + b_f)     how much of the old cell to keep
    g = tanh(W_g x + U_g h + b_g)        the candidate content
    o = sigmoid(W_o x + U_o h + b_o)     how much of the cell to expose
    c_t = f * c_{t-1} + i * g            the cell state: an additive path for gradients
    h_t = o * tanh(c_t)"""
    h, c = state
    i, f, g, o = (x @ w_ih.T + b_ih + h @ w_hh.T + b_hh).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def gru_step(x, h, w_ih, w_hh, b_ih, b_hh):
    """PyTorch's GRU (gates in its order: reset, update, new). Cho et al. (2014) apply the reset
    gate to h before U_n; PyTorch and cuDNN after, as here (see docs/math_to_code.md).
    r = sigmoid(W_r x + U_r h + b_r)             how much of the past feeds the candidate
    z = sigmoid(W_z x + U_z h + b_z)             how much of the past to keep as is
    n = tanh(W_n x + b_n + r * (U_n h + b'_n))   the candidate state
    h_t = (1 - z) * n + z * h_{t-1}"""
    xr, xz, xn = (x @ w_ih.T + b_ih).chunk(3, dim=-1)
    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, dim=-1)
    r = torch.sigmoid(xr + hr)
    z = torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


class RNNState:
    """The hidden state carried from one call to the next during generation (the recurrent
    counterpart of a KV cache, but of constant size): h (n_layer, B, n_hidden), and c for LSTMs."""

    def __init__(self, h: torch.Tensor | None = None, c: torch.Tensor | None = None):
        self.h, self.c = h, c

    @staticmethod
    def stack(states: list[RNNState]) -> RNNState:
        """Join per-row states into one batch (batch is dim 1)."""
        h = torch.cat([s.h for s in states], dim=1)
        c = torch.cat([s.c for s in states], dim=1) if states[0].c is not None else None
        return RNNState(h, c)


class RecurrentLM(nn.Module):
    recurrent = True  # generation carries state instead of a KV cache

    def __init__(self, config: RNNConfig):
        super().__init__()
        if config.vocab_size is None:
            raise TinyGPTError("RNNConfig.vocab_size is null: set it (a run takes the tokenizer's) before building the model")
        self.config = config
        kind = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[config.arch]
        extra = {"nonlinearity": "tanh"} if config.arch == "rnn" else {}
        self.embedding = nn.Embedding(config.vocab_size, config.n_embd)
        self.rnn = kind(
            config.n_embd,
            config.n_hidden,
            num_layers=config.n_layer,
            batch_first=True,
            dropout=config.dropout if config.n_layer > 1 else 0.0,
            **extra,
        )
        self.drop = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.n_hidden, config.vocab_size)  # y_t = V h_t (+ bias)
        nn.init.normal_(self.embedding.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.02)
        nn.init.zeros_(self.lm_head.bias)
        if config.arch == "lstm":
            # Forget-gate bias 1: start by remembering (Jozefowicz et al., 2015).
            for name, p in self.rnn.named_parameters():
                if name.startswith("bias_ih"):
                    with torch.no_grad():
                        p[config.n_hidden : 2 * config.n_hidden].fill_(1.0)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: RNNState | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: (B, T). With `cache`, start from its state and leave the final state in it."""
        x = self.drop(self.embedding(idx))
        dtype = torch.promote_types(self.embedding.weight.dtype, torch.float32)
        initial = None
        if cache is not None and cache.h is not None:
            initial = (cache.h.to(dtype), cache.c.to(dtype)) if self.config.arch == "lstm" else cache.h.to(dtype)
        # The recurrence runs in at least float32 whatever the autocast (a float64 model in float64): autocast sends cuDNN's fused RNNs
        # to fp16 even under bf16 autocast (aten/src/ATen/cudnn/AutocastRNN.cpp hard-codes kHalf),
        # with no GradScaler to keep small gradients from underflowing, and it would run the
        # explicit steps' matmuls in bf16; either way the rounding compounds over every time step.
        # It is a small share of the work; the LM head below still runs in the autocast dtype.
        with torch.autocast(x.device.type, enabled=False):
            if self.config.impl == "fused":
                out, final = self.rnn(x.to(dtype), initial)
            else:
                out, final = self._explicit(x.to(dtype), initial)
        if cache is not None:
            cache.h, cache.c = final if self.config.arch == "lstm" else (final, None)
        if last_only:
            out = out[:, -1:, :]
        logits = self.lm_head(self.drop(out))
        return logits, next_token_loss(logits, targets)

    def _explicit(self, x: torch.Tensor, initial):
        """The step equations above, applied layer by layer and step by step."""
        B, T, _ = x.shape
        cfg = self.config
        zeros = x.new_zeros(cfg.n_layer, B, cfg.n_hidden)
        if cfg.arch == "lstm":
            h0, c0 = initial if initial is not None else (zeros, zeros)
        else:
            h0, c0 = (initial if initial is not None else zeros), None
        finals_h, finals_c = [], []
        layer_in = x
        for layer in range(cfg.n_layer):
            w = [getattr(self.rnn, f"{n}_l{layer}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            h, c = h0[layer], (c0[layer] if c0 is not None else None)
            outputs = []
            for t in range(T):
                if cfg.arch == "lstm":
                    h, c = lstm_step(layer_in[:, t], (h, c), *w)
                elif cfg.arch == "gru":
                    h = gru_step(layer_in[:, t], h, *w)
                else:
                    h = elman_step(layer_in[:, t], h, *w)
                outputs.append(h)
            finals_h.append(h)
            finals_c.append(c)
            layer_in = torch.stack(outputs, dim=1)
            if layer < cfg.n_layer - 1:
                layer_in = F.dropout(layer_in, cfg.dropout, self.training)
        h_n = torch.stack(finals_h)
        return layer_in, ((h_n, torch.stack(finals_c)) if cfg.arch == "lstm" else h_n)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.embedding.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6 per weight used in a matmul (the embedding is a lookup)."""
        return 6 * self.num_params(non_embedding=True)
