"""Continuous batching: every request in flight is decoded together, one token per row per step.

A request (a `Job`) brings prompts x n rows. Rows join the batch as soon as a slot is free,
between two steps: their prompts are encoded together, left-padded, and their keys and values
merged into the batch's KV cache. A row leaves as soon as it is finished (a stop string, the
end-of-text token, max_tokens) or its client has gone, and the cache is compacted, so a slot
never waits for the longest row of a batch. No HTTP here: the web layer (gpt/serve/app.py)
hands in jobs and receives events.

Each row computes exactly what `gpt.generation` computes for it alone (sample.py): its own
seeded generator (seed + j for the j-th completion of a prompt), its own sampling controls, the
same prompt encoding and position ids (padding is masked out), and the same handling of text
that outgrows the context: such a row re-encodes its last block_size tokens every step, in a
group of its own, as the Decoder does (see gpt/generation/__init__.py's docstring).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError
from gpt.generation import TextStream, decode_kernels, next_tokens
from gpt.model import GPT
from gpt.model.cache import KVCache

logger = logging.getLogger("tinygpt")

# The most shapes of model calls the steps make (see Engine.warm_up): compiled, each is a graph.
COMPILED_SHAPES = 8

# Events sent to a job's `emit`, a list of them per step:
#   ("text", choice, piece)                     new text of one choice
#   ("end", choice, finish_reason, n_tokens)    the choice is finished: "stop" or "length"
#   ("error", message)                          the job failed; nothing more follows
Event = tuple


@dataclass
class Job:
    """One request: prompts (token ids, already within the model's context) x n completions.
    Choice i * n + j is completion j of prompt i and samples with seed settings.seed + j."""

    prompts: list[list[int]]
    settings: SamplingSettings
    n: int
    emit: Callable[[list[Event]], None]  # called from the engine's thread
    cancelled: threading.Event = field(default_factory=threading.Event)
    # what rows must share to be filtered as one batch (gpt.config.SamplingSettings.controls)
    group: tuple = field(init=False)

    def __post_init__(self) -> None:
        self.group = tuple(self.settings.controls().values())

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n

    def cancel(self) -> None:
        """The client has gone: its rows leave the batch before the next step."""
        self.cancelled.set()


class _Slot:
    """One row of the batch: a choice of a job being generated."""

    def __init__(self, job: Job, choice: int, prompt: list[int], tokenizer, vocab_size: int, device):
        self.job, self.choice = job, choice
        self.tokens = list(prompt)  # what the model reads: prompt + every sampled token
        # where the text ends and what of it may be shown: decided as for sample.py and chat
        self.text = TextStream(tokenizer, job.settings.stop, job.settings.stop_at_eot)
        self.steps = 0  # tokens sampled
        seed = job.settings.seed + choice % job.n
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.seen = None  # tokens in the text so far, for the repetition penalty
        if job.settings.repetition_penalty != 1.0:
            self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.seen[torch.tensor(prompt, device=device)] = True


class Engine:
    """Decodes the jobs handed to `submit` in a background thread, continuously batched.

    max_batch: rows decoded together (a job larger than that runs alone). max_queue: jobs that
    may wait for a slot; `submit` refuses more (the web layer answers 503). autocast: the
    runtime's compute-dtype context (a factory: entered in the engine's thread, once for as
    long as it has work). observe: called after each step, e.g. gpt.runtime.threads'
    Threads.observe (a no-op unless threads=auto, where CPU threads follow the free cores, as
    in training); a notice it returns is logged."""

    def __init__(
        self,
        model: GPT,
        tokenizer,
        max_batch: int = 32,
        max_queue: int = 64,
        autocast=contextlib.nullcontext,
        observe: Callable[[], str | None] | None = None,
    ):
        if getattr(model, "recurrent", False):
            raise ValueError("the batching engine serves transformer models (recurrent models carry no KV cache)")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.block = model.config.block_size
        self.n_layer = model.config.n_layer
        self.device = next(model.parameters()).device
        self.max_batch, self.max_queue, self.autocast, self.observe = max_batch, max_queue, autocast, observe
        self._pending: deque[Job] = deque()
        self._wake = threading.Condition()
        self._slots: list[_Slot] = []  # rows in the cache, in its row order
        self._long: list[_Slot] = []  # rows past the context: no cache, their window re-encoded each step
        self._joining: list[_Slot] = []  # rows admitted this step, until they are in the cache
        self._cache: KVCache | None = None
        self._stopping = False
        self._observed = 0.0  # when `observe` last ran
        self.stats = {"jobs": 0, "cancelled": 0, "failed": 0, "tokens": 0, "steps": 0}
        self._thread = threading.Thread(target=self._run, name="tinygpt-engine", daemon=True)
        self._thread.start()

    # --- the web layer's side ------------------------------------------------------------------

    def submit(self, job: Job) -> bool:
        """Queue a job; False (and nothing queued) when max_queue jobs are already waiting."""
        with self._wake:
            if len(self._pending) >= self.max_queue:
                return False
            self._pending.append(job)
            self._wake.notify()
        return True

    def load(self) -> dict:
        """Rows being decoded and jobs waiting, for /health."""
        with self._wake:
            return {"active_rows": len(self._slots) + len(self._long), "queued": len(self._pending), **self.stats}

    def warm_up(self) -> float:
        """Decode a short job of each shape a step can take, one after the other; the seconds it
        took. For a compiled model (`tinygpt serve compile=true`) each shape is a graph of its own,
        compiled on first use: here, before serving, rather than minutes into a request. The shapes:
        one row or several (dynamo specialises sizes of 1), each with a prompt of one token or of
        more (a window a row past the context re-encodes is one of these: see gpt.model.cache.SPARE), and the
        one-token steps after a prompt: 6. Where the runtime has attention run in fp32 below some
        length (bf16 autocast on a CPU: gpt.runtime.devices.CPU_FP32_ATTENTION_BELOW), prompts of
        that length or more are another branch, so with a context that long, prompts of that length
        too: 8 (COMPILED_SHAPES). The counters start from zero again after it."""
        t0 = time.perf_counter()
        settings = SamplingSettings(max_new_tokens=2, temperature=0.0, stop_at_eot=False)  # every row takes both steps
        below = max((getattr(m, "fp32_below", 0) for m in self.model.modules()), default=0)  # Runtime.tune's
        widths = [1, 2] + ([below] if 0 < below <= self.block else [])
        for rows in (1, 2):
            for width in widths:
                self._decode_and_wait([[0] * width] * rows, settings)
        with self._wake:
            self.stats = dict.fromkeys(self.stats, 0)
        return time.perf_counter() - t0

    def _decode_and_wait(self, prompts: list[list[int]], settings: SamplingSettings) -> None:
        """Submit a job of `prompts` and wait until every row has ended (its text is dropped)."""
        ended, failed, done = [], [], threading.Event()

        def emit(events: list[Event]) -> None:
            ended.extend(e for e in events if e[0] == "end")
            failed.extend(e[1] for e in events if e[0] == "error")
            if failed or len(ended) == len(prompts):
                done.set()

        if not self.submit(Job(prompts, settings, 1, emit=emit)):
            raise TinyGPTError("the engine's queue is full; warm it up before serving")
        while not done.wait(1.0):
            if not self._thread.is_alive():  # it ended outside a step (a step's failure is an event)
                raise TinyGPTError("the serving engine stopped while warming up; its error is in the log above")
        if failed:
            raise TinyGPTError(f"decoding failed while warming up: {failed[0]}")

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)

    # --- the engine's thread -------------------------------------------------------------------

    def _run(self) -> None:
        while self._wait_for_work():
            # One autocast region for as long as there is work, not one per step: autocast keeps
            # its low-precision casts of the fp32 weights only while a region is open (and only of
            # weights that require grad, as a loaded model's do), so a region per step would cast
            # every weight again for every token. Closed when idle, so no copies are held then.
            with torch.no_grad(), self.autocast():
                while True:
                    self._guarded_step()
                    if self.observe is not None and time.monotonic() - self._observed > 1.0:  # it reads /proc: not every step
                        self._observed = time.monotonic()
                        notice = self.observe()
                        if notice:
                            logger.warning(notice)
                    with self._wake:
                        if self._stopping or not self._busy():
                            break

    def _busy(self) -> bool:
        """Rows to decode or jobs waiting (call with self._wake held)."""
        return bool(self._slots or self._long or self._pending)

    def _wait_for_work(self) -> bool:
        """Sleep until there is work (True) or the engine is closing (False)."""
        with self._wake:
            while not self._busy() and not self._stopping:
                self._wake.wait()
            return not self._stopping

    def _guarded_step(self) -> None:
        try:
            with decode_kernels(self.device):  # the attention kernels decode steps use (see there)
                self._step()
        except Exception:
            # Not the client's doing: the server log gets the traceback, each client one line.
            logger.exception("generation failed; the jobs in the batch are ended with an error")
            jobs = {id(s.job): s.job for s in self._slots + self._long + self._joining}
            for job in jobs.values():
                self.stats["failed"] += 1
                _emit(job, [("error", "the server failed while generating; see its log")])
            self._slots, self._long, self._joining, self._cache = [], [], [], None

    def _step(self) -> None:
        self._drop([s for s in self._slots + self._long if s.job.cancelled.is_set()], cancelled=True)
        joining = self._joining = self._admit()
        # Rows whose next input would pass the context re-encode their window (see the docstring).
        outgrown = [s for s in self._slots if len(s.tokens) > self.block]
        self._drop(outgrown)
        self._long += outgrown
        over = list(self._long)
        stepping, logits = list(self._slots), []
        if stepping:
            last = torch.tensor([[s.tokens[-1]] for s in stepping], device=self.device)
            logits.append(self.model(last, cache=self._cache, last_only=True)[0][:, -1, :].float())
        if over:
            window = torch.tensor([s.tokens[-self.block :] for s in over], device=self.device)
            fresh = KVCache(self.n_layer, self.block, torch.zeros(len(over), dtype=torch.long, device=self.device))
            logits.append(self.model(window, cache=fresh, last_only=True)[0][:, -1, :].float())
        if joining:
            logits.append(self._prefill(joining))
        if not logits:
            return
        rows = stepping + over + joining
        self._slots, self._joining = stepping + joining, []  # the cache's rows, in order
        self.stats["steps"] += 1  # before the events: a job's last one must find every count made
        self._sample_and_emit(rows, torch.cat(logits))

    def _admit(self) -> list[_Slot]:
        """Rows of the waiting jobs that fit (first come, first served; a job never splits)."""
        joining: list[_Slot] = []
        with self._wake:
            while self._pending:
                job = self._pending[0]
                if job.cancelled.is_set():
                    self._pending.popleft()
                    self.stats["cancelled"] += 1
                    continue
                busy = len(self._slots) + len(self._long) + len(joining)
                if busy and busy + job.rows > self.max_batch:
                    break
                self._pending.popleft()
                self.stats["jobs"] += 1
                vocab = self.model.config.vocab_size
                joining += [
                    _Slot(job, c, job.prompts[c // job.n][-self.block :], self.tokenizer, vocab, self.device)
                    for c in range(job.rows)
                ]
        return joining

    def _prefill(self, joining: list[_Slot]) -> torch.Tensor:
        """Encode the prompts of joining rows together (left-padded, as gpt.generation's
        Decoder does), merge their keys and values into the batch's cache; their next logits."""
        lengths = [len(s.tokens) for s in joining]
        width = max(lengths)
        pad = torch.tensor([width - n for n in lengths], dtype=torch.long, device=self.device)
        ids = torch.tensor([[0] * (width - len(s.tokens)) + s.tokens for s in joining], device=self.device)
        cache = KVCache(self.n_layer, self.block + int(pad.min()), pad)
        logits = self.model(ids, cache=cache, last_only=True)[0][:, -1, :].float()
        self._cache = cache if self._cache is None else self._cache.merge(cache, self.block)
        return logits

    def _drop(self, leaving: list[_Slot], cancelled: bool = False) -> None:
        """Take rows out of the batch and its cache (which is then compacted)."""
        if not leaving:
            return
        if cancelled:
            self.stats["cancelled"] += len({id(s.job) for s in leaving})
        gone = {id(s) for s in leaving}
        self._long = [s for s in self._long if id(s) not in gone]
        keep = [i for i, s in enumerate(self._slots) if id(s) not in gone]
        if len(keep) == len(self._slots):
            return
        self._slots = [self._slots[i] for i in keep]
        self._cache = self._cache.select(keep, self.block) if keep else None

    def _sample_and_emit(self, rows: list[_Slot], logits: torch.Tensor) -> None:
        vocab_limit = self.tokenizer.vocab_size
        if vocab_limit < logits.size(-1):  # a padded vocabulary: never pick ids the tokenizer lacks
            logits[:, vocab_limit:] = float("-inf")
        chosen = _choose(rows, logits)
        events: dict[int, tuple[Job, list[Event]]] = {}
        finished = []
        for slot, tok in zip(rows, chosen):
            piece, reason = self._advance(slot, tok)
            job_events = events.setdefault(id(slot.job), (slot.job, []))[1]
            if piece:
                job_events.append(("text", slot.choice, piece))
            if reason:
                job_events.append(("end", slot.choice, reason, slot.steps))
                finished.append(slot)
        self.stats["tokens"] += len(rows)
        self._drop(finished)
        for job, evs in events.values():
            if evs:
                _emit(job, evs)

    def _advance(self, slot: _Slot, tok: int) -> tuple[str, str | None]:
        """Record a sampled token; the text it releases and, if the row ends, why (its text and
        its end decided by gpt.generation's TextStream, as for sample.py and chat)."""
        slot.tokens.append(tok)
        slot.steps += 1
        if slot.seen is not None:
            slot.seen[tok] = True
        piece = slot.text.push(tok)
        if slot.text.done:
            return piece, "stop"
        if slot.steps >= slot.job.settings.max_new_tokens:  # flush what was held back, now that nothing follows
            return piece + slot.text.flush(), "length"
        return piece, None


def _emit(job: Job, events: list[Event]) -> None:
    try:
        job.emit(events)
    except Exception:  # the receiving side is gone (server shutting down): nothing to tell
        job.cancel()


def _choose(rows: list[_Slot], logits: torch.Tensor) -> list[int]:
    """The next token of each row under its own job's controls. Rows with the same controls are
    filtered together; each draws from its own generator."""
    groups: dict[tuple, list[int]] = {}
    for i, slot in enumerate(rows):
        groups.setdefault(slot.job.group, []).append(i)
    chosen = [0] * len(rows)
    for idx in groups.values():
        group, cfg = logits[idx], rows[idx[0]].job.settings
        seen = torch.stack([rows[i].seen for i in idx]) if cfg.repetition_penalty != 1.0 else None
        try:
            picks = next_tokens(group, cfg, seen, [rows[i].generator for i in idx]).tolist()
        except TinyGPTError:  # controls so extreme the logits overflowed: that group decodes
            # greedily rather than failing every request in the batch
            picks = group.argmax(dim=-1).tolist()
        for i, tok in zip(idx, picks):
            chosen[i] = tok
    return chosen
