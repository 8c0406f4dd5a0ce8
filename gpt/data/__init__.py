"""Data: a source's documents -> tokenizer -> prepared splits on disk -> batches.

`load_data` is the one call the trainer makes; it downloads and prepares on first use and reuses
prepared data (same fingerprint) afterwards. `python -m gpt.data data=<name>` prepares ahead of
time. Two kinds of data, behind one interface (`Dataset`), so that training never asks which:

- text (`Dataset`): token shards (gpt.data.prepare, gpt.data.shards), batches of random windows
  of the context (gpt.data.loader);
- conversations (`Conversations`): records with `messages` (or Alpaca's fields) rendered with the
  chat template and its loss mask (gpt.data.chat), batches of whole conversations.

    sources.py download.py   where documents come from
    prepare.py shards.py     text -> token shards, and the shards' format (meta.json, checksums)
    chat.py                  conversations -> ids + loss mask -> prepared splits -> batches
    loader.py                random windows of tokens
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gpt.config import DataSettings
from gpt.data.prepare import prepare as prepare_documents
from gpt.data.shards import FULL, STAMP, open_split, tokenizer_of
from gpt.data.sources import Documents, Source, SourceMissing, open_source, prepared_from
from gpt.errors import TinyGPTError
from gpt.tokenizers import Tokenizer, normalize_spec


@dataclass
class Dataset:
    """Prepared text: `train` and `val` token shards (memmaps) and the tokenizer that made them."""

    name: str
    train: list[np.ndarray]
    val: list[np.ndarray]
    tokenizer: Tokenizer
    meta: dict
    kind = "text"

    @staticmethod
    def tokens(shards: list[np.ndarray]) -> int:
        return sum(len(s) for s in shards)

    def batches(self, split: str, block_size: int, batch_size: int, device, seed: int, rank: int = 0, world_size: int = 1):
        """This rank's batches of a split (`next() -> (x, y)`, `state_dict()`): random windows of
        the context, the same global draw on every rank (see RandomWindows)."""
        from gpt.data.loader import RandomWindows

        return RandomWindows(getattr(self, split), block_size, batch_size, device, seed=seed, rank=rank, world_size=world_size)

    def check_fits(self, block_size: int) -> list[str]:
        """Refuse a context the splits cannot fill; returns the notices to say (none for text)."""
        for split, shards in (("train", self.train), ("val", self.val)):
            longest = max((len(s) for s in shards), default=0)
            if longest < block_size + 1:
                raise TinyGPTError(
                    f"model.block_size={block_size} is longer than the {split} split ({Dataset.tokens(shards)} tokens"
                    f"{', in shards of at most ' + str(longest) if len(shards) > 1 else ''}); "
                    + (f"use a block_size below {longest} or more data" if longest > 1 else "it needs more data")
                    + (" (or a larger data.val_fraction)" if split == "val" else "")
                )
        return []

    def describe_step(self, rows: int, block_size: int) -> str:
        """What one optimizer step takes, `rows` windows or conversations in all."""
        return f"{rows * block_size:,} tokens/step"

    def sample_prompt(self) -> tuple[list[int], str]:
        """What training's samples continue (ids, and the text shown before them): nothing."""
        return [], ""


@dataclass
class Conversations(Dataset):
    """Prepared conversations: `splits` ({"train", "val"}: gpt.data.chat.ChatSplit), each split's
    ids one after another as `train` / `val`."""

    splits: dict = field(default_factory=dict)
    length_buckets: int = 1  # batches drawn from this many groups of similar length (data.length_buckets)
    kind = "chat"

    def batches(self, split: str, block_size: int, batch_size: int, device, seed: int, rank: int = 0, world_size: int = 1):
        """Whole conversations, padded to the longest of the batch (gpt.data.chat)."""
        from gpt.data.chat import ConversationBatches

        return ConversationBatches(
            self.splits[split],
            block_size,
            batch_size,
            device,
            seed=seed,
            rank=rank,
            world_size=world_size,
            length_buckets=self.length_buckets,
        )

    def check_fits(self, block_size: int) -> list[str]:
        """Conversations longer than the context are left out, not cut (a cut reply would teach the
        model to stop mid-answer, or never to end): how many, as a notice. (Every one too long:
        the batches refuse it.)"""
        parts = []
        for split, conversations in self.splits.items():
            too_long = int((conversations.lengths() > block_size + 1).sum())
            if too_long:
                parts.append(f"{too_long:,} of {len(conversations):,} {split}")
        if not parts:
            return []
        return [
            f"notice: conversations longer than the context ({block_size + 1} tokens) are left out: {', '.join(parts)}; "
            f"a model with a longer context keeps them"
        ]

    def describe_step(self, rows: int, block_size: int) -> str:
        return f"{rows:,} conversations/step (each padded to the longest of its length group)"

    def sample_prompt(self) -> tuple[list[int], str]:
        """The first val conversation up to its first reply, which the sample then writes."""
        from gpt.data.chat import first_turn

        return first_turn(self.splits["val"], self.tokenizer)


def preparation_settings(data: DataSettings, identity: str) -> dict:
    """What decides the prepared tokens (with the tokenizer): the fingerprint's input."""
    keys = ("val_fraction", "split_by", "seed", "max_docs", "max_tokens", "shard_tokens", "num_proc")
    return {"identity": identity, **{k: getattr(data, k) for k in keys}}


def load_data(
    data: DataSettings,
    data_root: str | Path,
    log=print,
    verify: str | None = None,
    base_tokenizer: dict | None = None,
    replace: bool = True,
    check_tokenizer: Callable[[dict], None] | None = None,
) -> Dataset:
    """Prepared data for `data` under `data_root`, preparing it first if need be (or again, if a
    shard was damaged since). `verify`: how the shards' checksums are checked (gpt.data.shards'
    FULL, STAMP or SIZES); None: FULL if data.verify, else STAMP. `base_tokenizer`: the dict form
    of the tokenizer of the model a run starts from (init_from); conversations are tokenized
    with it (plus the chat template) whatever data.tokenizer says. `replace`: whether prepared
    data of other settings under data.name may be prepared again in its place (with a notice);
    False refuses it (gpt.data.shards.PreparedOtherwise), for commands that only read data.
    `check_tokenizer(tokenizer dict)`: raises to refuse the data's tokenizer (a resumed run's
    checkpoint, a model to evaluate, has its own), before any preparation is written: a refused
    command leaves the data prepared under data.name as it was."""
    verify = verify or (FULL if data.verify else STAMP)
    root = Path(data_root).expanduser()
    out_dir = root / data.name
    try:
        source, chat = open_source(data.source, root, log=log), None
    except SourceMissing as missing:
        source, chat = _without_source(data, out_dir, missing)
    if chat if chat is not None else is_chat(data, root):
        return _load_conversations(data, root, source.identity, base_tokenizer, log, replace, check_tokenizer)
    tokenizer_spec = normalize_spec(asdict(data.tokenizer))
    meta = prepare_documents(
        source.documents,
        tokenizer_spec,
        out_dir,
        preparation_settings(data, source.identity),
        log=log,
        verify=verify,
        replace=replace,
        check=check_tokenizer,
    )
    return Dataset(
        name=data.name,
        train=open_split(out_dir, meta, "train"),
        val=open_split(out_dir, meta, "val"),
        tokenizer=tokenizer_of(meta),
        meta=meta,
    )


def _without_source(data: DataSettings, out_dir: Path, missing: SourceMissing) -> tuple[Source, bool]:
    """A local or save_to_disk source that is gone (moved, deleted) with its data prepared: the
    source as it was when prepared (its recorded identity; its documents raise `missing`), and
    whether that data is conversations. The prepared tokens carry everything training, resuming
    and evaluating read (the tokenizer is in meta.json); the raw files only serve to prepare
    them again, and refusing without them would strand tokens that nothing else can recreate.
    So they are used whenever nothing asks for another preparation: the settings that decide the
    tokens are the same as when they were prepared (a change there still needs the source, and
    says so). Only data prepared from this very path counts: its files were under it."""
    try:
        meta = json.loads((out_dir / "meta.json").read_bytes())
        identity = meta["settings"]["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        raise missing from None
    if not isinstance(identity, str) or not prepared_from(data.source, identity):
        raise missing

    def gone():
        raise missing

    return Source(Documents(gone), identity), meta.get("kind") == "chat"


def is_chat(data: DataSettings, data_root: Path) -> bool:
    """Whether the source holds conversations: data.format=chat, or with format=auto, local
    record files or a save_to_disk folder whose first record has `messages` or Alpaca's fields
    (read cheaply: one line, one row). Other sources (a download, the Hub) are text unless
    data.format=chat says otherwise: guessing would touch the network."""
    if data.format != "auto":
        return data.format == "chat"
    from gpt.data.sources import first_record

    record = first_record(data.source, data_root)
    if record is None:  # (text: gpt.data.chat is not needed to say so)
        return False
    from gpt.data.chat import is_conversation

    return is_conversation(record)


def _load_conversations(
    data: DataSettings, root: Path, identity: str, base_tokenizer: dict | None, log, replace: bool = True, check=None
) -> Conversations:
    from gpt.data.chat import open_chat_split, prepare_conversations
    from gpt.data.sources import records

    spec = normalize_spec(base_tokenizer if base_tokenizer is not None else asdict(data.tokenizer))
    if base_tokenizer is not None:
        log(
            "conversations are tokenized with the model's tokenizer (init_from's; a resumed finetune's own) and the chat template"
        )
    settings = {"identity": identity, "val_fraction": data.val_fraction, "seed": data.seed, "max_docs": data.max_docs}
    out_dir = root / data.name
    meta = prepare_conversations(_Lazy(lambda: records(data.source, root, log)), spec, out_dir, settings, log, replace, check)
    splits = {split: open_chat_split(out_dir, meta, split) for split in ("train", "val")}
    return Conversations(
        data.name, [splits["train"].tokens], [splits["val"].tokens], tokenizer_of(meta), meta, splits, data.length_buckets
    )


class _Lazy:
    """An iterable opened when iteration starts: prepared data that matches reads no record."""

    def __init__(self, open_items):
        self._open = open_items

    def __iter__(self):
        return iter(self._open())
