"""Documents -> tokens -> train/val token shards (memmap-able .bin files) + meta.json, once.

1. Tokenize documents in parallel processes (order kept), each BPE/byte document followed by
   the end-of-text token, appending to one temporary stream with a record of document lengths.
2. Split: by documents (a seeded random choice of documents goes to val), or `tail` (the last
   val_fraction of the token stream, for single-document corpora such as Tiny Shakespeare).
3. Write each split as shards of at most `shard_tokens` tokens (uint16 when the vocabulary fits,
   else uint32), then meta.json.

The files and how they are checked (meta.json as the commit marker, stamps, checksums):
gpt.data.shards. A crash, Ctrl-C or kill -9 at any moment leaves nothing that passes; the next
run prepares again from scratch, deterministically, to the same token stream. Earlier prepared
data there stays until every document is read and tokenized: a failure or a kill before that
leaves it as it was (the killed run's temporary stream is removed by the next run).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import signal
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from gpt.data.shards import (
    FORMAT_VERSION,
    SPLITS,
    STAMP,
    STAMPS,
    fingerprint,
    read_meta,
    replacing,
    shard_name,
    stamp,
    token_dtype,
    write_stamps,
    write_tokens,
)
from gpt.data.sources import SourceMissing
from gpt.errors import TinyGPTError
from gpt.runtime import io
from gpt.runtime.preemption import end_with
from gpt.tokenizers import Tokenizer, tokenizer_from_dict, tokenizer_identity

_CHUNK_DOCS = 256  # documents per task sent to a worker process


# --- tokenization in worker processes ----------------------------------------------------------

_worker_tokenizer: Tokenizer | None = None


def _init_worker(tok_dict: dict, parent: int) -> None:
    global _worker_tokenizer
    end_with(parent)  # a worker of a preparation killed outright ends with it
    # A forked worker inherits the trainer's signal handlers: the pool ends its workers with
    # SIGTERM, which must end them (not raise a clean-stop exception in them: the pool then hangs).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Processes parallelise here; a Hugging Face tokenizer forked after its thread pool ran (a BPE
    # just trained) would otherwise warn in every worker.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = tokenizer_from_dict(tok_dict)


def _encode_chunk(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of a chunk of documents, concatenated, and each document's length. Numpy arrays,
    not lists of ints: they cross the process boundary as raw bytes."""
    tok = _worker_tokenizer
    batch = tok.encode_batch(texts) if hasattr(tok, "encode_batch") else [tok.encode(t) for t in texts]
    if tok.eot_id is not None:  # documents end with end-of-text, so the model learns where they stop
        for ids in batch:
            ids.append(tok.eot_id)
    lengths = np.fromiter((len(ids) for ids in batch), dtype=np.int64, count=len(batch))
    flat = np.fromiter((t for ids in batch for t in ids), dtype=np.uint32, count=int(lengths.sum()))
    return flat, lengths


def _chunks(docs: Iterable[str], n: int) -> Iterator[list[str]]:
    it = iter(docs)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def encode_documents(docs: Iterable[str], tok: Tokenizer, num_proc: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(tokens, document lengths) chunk by chunk, in document order, computed by `num_proc`
    processes."""
    global _worker_tokenizer
    if num_proc <= 1:  # in this process: its signal handlers and settings stay as they are
        _worker_tokenizer = tok
        yield from map(_encode_chunk, _chunks(docs, _CHUNK_DOCS))
        return
    # fork: workers start instantly and never touch CUDA. But forking a process whose CUDA/NCCL
    # threads are already running can deadlock: then start clean interpreters instead.
    torch = sys.modules.get("torch")
    cuda_live = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    ctx = mp.get_context("fork" if sys.platform == "linux" and not cuda_live else "spawn")
    # A window of chunks in flight, read in order. A consumer that stops early (data.max_tokens)
    # leaves at most the window to cancel or finish: multiprocessing.Pool's imap, closed early,
    # hung in terminate() 3 times in 10 on a busy machine (a worker blocked writing its result).
    with ProcessPoolExecutor(num_proc, mp_context=ctx, initializer=_init_worker, initargs=(tok.to_dict(), os.getpid())) as pool:
        window: deque = deque()
        try:
            for chunk in _chunks(docs, _CHUNK_DOCS):
                window.append(pool.submit(_encode_chunk, chunk))
                if len(window) >= 2 * num_proc:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for pending in window:
                pending.cancel()


# --- the pipeline --------------------------------------------------------------------------------


def prepare(
    documents: Iterable[str],
    tokenizer_spec: dict,
    out_dir: Path,
    settings: dict,
    log=print,
    progress: bool | None = None,
    verify: str = STAMP,
    replace: bool = True,
    check: Callable[[dict], None] | None = None,
) -> dict:
    """Prepare `documents` into out_dir unless prepared data with the same fingerprint is there
    (intact: `verify` says how its shards' checksums are checked, see read_meta). Prepared data
    of other settings there is replaced, saying what differs; with `replace` False, refused
    (gpt.data.shards.replacing). `check(tokenizer dict)` refuses a tokenizer by raising: called
    before anything is read or written where the tokenizer is known up front, else once it is
    fitted (before anything is written), or on the prepared data's.

    settings: identity (of the source), val_fraction, split_by (documents | tail), seed,
    num_proc, max_docs, max_tokens, shard_tokens."""
    fit_chars = tokenizer_spec["kind"] == "char" and "chars" not in tokenizer_spec
    fit_bpe = tokenizer_spec["kind"] == "bpe" and "json_text" not in tokenizer_spec
    fitted = fit_chars or fit_bpe
    tok: Tokenizer | None = None if fitted else tokenizer_from_dict(tokenizer_spec)  # fail before touching files
    if tok is not None and check:  # a tokenizer the caller cannot use costs nothing to refuse
        check(tok.to_dict())
    # The fingerprint holds what decides the ids (not where a ranks file lives, but its size; a
    # tokenizer fitted here, the settings it is fitted with).
    tok_identity = tokenizer_identity(tokenizer_spec) if fitted else tokenizer_identity(tok.to_dict())
    fp_settings = {k: v for k, v in settings.items() if k != "num_proc"} | {"tokenizer": tok_identity}
    fp = fingerprint(fp_settings)
    meta = read_meta(out_dir, fp, verify, log)
    if meta is not None:
        if check:
            check(meta["tokenizer"])
        _remove_dead_temporaries(out_dir)  # a preparation killed while reading left its stream beside them
        return meta
    other = replacing(out_dir, fp, fp_settings, replace)

    val_fraction = float(settings["val_fraction"])
    if not 0.0 < val_fraction < 1.0:
        raise TinyGPTError(f"data.val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    # Open the source before anything is deleted: a wrong text field or an unreachable dataset
    # must leave earlier prepared data as it was.
    try:
        documents, total = _open(documents, settings.get("max_docs"))
    except SourceMissing as e:  # files gone, their tokens prepared otherwise (gpt.data.load_data)
        raise TinyGPTError(
            f"{e}; {out_dir} was prepared from it with other settings ({other[0]}): pass those to use it, or put the "
            "source back to prepare it again"
            if other
            else f"{e}; {out_dir}, prepared from it, must be prepared again (a shard was damaged): put the source back"
        ) from None
    if fit_chars:  # the alphabet is fitted on the whole corpus first, in memory: checked before anything is written
        documents = list(documents)
        from gpt.tokenizers.char import CharTokenizer

        tok = CharTokenizer.fit("".join(documents))
        if check:
            check(tok.to_dict())
    if other:
        log(other[1])
    created = not out_dir.exists()
    io.writable_dir(out_dir, "set paths.data_dir=<folder> or TINYGPT_DATA_DIR to a folder you can write")
    num_proc = int(settings.get("num_proc") or os.cpu_count() or 1)
    try:
        if fit_bpe:  # before the old data goes: a BPE that cannot be trained, or is refused, leaves it as it was
            tok, documents = _train_bpe(documents, tokenizer_spec, log)
            if check:
                check(tok.to_dict())
        dtype = token_dtype(tok.vocab_size)
        doc_lengths, shards, sums, seconds = _tokenize_and_shard(
            documents, tok, dtype, out_dir, settings, val_fraction, num_proc, progress, total
        )
    except BaseException:
        if created:  # a folder this run made is left as it found the place: without it (rmdir: only while empty)
            _invalidate(out_dir)
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    meta = {
        "format": FORMAT_VERSION,
        "fingerprint": fp,
        "settings": fp_settings,
        "tokenizer": tok.to_dict(),
        "dtype": dtype.name,
        "documents": len(doc_lengths),
        "tokens": {split: int(sum(shards[split])) for split in SPLITS},
        "shards": shards,
        "crc32": sums,
        "tokenize_seconds": round(seconds, 3),
        "num_proc": num_proc,
    }
    io.write_json(out_dir / "meta.json", meta)
    # The shards were checksummed as they were written: the next start needs not read them again.
    stamps = {shard_name(split, i): stamp(out_dir / shard_name(split, i)) for split in SPLITS for i in range(len(shards[split]))}
    write_stamps(out_dir, (out_dir / "meta.json").read_bytes(), stamps)
    one = len(doc_lengths) == 1 and settings.get("split_by", "documents") == "documents"
    log(
        f"prepared {len(doc_lengths):,} document{'s' * (len(doc_lengths) != 1)}: {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens "
        f"in {out_dir} ({sum(doc_lengths) / max(seconds, 1e-9):,.0f} tokens/s with {num_proc} process(es))"
        + (f"; one document: its last {val_fraction:.0%} validates (as data.split_by=tail)" if one else "")
    )
    return meta


def _open(documents: Iterable[str], max_docs) -> tuple[Iterable[str], int | None]:
    """The documents, their first one already read (an empty corpus or a source that cannot be
    opened fails here), capped at `max_docs`; and how many there are where the source can tell."""
    source, documents = documents, iter(documents)
    first = next(documents, None)
    # Known once iteration began, where the source can tell (a list always can).
    total = len(source) if isinstance(source, (list, tuple)) else getattr(source, "total", None)
    if first is None:
        raise TinyGPTError("the corpus is empty (no non-empty documents); check data.source")
    documents = itertools.chain([first], documents)
    if max_docs:
        documents = itertools.islice(documents, int(max_docs))
        total = min(total, int(max_docs)) if total is not None else None
    return documents, total


def _train_bpe(documents: Iterable[str], spec: dict, log) -> tuple[Tokenizer, Iterable[str]]:
    """A byte-level BPE trained on the corpus' first documents; the documents, those included."""
    caps = spec.get("train_docs"), spec.get("train_bytes")
    from gpt.tokenizers.bpe import train_bpe, training_sample  # (prepared data trains none)

    sample = training_sample(documents, *caps)
    tok = train_bpe(sample, spec["vocab_size"], *caps)
    short = tok.vocab_size < spec["vocab_size"]
    log(f"trained a byte-level BPE of {tok.vocab_size:,} tokens" + " (the sample has no more pairs to merge)" * short)
    return tok, itertools.chain(sample, documents)  # the sample is encoded with the rest


def _invalidate(out_dir: Path) -> None:
    (out_dir / "meta.json").unlink(missing_ok=True)
    (out_dir / STAMPS).unlink(missing_ok=True)
    for old in out_dir.glob("*.bin"):
        old.unlink()
    _remove_dead_temporaries(out_dir)


def _tokenize_and_shard(
    documents, tok, dtype, out_dir: Path, settings: dict, val_fraction: float, num_proc: int, progress, total
):
    """Tokenize into one temporary stream, split it, write each split's shards. Returns (document
    lengths, {split: shard lengths}, {split: shard CRC-32s}, tokenizing seconds)."""
    stream_path = out_dir / f"stream.tmp-{os.getpid()}"
    try:
        doc_lengths, seconds = _tokenize_to_stream(
            documents, tok, num_proc, dtype, stream_path, settings.get("max_tokens"), progress, total
        )
        if not doc_lengths:
            raise TinyGPTError("the corpus is empty (no non-empty documents); check data.source")
        # Every document read and tokenized (a source failing mid-way, such as a bad record deep in
        # a JSONL file, has left earlier prepared data as it was): from here until the new meta
        # lands, the folder reads as unprepared.
        _invalidate(out_dir)
        stream = np.memmap(stream_path, dtype=dtype, mode="r") if sum(doc_lengths) else np.zeros(0, dtype)
        # one document (a single file: the usual own corpus) cannot be split by documents: by its tail
        split_by = "tail" if len(doc_lengths) == 1 else settings.get("split_by", "documents")
        parts = _split(stream, np.array(doc_lengths), val_fraction, split_by, int(settings.get("seed", 0)))
        shards, sums = {}, {}
        for split in SPLITS:
            shards[split], sums[split] = _write_shards(
                out_dir, split, parts[split], int(settings.get("shard_tokens") or 100_000_000)
            )
        del stream
    finally:
        stream_path.unlink(missing_ok=True)
    return doc_lengths, shards, sums, seconds


def _remove_dead_temporaries(out_dir: Path) -> None:
    """Temporaries of a preparation that was killed; a live writer's (another process preparing
    right now) are left alone."""
    for tmp in out_dir.glob("*.tmp-*"):
        owner = io.temporary_owner(tmp)
        if owner is None:
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            tmp.unlink(missing_ok=True)
        except PermissionError:
            pass  # alive, owned by someone else


def _tokenize_to_stream(documents, tok, num_proc, dtype, path: Path, max_tokens, progress, total) -> tuple[list[int], float]:
    """Token ids of every document, one after another, into `path`; returns the documents'
    lengths and the seconds it took. A progress bar on a terminal (with an ETA when the number
    of documents, `total`, is known)."""
    from tqdm import tqdm

    lengths: list[int] = []
    tokens = 0
    limit = int(max_tokens) if max_tokens else None
    t0 = time.time()
    bar = tqdm(
        desc="tokenizing", unit=" docs", total=total, disable=None if progress is None else not progress, dynamic_ncols=True
    )
    with open(path, "wb") as out:
        for flat, doc_lengths in encode_documents(documents, tok, num_proc):
            if limit is not None and tokens + len(flat) > limit:  # the cap cuts the last document short
                keep = limit - tokens
                ends = np.cumsum(doc_lengths)
                n_docs = int(np.searchsorted(ends, keep, side="left")) + 1
                doc_lengths = doc_lengths[:n_docs].copy()
                doc_lengths[-1] -= int(ends[n_docs - 1] - keep)
                flat = flat[:keep]
            out.write(flat.astype(dtype, copy=False).tobytes())
            lengths.extend(int(n) for n in doc_lengths if n)
            tokens += len(flat)
            bar.update(len(doc_lengths))
            bar.set_postfix(tokens=f"{tokens:,}", tok_s=f"{tokens / max(time.time() - t0, 1e-9):,.0f}", refresh=False)
            if limit is not None and tokens >= limit:
                break
    if bar.total is not None and bar.n != bar.total:  # blank documents skipped, or the token cap
        bar.total = bar.n
        bar.refresh()
    bar.close()
    return lengths, time.time() - t0


def _split(stream: np.ndarray, lengths: np.ndarray, val_fraction: float, split_by: str, seed: int) -> dict[str, list[np.ndarray]]:
    """Pieces (views of the stream) that make up each split, in stream order."""
    if split_by == "tail":
        cut = int(len(stream) * (1.0 - val_fraction))
        return {"train": [stream[:cut]], "val": [stream[cut:]]}
    if split_by != "documents":
        raise TinyGPTError(f"data.split_by={split_by!r} is unknown; use documents or tail")
    n = len(lengths)  # at least 2: prepare splits a single document by its tail
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    is_val = np.zeros(n, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n)[:n_val]] = True
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    for start, length, val in zip(starts, lengths, is_val):
        parts["val" if val else "train"].append(stream[start : start + length])
    return parts


def _write_shards(out_dir: Path, split: str, pieces: list[np.ndarray], shard_tokens: int) -> tuple[list[int], list[int]]:
    """Concatenate pieces into shards of at most shard_tokens tokens; returns their sizes and
    CRC-32s."""
    sizes: list[int] = []
    sums: list[int] = []
    buffer: list[np.ndarray] = []
    filled = 0

    def flush():
        nonlocal buffer, filled
        tokens = np.concatenate(buffer) if buffer else np.zeros(0, pieces[0].dtype if pieces else np.uint16)
        write_tokens(out_dir / shard_name(split, len(sizes)), tokens)
        sizes.append(filled)
        sums.append(zlib.crc32(tokens.tobytes()))
        buffer, filled = [], 0

    for piece in pieces:
        while len(piece):
            take = piece[: shard_tokens - filled]
            buffer.append(np.asarray(take))
            filled += len(take)
            piece = piece[len(take) :]
            if filled == shard_tokens:
                flush()
    if filled or not sizes:
        flush()
    return sizes, sums
