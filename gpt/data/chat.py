"""Conversations: records -> the chat template's ids and loss mask -> prepared splits -> batches.

Records come through the data sources like any corpus (local .jsonl/.parquet, Hub, disk), in
either of two shapes:
- OpenAI's: {"messages": [{"role": "system" | "user" | "assistant", "content": ...}, ...]}
- Alpaca's: {"instruction": ..., "input": ... (optional), "output": ...}: one user turn (the
  instruction, then the input after a blank line) and one assistant turn.

Prepared once into <data root>/<name>/: per split, the conversations' ids one after another
(`<split>.tokens.bin`), a 0/1 byte per id saying whether it is trained (`<split>.mask.bin`) and
where each conversation starts (`<split>.offsets.bin`), plus meta.json, written last: the
commit marker, with the fingerprint and every file's CRC-32 (as for text, gpt.data.prepare).
Until meta.json lands, the new files are temporaries: a bad record found half-way leaves the
data prepared before exactly as it was.

Batches are padded, not packed: each row is one whole conversation from its first token, as a
chat model meets it, so no conversation attends to another's tokens and the val loss is the
loss of real chats. Rows are padded to the batch's longest conversation (not the context). So
that padding stays small, a batch is drawn from one of `length_buckets` groups of conversations
of similar length (the group with probability in proportion to its size, then uniformly in it:
every conversation is as likely as before to be drawn, as with Hugging Face's group_by_length).
Conversations longer than the context are left out, and how many is said.
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpt.chat.template import NAME as TEMPLATE
from gpt.chat.template import check_messages, with_template
from gpt.data.loader import Batch
from gpt.data.shards import crc32, fingerprint, read_stamps, replacing, stamp, token_dtype, write_stamps
from gpt.errors import TinyGPTError
from gpt.runtime import io
from gpt.tokenizers import CharTokenizer, tokenizer_from_dict, tokenizer_identity, without_template
from gpt.tokenizers.bpe import train_bpe

SPLITS = ("train", "val")
FILES = ("tokens", "mask", "offsets")
IGNORE = -1  # the target of a position that is not trained (gpt.model's loss skips it)


# --- records -> conversations --------------------------------------------------------------------


def is_conversation(record) -> bool:
    """Whether a record has one of the two conversation shapes."""
    return isinstance(record, dict) and ("messages" in record or {"instruction", "output"} <= record.keys())


def conversation_of(record, where: str) -> list[dict]:
    """The messages of a record in either shape, refused in one line naming `where`. A field
    that is null counts as absent: the datasets library gives every record of a file every
    field any record has."""
    if not isinstance(record, dict):
        raise TinyGPTError(f'{where} is not a JSON object; write {{"messages": [...]}} per line')
    record = {k: v for k, v in record.items() if v is not None}
    if "messages" in record:
        messages = record["messages"]
        if isinstance(messages, list):  # Hub datasets may carry extra keys per message: keep role/content
            messages = [{"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m for m in messages]
        return messages
    if {"instruction", "output"} <= record.keys():
        prompt = str(record["instruction"] or "")
        if record.get("input"):
            prompt += "\n\n" + str(record["input"])
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(record["output"] or "")}]
    fields = ", ".join(record) or "none"
    raise TinyGPTError(
        f'{where} has no "messages" (nor Alpaca\'s "instruction" and "output"); its fields are {fields}. '
        f'Write {{"messages": [{{"role": "user", "content": ...}}, {{"role": "assistant", "content": ...}}]}}'
    )


# --- preparation -----------------------------------------------------------------------------------


@dataclass
class ChatSplit:
    tokens: np.ndarray  # every conversation's ids, one after another
    mask: np.ndarray  # uint8, 1 where the id is trained
    offsets: np.ndarray  # int64, conversation i is tokens[offsets[i]:offsets[i + 1]]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def conversation(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[a:b], self.mask[a:b]


def prepare_conversations(
    records: Iterable, tokenizer_spec: dict, out_dir: Path, settings: dict, log=print, replace: bool = True, check=None
) -> dict:
    """Prepare the records' conversations into out_dir unless data with the same fingerprint is
    there; returns its meta. settings: identity (of the source), val_fraction, seed, max_docs.
    Other prepared data there is replaced with a notice, or refused (`replace` False), and
    `check(tokenizer dict)` may refuse the tokenizer before anything is written, as text's."""
    spec = without_template(tokenizer_spec)
    template = tokenizer_spec.get("chat") or {"template": TEMPLATE}  # a Hugging Face tokenizer's own, else tinygpt's
    fitted = (spec["kind"] == "char" and "chars" not in spec) or (spec["kind"] == "bpe" and "json_text" not in spec)
    base = None if fitted else tokenizer_from_dict(spec)
    identity = tokenizer_identity(spec if fitted else base.to_dict())
    keys = ("identity", "val_fraction", "seed", "max_docs")
    fp_settings = {"chat": template, **{k: settings.get(k) for k in keys}, "tokenizer": identity}
    fp = fingerprint(fp_settings)
    meta = read_meta(out_dir, fp)
    if meta is not None:
        if check:
            check(meta["tokenizer"])
        return meta
    other = replacing(out_dir, fp, fp_settings, replace)
    counted = {"skipped": 0}
    conversations = _conversations(records, settings.get("max_docs"), counted)
    if base is None:  # a tokenizer fitted on the conversations needs all their text first
        conversations = list(conversations)
        base = _fit(spec, conversations, log)
    tok = with_template(base, template)
    if check:  # before anything is written
        check(tok.to_dict())
    if other:
        log(other[1])
    io.writable_dir(out_dir, "set paths.data_dir=<folder> or TINYGPT_DATA_DIR to a folder you can write")
    dtype = token_dtype(tok.vocab_size)
    # Each conversation as compact arrays (3-5 bytes a token), not lists of Python ints.
    rendered = []
    for where, messages in conversations:
        ids, mask = tok.render(messages, where)
        rendered.append((np.asarray(ids, dtype=dtype), np.asarray(mask, dtype=np.uint8)))
    skipped, n = counted["skipped"], len(rendered)
    if n == 0:
        raise TinyGPTError(
            "the dataset holds no conversations"
            + (f" with an assistant turn ({skipped} without one)" if skipped else "")
            + "; check data.source"
        )
    if n < 2:
        raise TinyGPTError(f"the dataset has {n} conversation with an assistant turn; a train and a val split need at least 2")
    n_val = min(n - 1, max(1, round(n * float(settings["val_fraction"]))))
    is_val = np.zeros(n, dtype=bool)
    is_val[np.random.default_rng(int(settings["seed"])).permutation(n)[:n_val]] = True
    written, sums, counts = [], {}, {}
    try:
        for split in SPLITS:
            chosen = [rendered[i] for i in range(n) if is_val[i] == (split == "val")]
            arrays = {
                "tokens": np.concatenate([ids for ids, _ in chosen]),
                "mask": np.concatenate([m for _, m in chosen]),
                "offsets": np.concatenate([[0], np.cumsum([len(ids) for ids, _ in chosen])]).astype(np.int64),
            }
            for name, array in arrays.items():
                tmp = out_dir / f"{split}.{name}.bin.tmp-{os.getpid()}"
                io.write_bytes(tmp, array.tobytes())
                written.append((tmp, out_dir / f"{split}.{name}.bin"))
                sums[f"{split}.{name}"] = zlib.crc32(array.tobytes())
            counts[split] = {
                "conversations": len(chosen),
                "tokens": len(arrays["tokens"]),
                "trained": int(arrays["mask"].sum()),
            }
        (out_dir / "meta.json").unlink(missing_ok=True)  # the old data stops counting from here
        for tmp, final in written:
            os.replace(tmp, final)
    finally:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
    meta = {
        "format": 1,
        "kind": "chat",
        "fingerprint": fp,
        "settings": fp_settings,
        "tokenizer": tok.to_dict(),
        "dtype": dtype.name,
        "documents": n,
        "splits": counts,
        "tokens": {split: counts[split]["tokens"] for split in SPLITS},
        "crc32": sums,
        "skipped_without_reply": skipped,
    }
    io.write_json(out_dir / "meta.json", meta)
    # checksummed as they were written: the next start needs not read them again
    write_stamps(out_dir, (out_dir / "meta.json").read_bytes(), {f"{k}.bin": stamp(out_dir / f"{k}.bin") for k in sums})
    left_out = f"; {skipped:,} without an assistant turn left out" if skipped else ""
    log(
        f"prepared {n:,} conversations ({counts['train']['conversations']:,} train / {counts['val']['conversations']:,} val; "
        f"{counts['train']['tokens']:,} train tokens, {counts['train']['trained']:,} of them trained){left_out} in {out_dir}"
    )
    return meta


def _conversations(records: Iterable, max_docs, counted: dict) -> Iterator[tuple[str, list[dict]]]:
    """(where, messages) of each record, checked against the template as it is read; those with
    no assistant turn (nothing to learn from them) are left out and counted in counted["skipped"]."""
    items = itertools.islice(records, int(max_docs)) if max_docs else records
    for n, record in enumerate(items, 1):
        where = f"record {n}"
        messages = conversation_of(record, where)
        check_messages(messages, where)
        if not any(m["role"] == "assistant" for m in messages):
            counted["skipped"] += 1
            continue
        yield where, messages


def _fit(spec: dict, conversations, log):
    """A char alphabet or a BPE fitted on the conversations' text (the template's tokens come on
    top of it)."""
    texts = [m["content"] for _, messages in conversations for m in messages]
    if spec["kind"] == "char":
        return CharTokenizer.fit("".join(texts))
    tok = train_bpe(texts, spec["vocab_size"], spec.get("train_docs"), spec.get("train_bytes"))
    log(f"trained a byte-level BPE of {tok.vocab_size:,} tokens on the conversations")
    return tok


def read_meta(out_dir: Path, expected: str) -> dict | None:
    """The meta of intact prepared conversations with this fingerprint, or None. A file is read
    for its CRC only when its stamp changed since it was last checked (gpt.data.shards' stamps,
    as for text shards), so a start does not reread a large conversation set."""
    try:
        raw = (out_dir / "meta.json").read_bytes()
        meta = json.loads(raw)
        if not isinstance(meta, dict) or meta.get("fingerprint") != expected or meta.get("kind") != "chat":
            return None
        stamps, checked = read_stamps(out_dir, raw), {}
        for key, crc in meta["crc32"].items():
            path = out_dir / f"{key}.bin"
            seen = stamp(path)
            if stamps.get(path.name) != seen and crc32(path) != crc:
                return None
            checked[path.name] = seen
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if checked != stamps:
        write_stamps(out_dir, raw, checked)
    return meta


def open_chat_split(out_dir: Path, meta: dict, split: str) -> ChatSplit:
    def arr(name: str, dtype) -> np.ndarray:
        path = out_dir / f"{split}.{name}.bin"
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)

    return ChatSplit(arr("tokens", np.dtype(meta["dtype"])), arr("mask", np.uint8), np.array(arr("offsets", np.int64)))


# --- batches -------------------------------------------------------------------------------------


WIDTH_STEP = 64  # conversation batches are padded to a multiple of this many columns


class ConversationBatches:
    """Batches of `batch_size` whole conversations drawn at random (the same seeded global draw
    on every rank, each keeping its rows, as gpt.data.loader.RandomWindows), padded to the
    longest: x the ids, y the next ids with IGNORE wherever the next id is not trained (the
    prompt, the padding)."""

    def __init__(
        self,
        split: ChatSplit,
        block_size: int,
        batch_size: int,
        device: torch.device,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        length_buckets: int = 1,
        width_step: int | None = None,
    ):
        self.split, self.device, self.block_size = split, device, block_size
        # On a GPU, widths in steps of WIDTH_STEP (up to the context): a compiled model meets a
        # handful of shapes instead of one per batch (each new one recompiles, or turns dynamic),
        # and the matmuls stay aligned; the extra columns are padding, trained on by nothing. On
        # a CPU, padding is only work: widths stay the longest conversation's.
        self.width_step = width_step or (WIDTH_STEP if device.type == "cuda" else 1)
        lengths = split.lengths()
        self.eligible = np.flatnonzero(lengths <= block_size + 1)  # a conversation fits whole, or not at all
        self.dropped = len(split) - len(self.eligible)
        if len(self.eligible) == 0:
            raise TinyGPTError(
                f"every conversation is longer than the context ({block_size + 1} tokens with its target; the shortest "
                f"has {int(lengths.min()) if len(lengths) else 0}); raise model.block_size or use shorter conversations"
            )
        self.rows = slice(rank * batch_size, (rank + 1) * batch_size)
        self.global_batch = batch_size * world_size
        self.generator = torch.Generator().manual_seed(seed)
        by_length = self.eligible[np.argsort(lengths[self.eligible], kind="stable")]
        self.buckets = [b for b in np.array_split(by_length, max(1, min(length_buckets, len(by_length)))) if len(b)]
        self._weights = torch.tensor([len(b) for b in self.buckets], dtype=torch.float)
        self.padding = 0.0  # the share of the last batch's positions that were padding

    def next(self) -> Batch:
        bucket = self.buckets[0]
        if len(self.buckets) > 1:
            bucket = self.buckets[int(torch.multinomial(self._weights, 1, generator=self.generator))]
        draws = torch.randint(len(bucket), (self.global_batch,), generator=self.generator)[self.rows].numpy()
        chosen = [self.split.conversation(int(bucket[d])) for d in draws]
        longest = max(len(ids) for ids, _ in chosen) - 1
        width = min(self.block_size, -(-longest // self.width_step) * self.width_step)
        x = np.zeros((len(chosen), width), dtype=np.int64)
        y = np.full((len(chosen), width), IGNORE, dtype=np.int64)
        for r, (ids, mask) in enumerate(chosen):
            n = len(ids) - 1
            x[r, :n] = ids[:-1]
            y[r, :n] = np.where(mask[1:] == 1, ids[1:].astype(np.int64), IGNORE)
        tokens = sum(len(ids) - 1 for ids, _ in chosen)  # real input tokens: what tokens/s counts
        self.padding = 1.0 - tokens / x.size
        return Batch(self._to_device(x), self._to_device(y), tokens, trained=int((y != IGNORE).sum()))

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        if self.device.type == "cuda":  # pinned: the copy runs asynchronously, the host moves on
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def first_turn(split: ChatSplit, tokenizer) -> tuple[list[int], str]:
    """The ids of a split's first conversation up to its first trained id, where the assistant's
    first reply begins (a prompt for a sample at eval), and that prompt as text."""
    ids, mask = split.conversation(0)
    cut = int(np.argmax(mask))
    return ids[:cut].tolist(), tokenizer.decode(ids[:cut].tolist())
