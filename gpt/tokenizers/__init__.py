"""Tokenizers behind one small interface: encode, decode, vocab_size, eot_id (None when the
tokenizer has no end-of-text token) and a plain-dict form.

The dict form is stored in every checkpoint and in prepared data's meta.json, so sampling
rebuilds exactly the tokenizer the model was trained with and needs nothing else.

- char: one token per character, alphabet fitted on the data.
- byte: the 256 byte values of UTF-8, plus end-of-text (256). Any text round-trips.
- tiktoken: OpenAI's BPE encodings by name (gpt2, r50k_base, p50k_base, cl100k_base,
  o200k_base), downloaded by tiktoken on first use; or GPT-2's encoding from a local ranks file
  (`ranks_file`), for offline and air-gapped machines.
- bpe: a byte-level BPE trained on the corpus when it is prepared (bpe.py); hf: any Hugging
  Face tokenizer.json (hf.py).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Protocol

from gpt.errors import TinyGPTError

__all__ = [
    "GPT2_EOT",
    "TIKTOKEN_NAMES",
    "ByteTokenizer",
    "CharTokenizer",
    "HFTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "TrainedBPE",
    "describe",
    "difference",
    "normalize_spec",
    "require_same",
    "tokenizer_from_dict",
    "tokenizer_identity",
    "without_template",
]


class Tokenizer(Protocol):
    kind: str
    eot_id: int | None

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def to_dict(self) -> dict: ...


# Each kind's module is imported when a tokenizer of that kind is first made or named: a run on
# bytes reads neither tiktoken's nor tokenizers' wrappers.
_KINDS = {
    "char": ("char", "CharTokenizer"), "byte": ("byte", "ByteTokenizer"), "tiktoken": ("tiktoken", "TiktokenTokenizer"),
    "bpe": ("bpe", "TrainedBPE"), "hf": ("hf", "HFTokenizer"),
}  # fmt: skip
_NAMES = {cls: module for module, cls in _KINDS.values()} | {"GPT2_EOT": "tiktoken", "TIKTOKEN_NAMES": "tiktoken"}


def _kind(kind: str) -> type:
    module, cls = _KINDS[kind]
    return getattr(importlib.import_module(f"gpt.tokenizers.{module}"), cls)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"gpt.tokenizers.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'gpt.tokenizers' has no attribute {name!r}")


def normalize_spec(d: dict) -> dict:
    """The settings that matter for this kind of tokenizer: `data.tokenizer.kind=byte` on top of
    a BPE config leaves name/ranks_file behind, and they must neither break nor fingerprint it.
    A chat template (the "chat" entry, gpt.chat) stays: it adds tokens."""
    kind = d.get("kind")
    if kind not in _KINDS:
        raise TinyGPTError(f"unknown tokenizer kind {kind!r}; use one of {', '.join(_KINDS)}")
    accepted = set(inspect.signature(_kind(kind).__init__).parameters) - {"self"}
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
    if spec["kind"] == "char":  # (not fitted yet: the corpus's alphabet, known once it is read)
        return f"char ({len(spec['chars'])} characters)" if spec.get("chars") else "char"
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
    elif describe(model) == describe(data):  # both sides print alike: say what does differ
        text = f"{describe(model)} on both sides, but {_unlike(a, b)}"
    return text


def _unlike(a: dict, b: dict) -> str:
    """What differs between two tokenizer identities that describe() prints alike."""
    if a.get("sha256") and b.get("sha256") and a["sha256"] != b["sha256"]:
        sums = f"tokenizer.json sha256 {a['sha256'][:12]} vs {b['sha256'][:12]}"
        if a["kind"] == "bpe":  # trained when its data was prepared, deterministic for a given text
            return (
                f"other merges ({sums}): learnt from other text, as when the corpus changed since one of them was "
                "prepared; put the text back as it was (it prepares to the same merges) or train a model on this one"
            )
        return f"another tokenizer.json ({sums})"
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "other " + ", ".join(f"{k} ({a.get(k)!r} vs {b.get(k)!r})"[:120] for k in keys)


def require_same(model: dict, data: dict, mismatch: str, fix: str) -> None:
    """Refuse a model and data whose tokenizers differ (ids would mean other text): '<mismatch>
    (<how they differ>); <fix>'. Both in dict form."""
    if tokenizer_identity(model) != tokenizer_identity(data):
        raise TinyGPTError(f"{mismatch} ({difference(model, data)}); {fix}")


def tokenizer_from_dict(d: dict) -> Tokenizer:
    spec = normalize_spec(d)
    chat = spec.pop("chat", None)
    tokenizer = _kind(spec.pop("kind"))(**spec)
    if not chat:
        return tokenizer
    from gpt.chat.template import with_template

    return with_template(tokenizer, chat)


def without_template(d: dict) -> dict:
    """The dict form of a tokenizer without its chat template: the base it extends."""
    return {k: v for k, v in d.items() if k != "chat"}
