"""Tokenizers behind one small interface: encode, decode, vocab_size, eot_id (None when the
tokenizer has no end-of-text token) and a plain-dict form.

The dict form is stored in every checkpoint and in prepared data's meta.json, so sampling
rebuilds exactly the tokenizer the model was trained with and needs nothing else.

- char: one token per character, alphabet fitted on the data.
- byte: the 256 byte values of UTF-8, plus end-of-text (256). Any text round-trips.
- tiktoken: OpenAI's BPE encodings by name (gpt2, r50k_base, p50k_base, cl100k_base,
  o200k_base), downloaded by tiktoken on first use; or GPT-2's encoding from a local ranks file
  (`ranks_file`), for offline and air-gapped machines.
- bpe: a byte-level BPE trained on the corpus when it is prepared; hf: any Hugging Face
  tokenizer.json (gpt/tokenizers/hf.py).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Protocol

from gpt.chat.template import with_template
from gpt.errors import TinyGPTError
from gpt.tokenizers.hf import HFTokenizer, TrainedBPE

TIKTOKEN_NAMES = ("gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base")
GPT2_EOT = "<|endoftext|>"


class Tokenizer(Protocol):
    kind: str
    eot_id: int | None

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def to_dict(self) -> dict: ...


class CharTokenizer:
    """One token per character; the alphabet is fitted on the training text (sorted, so the
    same text always gives the same ids)."""

    kind = "char"
    eot_id = None

    def __init__(self, chars: list[str]):
        if len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("chars must be distinct single characters")
        self.chars = list(chars)
        self._stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown_chars(self, text: str) -> list[str]:
        return sorted(set(text) - self._stoi.keys())

    def encode(self, text: str) -> list[int]:
        unknown = self.unknown_chars(text)
        if unknown:
            shown = ", ".join(repr(c) for c in unknown[:10])
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            raise TinyGPTError(
                f"text has characters outside this char-level vocabulary: {shown}{more}; "
                f"use only the model's {self.vocab_size} known characters"
            )
        return [self._stoi[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}


class ByteTokenizer:
    """UTF-8 bytes as tokens (0..255) and end-of-text as 256."""

    kind = "byte"
    eot_id = 256

    @property
    def vocab_size(self) -> int:
        return 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # A model can emit bytes that do not form valid UTF-8: show U+FFFD instead of failing.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"kind": self.kind}


class TiktokenTokenizer:
    """A tiktoken BPE encoding. `gpt2` is the same encoding as `r50k_base` (50,257 tokens,
    <|endoftext|> = 50256), so it is loaded as r50k_base, whose single ranks file is what
    tiktoken caches (or what `ranks_file` points to)."""

    kind = "tiktoken"

    def __init__(self, name: str = "gpt2", ranks_file: str | None = None, vocab_size: int | None = None):
        """`vocab_size`, when given (it is recorded in meta.json and checkpoints), must match what
        was loaded: a recorded ranks file that is missing here must not be silently replaced by
        a different vocabulary."""
        if name not in TIKTOKEN_NAMES:
            raise TinyGPTError(f"tiktoken encoding {name!r} is unknown; use one of {', '.join(TIKTOKEN_NAMES)}")
        self.name, self.ranks_file = name, ranks_file
        self.enc = _load_encoding(name, ranks_file)
        self.eot_id = self.enc.eot_token
        if vocab_size is not None and vocab_size != self.enc.n_vocab:
            raise TinyGPTError(
                f"tiktoken {name} loaded with {self.enc.n_vocab} tokens, but this model/data was made with {vocab_size} "
                f"(from ranks file {ranks_file}); provide that ranks file"
            )

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        # Ordinary encoding: text that happens to spell "<|endoftext|>" is not a control token.
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts, num_threads=1)  # processes parallelise, not threads

    def decode(self, ids: list[int]) -> str:
        return self.enc.decode(ids)  # invalid UTF-8 pieces become U+FFFD

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "ranks_file": self.ranks_file, "vocab_size": self.vocab_size}


def _load_encoding(name: str, ranks_file: str | None):
    import tiktoken

    # A ranks file recorded on another machine may be missing here: then try tiktoken itself.
    if ranks_file and Path(ranks_file).expanduser().is_file():
        path = Path(ranks_file).expanduser()
        if name not in ("gpt2", "r50k_base"):
            raise TinyGPTError(
                f"a local ranks file is supported for gpt2 / r50k_base; for {name}, let tiktoken download it once "
                f"(or copy it into $TIKTOKEN_CACHE_DIR)"
            )
        from tiktoken.load import load_tiktoken_bpe
        from tiktoken_ext.openai_public import r50k_pat_str

        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception:
            raise TinyGPTError(
                f"{path} is not a tiktoken ranks file (base64 token and rank per line, e.g. r50k_base.tiktoken)"
            ) from None
        return tiktoken.Encoding(name=name, pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={GPT2_EOT: len(ranks)})
    try:
        return tiktoken.get_encoding("r50k_base" if name == "gpt2" else name)
    except Exception as e:  # tiktoken raises whatever its HTTP client raised
        missing = f"ranks file {ranks_file} does not exist and " if ranks_file else ""
        raise TinyGPTError(
            f"cannot load tiktoken encoding {name!r}: {missing}tiktoken's download failed ({type(e).__name__}). Offline, "
            f"pass data.tokenizer.ranks_file=<r50k_base.tiktoken> (gpt2/r50k_base) or copy the ranks file into "
            f"$TIKTOKEN_CACHE_DIR (see README, Offline data)"
        ) from None


_KINDS = {"char": CharTokenizer, "byte": ByteTokenizer, "tiktoken": TiktokenTokenizer, "bpe": TrainedBPE, "hf": HFTokenizer}


def normalize_spec(d: dict) -> dict:
    """The settings that matter for this kind of tokenizer: `data.tokenizer.kind=byte` on top of
    a BPE config leaves name/ranks_file behind, and they must neither break nor fingerprint it.
    A chat template (the "chat" entry, gpt.chat) stays: it adds tokens."""
    kind = d.get("kind")
    if kind not in _KINDS:
        raise TinyGPTError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(_KINDS)}")
    accepted = set(inspect.signature(_KINDS[kind].__init__).parameters) - {"self"}
    chat = {"chat": d["chat"]} if d.get("chat") else {}
    return {"kind": kind, **{k: v for k, v in d.items() if k in accepted}, **chat}


def tokenizer_identity(d: dict) -> dict:
    """What decides the token ids: not where a ranks file lives (its size, `vocab_size`, is part
    of the identity when known), and gpt2 is r50k_base."""
    spec = normalize_spec(d)
    chat = {"chat": spec.pop("chat")} if "chat" in spec else {}
    if spec["kind"] in ("bpe", "hf"):
        if spec.get("json_text"):  # the tokenizer itself, not where it came from
            return {"kind": spec["kind"], "sha256": _sha256(spec["json_text"]), **chat}
        return {k: v for k, v in spec.items() if k != "vocab_size" or spec["kind"] == "bpe"} | chat
    spec.pop("ranks_file", None)
    if spec.get("name") == "gpt2":
        spec["name"] = "r50k_base"
    return spec | chat


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def describe(d: dict) -> str:
    """A tokenizer's dict form in a few words: 'char (65 characters)', 'tiktoken r50k_base (50,257 tokens)'."""
    if d.get("chat"):
        return f"{describe({k: v for k, v in d.items() if k != 'chat'})} + chat template {d['chat'].get('template')}"
    spec = tokenizer_identity(d)
    if spec["kind"] == "char":
        return f"char ({len(spec.get('chars') or ())} characters)"
    if spec["kind"] == "tiktoken":
        size = f" ({spec['vocab_size']:,} tokens)" if spec.get("vocab_size") else ""
        return f"tiktoken {spec['name']}{size}"
    if spec["kind"] in ("bpe", "hf"):
        size = f" ({d['vocab_size']:,} tokens)" if d.get("vocab_size") else ""
        return f"{spec['kind']}{' ' + d['name'] if d.get('name') else ''}{size}"
    return spec["kind"]


def difference(model: dict, data: dict) -> str:
    """How two tokenizers differ, for an error message (not a 65-character vocabulary dump)."""
    a, b = tokenizer_identity(model), tokenizer_identity(data)
    text = f"{describe(model)} vs {describe(data)}"
    if a["kind"] == b["kind"] == "char":
        only_model, only_data = sorted(set(a["chars"]) - set(b["chars"])), sorted(set(b["chars"]) - set(a["chars"]))
        shown = lambda cs: ", ".join(repr(c) for c in cs[:8]) + (f" and {len(cs) - 8} more" if len(cs) > 8 else "")  # noqa: E731
        parts = [f"only the model has {shown(only_model)}"] * bool(only_model) + [f"only the data has {shown(only_data)}"] * bool(
            only_data
        )
        text += f": {'; '.join(parts) or 'the same characters in another order'}"
    return text


def require_same(model: dict, data: dict, mismatch: str, fix: str) -> None:
    """Refuse a model and data whose tokenizers differ (ids would mean other text): '<mismatch>
    (<how they differ>); <fix>'. Both in dict form."""
    if tokenizer_identity(model) != tokenizer_identity(data):
        raise TinyGPTError(f"{mismatch} ({difference(model, data)}); {fix}")


def tokenizer_from_dict(d: dict) -> Tokenizer:
    spec = normalize_spec(d)
    chat = spec.pop("chat", None)
    return with_template(_KINDS[spec.pop("kind")](**spec), chat)


def without_template(d: dict) -> dict:
    """The dict form of a tokenizer without its chat template: the base it extends."""
    return {k: v for k, v in d.items() if k != "chat"}
