"""Autoregressive generation with a KV cache and the usual sampling controls.

No I/O and no Hydra: token-level decoding (`Decoder`) and text-level helpers (`generate`,
`stream`) that the trainer, sample.py and notebooks share. The controls are the fields of
`gpt.config.SamplingSettings`; sample.py's settings extend that class and the server builds
one per request, so a new control is a field there and its use in `next_tokens`.

Longer than the context: a transformer sees at most block_size tokens, so once prompt +
generated text outgrow it, each new token is predicted from the last block_size tokens,
re-encoded at positions 0..block_size-1 (exactly what generation without a cache does). The
cache then cannot be reused: every cached key was computed at a position that has since
shifted (learned or sinusoidal tables, and the absolute rotation angles of RoPE too), and with
several layers a key also depends on the dropped tokens; past that point each step recomputes
the window. Recurrent models carry a fixed-size state and have no such limit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError
from gpt.model import GPT, KVCache
from gpt.model.rnn import RNNState

logger = logging.getLogger("tinygpt")


# --- turning logits into a choice --------------------------------------------------------------


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


def next_tokens(logits: torch.Tensor, cfg: SamplingSettings, seen: torch.Tensor | None, generators) -> torch.Tensor:
    """The next token of each row under `cfg`'s controls (every control is applied here): the
    repetition penalty, then greedy at temperature 0, else temperature, top-k / top-p / min-p,
    and a draw from each row's own generator. logits: (B, V); seen: (B, V) bool, the tokens in
    each row's text (None without a repetition penalty). Shape (B,)."""
    logits = penalize_repeats(logits, seen, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p)
    if cfg.typical_p is not None and cfg.typical_p < 1.0:
        logits = keep_typical(logits, cfg.typical_p)
    probs = F.softmax(logits, dim=-1)
    if not bool(torch.isfinite(probs).all()):  # NaN/inf probabilities: the outputs were not finite
        raise TinyGPTError(
            "the model's outputs are not finite numbers (its weights hold NaN or inf: a diverged run); "
            "sample from an earlier checkpoint (ckpt=<run>/checkpoints/ckpt-<step>.pt)"
        )
    return torch.cat([torch.multinomial(probs[b], 1, generator=g) for b, g in enumerate(generators)])


# --- token-level decoding ----------------------------------------------------------------------


class Decoder:
    """Decodes a batch of token prompts one step at a time.

    Prompts may differ in length: they are left-padded into one batch, and the padding is masked
    out of attention and position ids, so each row gets exactly the tokens it would get alone.
    Each row samples from its own seeded generator (`seeds[b]`), for the same reason.
    """

    def __init__(self, model: GPT, prompts: list[list[int]], cfg: SamplingSettings, seeds: list[int]):
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        self.model, self.cfg = model, cfg
        self.block_size = model.config.block_size
        self.device = next(model.parameters()).device
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        self.pad = torch.tensor([width - n for n in lengths], dtype=torch.long, device=self.device)
        rows = [[0] * (width - len(p)) + list(p) for p in prompts]
        self.tokens = torch.tensor(rows, dtype=torch.long, device=self.device)  # (B, columns so far)
        self.generators = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        self.cache: KVCache | None = None
        self.offset = 0  # column of self.tokens where the cache's column 0 sits
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
            logits, _ = self.model(self.tokens[:, self.offset + cache.length :], cache=cache, last_only=True)
        else:
            # Encode a window from scratch: everything, or once the longest row outgrows the
            # context, its last block_size tokens (shorter rows keep their padding in front).
            self.offset = max(0, width - self.block_size)  # the longest row has no padding
            window = self.tokens[:, self.offset :]
            pad = (self.pad - self.offset).clamp(min=0)
            # The longest row fills the context at block_size + its padding columns.
            self.cache = KVCache(self.model.config.n_layer, self.block_size + int(pad.min()), pad)
            logits, _ = self.model(window, cache=self.cache, last_only=True)
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
            logits, _ = self.model(self.tokens[:, -1:], cache=self.cache, last_only=True)
            return logits[:, -1, :].float()
        states, last = [], []
        for b in range(self.tokens.size(0)):
            state = RNNState()
            logits, _ = self.model(self.tokens[b : b + 1, int(self.pad[b]) :], cache=state, last_only=True)
            states.append(state)
            last.append(logits[:, -1, :])
        self.cache = RNNState.stack(states)
        return torch.cat(last).float()

    @torch.no_grad()
    def step(self, vocab_limit: int | None = None) -> torch.Tensor:
        """Choose and append the next token of every row; returns them, shape (B,)."""
        logits = self._next_logits()
        if vocab_limit is not None and vocab_limit < logits.size(-1):
            # A model may have more output ids than its tokenizer (padded vocab): never pick those.
            logits[:, vocab_limit:] = float("-inf")
        next_ids = next_tokens(logits, self.cfg, self.seen, self.generators)
        self.tokens = torch.cat([self.tokens, next_ids[:, None]], dim=1)
        self.seen[torch.arange(len(next_ids), device=self.device), next_ids] = True
        return next_ids


# --- text level --------------------------------------------------------------------------------


@dataclass
class TextRow:
    ids: list[int] = field(default_factory=list)
    emitted: str = ""  # text yielded so far
    done: bool = False


def encode_prompt(tokenizer, prompt: str | list[int], block_size: int | None) -> list[int]:
    """Tokens for a prompt: text, or ids already (a rendered conversation). An empty prompt
    starts from end-of-text (or a newline when the tokenizer has no such token); a prompt longer
    than the context keeps its last block_size tokens, with a notice."""
    if isinstance(prompt, list):
        ids = list(prompt)
    elif prompt == "":
        eot = getattr(tokenizer, "eot_id", None)
        if eot is not None:
            return [eot]
        try:
            return tokenizer.encode("\n")
        except TinyGPTError:
            raise TinyGPTError(
                "the prompt is empty and this tokenizer has no end-of-text token or newline; give a prompt"
            ) from None
    else:
        ids = tokenizer.encode(prompt)
    if block_size is not None and len(ids) > block_size:
        logger.warning(f"notice: the prompt has {len(ids)} tokens; the model sees only the last {block_size} (its context)")
        ids = ids[-block_size:]
    return ids


def _generate_rows(
    model, tokenizer, prompts: list[str | list[int]], cfg: SamplingSettings, num_samples: int
) -> Iterator[tuple[int, str]]:
    """Yield (row, new text) pieces as rows progress. Row r is sample r % num_samples of prompt
    r // num_samples and draws from seed cfg.seed + r % num_samples, so results do not depend
    on how prompts are batched."""
    # Recurrent models read prompts of any length; a transformer sees its last block_size tokens.
    block = None if getattr(model, "recurrent", False) else model.config.block_size
    encoded = [encode_prompt(tokenizer, p, block) for p in prompts]
    row_prompts = [ids for ids in encoded for _ in range(num_samples)]
    seeds = [cfg.seed + s for _ in encoded for s in range(num_samples)]
    decoder = Decoder(model, row_prompts, cfg, seeds)
    rows = [TextRow() for _ in row_prompts]
    # End-of-text ends a sample; under a chat template, so does the end of a turn (or the start of
    # another one).
    stops = (getattr(tokenizer, "stop_ids", None) or {getattr(tokenizer, "eot_id", None)}) if cfg.stop_at_eot else set()

    was_training = model.training
    model.eval()
    try:
        for _ in range(cfg.max_new_tokens):
            next_ids = decoder.step(vocab_limit=tokenizer.vocab_size).tolist()
            for r, (row, tok) in enumerate(zip(rows, next_ids)):
                if row.done:
                    continue
                if tok in stops:  # the end: show whatever was held back for a stop string or a partial character
                    piece = tokenizer.decode(row.ids)[len(row.emitted) :]
                    row.emitted += piece
                    row.done = True
                    if piece:
                        yield r, piece
                    continue
                row.ids.append(tok)
                piece = advance_text(row, decode_safe(tokenizer, row.ids), cfg.stop)
                if piece:
                    yield r, piece
            if all(row.done for row in rows):
                break
        for r, row in enumerate(rows):  # flush what was held back, now that nothing follows
            if not row.done:
                piece = tokenizer.decode(row.ids)[len(row.emitted) :]
                row.emitted += piece
                if piece:
                    yield r, piece
    finally:
        model.train(was_training)


def decode_safe(tokenizer, ids: list[int]) -> str:
    """Decoded text of ids, holding back a trailing partial UTF-8 character (BPE tokenizers can
    split one character over several tokens; decoding them one by one would show garbage)."""
    text = tokenizer.decode(ids)
    return text[:-1] if text.endswith("\ufffd") else text


def advance_text(row: TextRow, full: str, stops: tuple[str, ...]) -> str:
    """The next piece of row's text that can be shown, given its full decoded text so far.

    Text that could be the start of a stop string is held back until it is decided, so shown
    text never has to be taken back; a completed stop string ends the row (and is not shown).
    Because of that, a stop string can only begin in the text not yet shown."""
    pending = full[len(row.emitted) :]
    hits = [i for s in stops if (i := pending.find(s)) >= 0]
    if hits:
        piece, row.done = pending[: min(hits)], True
    else:
        # the longest tail of the pending text that starts some stop string (bounded: no slice of
        # a stop string longer than the text it is compared with)
        hold = max((n for s in stops for n in range(min(len(s) - 1, len(pending)), 0, -1) if pending[-n:] == s[:n]), default=0)
        piece = pending[: len(pending) - hold]
    row.emitted += piece
    return piece


@torch.no_grad()
def generate(
    model: GPT, tokenizer, prompts: list[str | list[int]], cfg: SamplingSettings, num_samples: int = 1
) -> list[list[str]]:
    """Continuations of each prompt (text, or ids): result[i][j] is sample j of prompts[i]."""
    texts = [""] * (len(prompts) * num_samples)
    for r, piece in _generate_rows(model, tokenizer, prompts, cfg, num_samples):
        texts[r] += piece
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]


@torch.no_grad()
def stream(model: GPT, tokenizer, prompt: str | list[int], cfg: SamplingSettings, sample_index: int = 0) -> Iterator[str]:
    """Yield the continuation of one prompt piece by piece, as it is generated. Gives the same
    text as sample `sample_index` of `generate` with the same config."""
    cfg = replace(cfg, seed=cfg.seed + sample_index)
    for _, piece in _generate_rows(model, tokenizer, [prompt], cfg, 1):
        yield piece
