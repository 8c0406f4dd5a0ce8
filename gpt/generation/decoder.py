"""Token-level decoding: a batch of token prompts, one step at a time, through the KV cache (or,
for recurrent models, their carried state)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpt.config import SamplingSettings
from gpt.generation.sampling import next_tokens, not_finite
from gpt.model import GPT
from gpt.model.cache import StaticKVCache
from gpt.model.rnn import RNNState


class Decoder:
    """Decodes a batch of token prompts one step at a time.

    Prompts may differ in length: they are left-padded into one batch, and the padding is masked
    out of attention and position ids, so each row gets exactly the tokens it would get alone.
    Each row samples from its own seeded generator (`seeds[b]`), for the same reason.
    """

    def __init__(
        self,
        model: GPT,
        prompts: list[list[int]],
        cfg: SamplingSettings,
        seeds: list[int],
        device: torch.device | None = None,
        lockstep: bool = False,
    ):
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.model, self.cfg = model, cfg
        self.block_size = model.config.block_size
        self.device = device or next(model.parameters()).device  # see generate's `device`
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        self.pad_list = [width - n for n in lengths]  # also kept on the host: reading it back would wait for the device
        self.pad = torch.tensor(self.pad_list, dtype=torch.long, device=self.device)
        rows = [[0] * (width - len(p)) + list(p) for p in prompts]
        self.tokens = torch.tensor(rows, dtype=torch.long, device=self.device)  # (B, columns so far)
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        # `lockstep`: the model computes only with every process taking part (a sharded one), so every process
        # must run the same forwards: each step's tokens (and finite flags) are rank 0's. Equal
        # weights, prompts and seeds would give equal tokens anyway; this keeps a rounding
        # difference between two devices from ending one process's rows sooner, which would
        # leave the others waiting in an all-gather it never joins.
        self.lockstep = lockstep and dist.is_available() and dist.is_initialized()
        self.cache: StaticKVCache | RNNState | None = None
        self.offset = 0  # column of self.tokens where the cache's column 0 sits
        self.filled = 0  # columns the cache holds, counted here: the host never reads the cache's own
        self.prompt_width = width
        self.seen = torch.zeros(len(prompts), model.config.vocab_size, dtype=torch.bool, device=self.device)
        if cfg.repetition_penalty != 1.0:
            for b, p in enumerate(prompts):
                self.seen[b, torch.tensor(p, device=self.device)] = True

    def _next_logits(self) -> torch.Tensor:
        if getattr(self.model, "recurrent", False):
            return self._next_logits_recurrent()
        if not self.cfg.kv_cache:
            return self._plain_logits()
        width = self.tokens.size(1)
        cache = self.cache
        if cache is not None and width - self.offset <= cache.max_len:
            # Only the columns the cache has not seen yet (after the first step: one).
            logits, _ = self.model(_fresh(self.tokens[:, self.offset + self.filled :]), cache=cache, last_only=True)
        else:
            # Encode a window from scratch: everything, or once the longest row outgrows the
            # context, its last block_size tokens (shorter rows keep their padding in front).
            self.offset = max(0, width - self.block_size)  # the longest row has no padding
            window = _fresh(self.tokens[:, self.offset :])
            pad = (self.pad - self.offset).clamp(min=0)
            # The longest row fills the context at block_size + its padding columns; a cache no
            # longer than the sample needs (every step attends over all of its columns).
            least = min(max(0, p - self.offset) for p in self.pad_list)
            wanted = window.size(1) + max(1, self.cfg.max_new_tokens - (width - self.prompt_width))
            c = self.model.config
            self.cache = StaticKVCache(
                c.n_layer,
                c.n_kv_head,
                c.head_dim,
                min(self.block_size + least, wanted),
                pad,
                _compute_dtype(self.model, self.device),
            )
            logits, _ = self.model(window, cache=self.cache, last_only=True)
        self.filled = width - self.offset
        return logits[:, -1, :].float()

    def _plain_logits(self) -> torch.Tensor:
        """kv_cache=false: the model's plain forward pass over each row's own last block_size
        tokens, with no cache, no padding and no mask (rows of one length go together). It shares
        no code with the cached path, so comparing the two can catch a bug in either."""
        out: list[torch.Tensor | None] = [None] * self.tokens.size(0)
        for pad in self.pad.unique().tolist():
            rows = (self.pad == pad).nonzero().flatten()
            window = self.tokens[rows, pad:][:, -self.block_size :]
            logits, _ = self.model(window, last_only=True)
            for i, row in enumerate(rows.tolist()):
                out[row] = logits[i, -1, :]
        return torch.stack(out).float()

    def _next_logits_recurrent(self) -> torch.Tensor:
        """Recurrent models carry a fixed-size state instead of a cache and have no context
        limit. Each prompt is read on its own (padding would flow into the state), then the
        rows step together. Without `kv_cache` every step re-reads each row from the start."""
        if self.cfg.kv_cache and self.cache is not None:
            logits, _ = self.model(_fresh(self.tokens[:, -1:]), cache=self.cache, last_only=True)
            return logits[:, -1, :].float()
        states, last = [], []
        for b in range(self.tokens.size(0)):
            state = RNNState()
            logits, _ = self.model(self.tokens[b : b + 1, self.pad_list[b] :], cache=state, last_only=True)
            states.append(state)
            last.append(logits[:, -1, :])
        self.cache = RNNState.stack(states)
        return torch.cat(last).float()

    @torch.no_grad()
    def step(self, vocab_limit: int | None = None) -> torch.Tensor:
        """Choose and append the next token of every row; returns them, shape (B,), on the
        device. Raises TinyGPTError when the model's outputs are not finite, which waits for the
        device to read that back; `steps` reads many steps at once."""
        next_ids, finite = self._advance(vocab_limit)
        if finite is not None and not bool(finite.all()):
            raise not_finite()
        return next_ids

    @torch.no_grad()
    def steps(self, n: int, vocab_limit: int | None = None) -> list[tuple[list[int], bool]]:
        """Choose and append the next n tokens of every row; for each step, (its token of each
        row, whether the model's outputs were finite), read back to the host in one transfer
        after the n steps: until then the host queues work without waiting for the device. The
        caller raises `not_finite()` for a step it uses whose outputs were not finite."""
        ids, finite = [], []
        for _ in range(n):
            next_ids, ok = self._advance(vocab_limit)
            ids.append(next_ids)
            finite.append(ok.all() if ok is not None else torch.ones((), dtype=torch.bool, device=self.device))
        table = torch.cat([torch.stack(ids), torch.stack(finite)[:, None].long()], dim=1).tolist()
        return [(row[:-1], bool(row[-1])) for row in table]

    def _advance(self, vocab_limit: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step, all on the device: the next tokens (B,), and whether each row's
        probabilities were finite (B,) bool (None when decoding greedily: no probabilities)."""
        with decode_kernels(self.device):
            logits = self._next_logits()
        if vocab_limit is not None and vocab_limit < logits.size(-1):
            # A model may have more output ids than its tokenizer (padded vocab): never pick those.
            logits[:, vocab_limit:] = float("-inf")
        checks: list[torch.Tensor] = []
        next_ids = next_tokens(logits, self.cfg, self.seen, self.generators, checks=checks)
        finite = checks[0] if checks else None
        if self.lockstep:
            shared = torch.stack([next_ids, finite.long() if finite is not None else torch.ones_like(next_ids)])
            dist.broadcast(shared, src=0)
            next_ids, finite = shared[0], (shared[1].bool() if finite is not None else None)
        self.tokens = torch.cat([self.tokens, next_ids[:, None]], dim=1)
        if self.cfg.repetition_penalty != 1.0:  # `seen`'s one reader
            # scatter_, not an indexed assignment: on CUDA that made the host wait for the device
            # at every token (found by benchmarks/decode_kernels.py on an H200)
            self.seen.scatter_(1, next_ids[:, None], True)
        return next_ids, finite


# The attention kernels a decode step may use on CUDA, named rather than left to torch's own
# choice. Each step attends over one more key than the last, and with torch's default choice every
# new key length cost 36-52 ms once (torch 2.11 on two H200s, 2026-12-04: 42-48 ms a token at
# batch 1 against 5.3-6.5 ms with these three named; cuDNN's alone, or the efficient kernel's
# alone, ran at 5.0-6.4 ms). What torch's default did differently was not found. benchmarks/decode_kernels.py
# measures each choice; None leaves torch's own.
DECODE_KERNELS: list[SDPBackend] | None = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_kernels(device: torch.device) -> contextlib.AbstractContextManager:
    """The SDPA kernel choice for a decode step on `device` (see DECODE_KERNELS)."""
    if device.type != "cuda" or DECODE_KERNELS is None:
        return contextlib.nullcontext()
    return sdpa_kernel(DECODE_KERNELS)


def _compute_dtype(model: GPT, device: torch.device) -> torch.dtype:
    """The dtype attention's keys and values come in, and so the cache's: autocast's where it is
    on around the decoder's calls, else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.lm_head.weight.dtype


def _fresh(columns: torch.Tensor) -> torch.Tensor:
    """A copy of some columns of the growing token table, with the strides of a new tensor. The
    slice itself has a row stride that grows every step (even when a single row makes it count
    as contiguous), and a compiled model guards on its inputs' strides: it would recompile for
    every token until it gave up and ran eagerly."""
    return columns.clone(memory_format=torch.contiguous_format)
