"""Text in and out of generation: a prompt's ids (`encode_prompt`), and one row's text as it is
generated (`TextStream`): where it ends (the end-of-text or end-of-turn token, a stop string)
and which of its text may be shown so far. The one place that decides it, for sample.py,
`tinygpt chat` and the server alike."""

from __future__ import annotations

import logging

from gpt.errors import TinyGPTError

logger = logging.getLogger("tinygpt")


def stop_ids(tokenizer) -> frozenset:
    """The ids that end a sample: end-of-text, and under a chat template the end of a turn (or the
    start of another one)."""
    ids = getattr(tokenizer, "stop_ids", None) or {getattr(tokenizer, "eot_id", None)}
    return frozenset(ids) - {None}


class TextStream:
    """One row's generated text. `push` takes each sampled token and returns the text it releases:
    text that could be the start of a stop string is held back until it is decided (so shown
    text never has to be taken back), and so is a trailing partial UTF-8 character (a BPE can
    split one character over several tokens). A stop token or a completed stop string ends the
    row (`done`; neither is shown). `flush` releases what is held back once nothing follows."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), stop_at_eot: bool = True):
        self.tokenizer, self.stop = tokenizer, tuple(stop)
        self.stop_ids = stop_ids(tokenizer) if stop_at_eot else frozenset()
        self.ids: list[int] = []  # generated so far, stop token excluded
        self.emitted = ""  # text released so far
        self.done = False

    def push(self, token: int) -> str:
        if token in self.stop_ids:  # the end: show whatever was held back for a stop string or a partial character
            self.done = True
            return self.flush()
        self.ids.append(token)
        return self._advance(decode_safe(self.tokenizer, self.ids))

    def flush(self) -> str:
        piece = self.tokenizer.decode(self.ids)[len(self.emitted) :]
        self.emitted += piece
        return piece

    def _advance(self, full: str) -> str:
        """The next piece that can be shown, given the row's full decoded text so far. Because
        what could begin a stop string is held back, a stop string can only begin in the text
        not yet shown."""
        pending = full[len(self.emitted) :]
        hits = [i for s in self.stop if (i := pending.find(s)) >= 0]
        if hits:
            piece, self.done = pending[: min(hits)], True
        else:
            # the longest tail of the pending text that starts some stop string (bounded: no slice
            # of a stop string longer than the text it is compared with)
            hold = max(
                (n for s in self.stop for n in range(min(len(s) - 1, len(pending)), 0, -1) if pending[-n:] == s[:n]), default=0
            )
            piece = pending[: len(pending) - hold]
        self.emitted += piece
        return piece


def utf8(text: str, what: str) -> str:
    """`text` as given, or a one-line error where it is not UTF-8. Python reads a command line
    and stdin with surrogateescape: a byte that is no UTF-8 comes as a lone surrogate
    (U+DC80-U+DCFF), which no tokenizer takes and printing it fails mid-output."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        seen = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate U+{code:04X}"
        raise TinyGPTError(f"{what} is not UTF-8 text ({seen} at character {e.start}); give it as UTF-8") from None
    return text


def decode_safe(tokenizer, ids: list[int]) -> str:
    """Decoded text of ids, holding back a trailing partial UTF-8 character (BPE tokenizers can
    split one character over several tokens; decoding them one by one would show garbage)."""
    text = tokenizer.decode(ids)
    return text[:-1] if text.endswith("\ufffd") else text


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
