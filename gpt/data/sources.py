"""Where documents come from: a URL, the Hugging Face Hub, a dataset saved to disk, or local
files. Every source yields plain strings (documents) and an identity string that changes when
its content may have changed, for the preparation's fingerprint.

Local .txt/.md/.jsonl/.parquet files are read through the `datasets` library's own builders
(text, json, parquet), so local corpora and Hub datasets take exactly the same path; streamed,
so no Arrow copy of them lands in a cache (the builders' lock files go under the data root).
Hub datasets use the Hugging Face cache, as everywhere else.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpt.config import SourceSettings
from gpt.errors import TinyGPTError

LOCAL_SUFFIXES = {".txt": "text", ".md": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class SourceMissing(TinyGPTError):
    """A local or save_to_disk source whose files are not there (moved, deleted): its prepared
    data may still be used (gpt.data.load_data)."""


class HubUnreachable(TinyGPTError):
    """A Hub dataset that cannot be reached (offline, no cached copy). `where` names it, for a
    caller whose user has other settings than data.source.* (an evaluation task) to say its own."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


class Documents:
    """A source's documents, opened when iteration starts. `total` is their number once known,
    where the source can tell without reading them (a progress bar's total and ETA); None
    otherwise. Blank documents are skipped, so it is an upper bound."""

    def __init__(self, open_documents: Callable[[], tuple[Iterable[str], int | None]]):
        self._open = open_documents
        self.total: int | None = None

    def __iter__(self) -> Iterator[str]:
        documents, self.total = self._open()
        yield from documents


@dataclass
class Source:
    documents: Documents  # lazy: nothing is downloaded or read until it is iterated
    identity: str  # changes whenever the documents may have; cheap to compute


def open_source(src: SourceSettings, data_root: Path, log=print) -> Source:
    """The source's identity now, its documents when iterated: prepared data whose fingerprint
    matches is reused without touching the network or the raw files."""
    check(src)
    return SOURCES[src.kind].documents(src, data_root, log)


def check(src: SourceSettings) -> None:
    """A known kind, with the settings that kind needs (before anything is opened or written)."""
    if src.kind not in SOURCES:
        raise TinyGPTError(f"data.source.kind={src.kind!r} is unknown; use {', '.join(SOURCES)}")
    for name in SOURCES[src.kind].needs:
        if getattr(src, name) is None:
            raise TinyGPTError(f"data.source.{name} is required for data.source.kind={src.kind}; set data.source.{name}=...")


def _url(src: SourceSettings, data_root: Path, log) -> Source:
    return Source(Documents(lambda: (_url_documents(src, data_root, log), 1)), f"url sha256={src.sha256}")


def _hub_source(src: SourceSettings, data_root: Path, log) -> Source:
    return Source(
        Documents(lambda: _hub(src)), f"hub {src.path} {src.config} {src.split} rev={src.revision} field={src.text_field}"
    )


def _disk_source(src: SourceSettings, data_root: Path, log) -> Source:
    path = Path(src.path).expanduser()
    if not path.exists():
        raise SourceMissing(f"data.source.path={path} does not exist; point it at a folder written by datasets' save_to_disk")
    stamp = ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(path.rglob("*")) if p.is_file())
    return Source(Documents(lambda: _disk(src)), f"disk {path} {src.split} {src.text_field} {stamp}")


def _local_source(src: SourceSettings, data_root: Path, log) -> Source:
    files = local_files(str(src.path))
    stamp = ";".join(f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    cache = data_root / ".datasets-cache"  # streaming writes only lock files, but somewhere
    return Source(Documents(lambda: _local(src, files, cache)), f"local {src.doc_unit} {src.text_field} {stamp}")


def prepared_from(src: SourceSettings, identity: str) -> bool:
    """Whether a source identity (recorded with prepared data) is of these settings' local files
    or save_to_disk folder: the same reading of them, every file at or under data.source.path
    (or matching it as a glob)."""
    path = str(Path(src.path).expanduser())
    if src.kind == "disk":
        return identity.startswith(f"disk {path} {src.split} {src.text_field} ")
    head = f"local {src.doc_unit} {src.text_field} "
    if src.kind != "local" or not identity.startswith(head):
        return False
    files = [item.rsplit(":", 2)[0] for item in identity[len(head) :].split(";") if item.count(":") >= 2]
    under = path.rstrip("/") + "/"
    return bool(files) and all(f == path or f.startswith(under) or fnmatch.fnmatchcase(f, path) for f in files)


def _url_documents(src: SourceSettings, data_root: Path, log) -> Iterator[str]:
    from gpt.data.download import ensure_file  # (prepared data never downloads)

    path = ensure_file(src.url, data_root / src.filename, src.sha256, log=log)
    yield path.read_text(encoding="utf-8")


def _texts(dataset, field: str, where: str) -> Iterator[str]:
    columns = getattr(dataset, "column_names", None)
    if columns is not None and field not in columns:
        raise TinyGPTError(
            f"{where} has no text field {field!r}; its fields are {', '.join(columns)} (set data.source.text_field)"
        )
    for record in dataset:
        if field not in record:  # streaming datasets only tell us here
            raise TinyGPTError(
                f"{where} has no text field {field!r}; its fields are {', '.join(record)} (set data.source.text_field)"
            )
        text = record[field]
        if text is not None and not isinstance(text, str):
            raise TinyGPTError(
                f"{where}: text field {field!r} holds {type(text).__name__} values ({str(text)[:40]!r}), not text; "
                f"set data.source.text_field to a field of text"
            )
        if text and not text.isspace():  # blank lines/records are not documents
            yield text


def _datasets():
    """The datasets library, with its progress bars off where they would land in a plain log (our
    own bar shows preparation; on a terminal a Hub download keeps its bar)."""
    import logging

    import datasets

    if not sys.stderr.isatty():
        datasets.disable_progress_bars()
    # The json builder logs "Failed to load JSON from file ..." before raising what our one-line
    # error then says (with the same detail): keep that line out.
    json_log = logging.getLogger("datasets.packaged_modules.json.json")
    if _said_by_us not in json_log.filters:
        json_log.addFilter(_said_by_us)
    return datasets


def _said_by_us(record) -> bool:
    return not str(record.msg).startswith("Failed to load JSON")


def _hub(src: SourceSettings) -> tuple[Iterator[str], int | None]:
    ds, where = _hub_dataset(src)
    return _texts(ds, src.text_field, where), None if src.streaming else len(ds)


def _hub_dataset(src: SourceSettings):
    datasets = _datasets()
    name, config, split = src.path, src.config, src.split
    where = f"Hub dataset {name}" + (f" ({config})" if config else "") + f" split {split}"
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=src.streaming, revision=src.revision)
    except (FileNotFoundError, ConnectionError, OSError, ValueError) as e:
        if (
            os.environ.get("HF_HUB_OFFLINE") == "1"
            or "offline" in str(e).lower()
            or "connect" in str(e).lower()
            or "resolve" in str(e).lower()
        ):
            raise HubUnreachable(
                f"cannot reach {where} (offline?); download it once with network (it is then cached), or save it with "
                f"datasets' save_to_disk and use data.source.kind=disk data.source.path=<folder>, or point "
                f"data.source.kind=local at its files",
                where,
            ) from None
        raise TinyGPTError(f"cannot load {where}: {str(e).splitlines()[0]}") from None
    return ds, where


def _disk(src: SourceSettings) -> tuple[Iterator[str], int | None]:
    ds = _disk_dataset(src)
    return _texts(ds, src.text_field, str(src.path)), len(ds)


def _disk_dataset(src: SourceSettings):
    datasets = _datasets()
    path = Path(src.path).expanduser()
    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise TinyGPTError(f"{path} is not a dataset written by datasets' save_to_disk (no dataset_info/state files)") from None
    if isinstance(ds, datasets.DatasetDict):
        split = src.split
        if split not in ds:
            raise TinyGPTError(f"{path} has splits {', '.join(ds)}, not {split!r}; set data.source.split")
        ds = ds[split]
    return ds


def local_files(pattern: str) -> list[Path]:
    """A file, every supported file below a folder, or the files a glob matches (sorted)."""
    path = Path(pattern).expanduser()
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise SourceMissing(f"data.source.path={pattern}: no such file or folder, and no files match it as a glob")
    unsupported = sorted({p.suffix or p.name for p in files if p.suffix not in LOCAL_SUFFIXES})
    if unsupported:
        raise TinyGPTError(f"unsupported file type(s) {', '.join(unsupported)} in {pattern}; use .txt, .md, .jsonl or .parquet")
    if not files:
        raise TinyGPTError(f"data.source.path={pattern} holds no .txt, .md, .jsonl or .parquet files")
    return files


def _local(src: SourceSettings, files: list[Path], cache: Path) -> tuple[Iterator[str], int | None]:
    if all(p.stat().st_size == 0 for p in files):  # no documents: the corpus is empty, said so once opened
        return iter(()), 0
    ds, builder = _local_dataset(src, files, cache)
    total = None
    if builder == "text" and src.doc_unit == "file":
        total = len(files)
    elif builder == "parquet":
        import pyarrow.parquet as pq

        total = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    field = "text" if builder == "text" else src.text_field
    return _read_local(_texts(ds, field, str(src.path)), src, builder, files), total


def _local_dataset(src: SourceSettings, files: list[Path], cache: Path):
    datasets = _datasets()
    builders = {LOCAL_SUFFIXES[p.suffix] for p in files}
    if len(builders) > 1:
        raise TinyGPTError(
            f"data.source.path mixes text and record files ({', '.join(sorted(builders))}); use one kind per corpus"
        )
    builder = builders.pop()
    unit = src.doc_unit
    kwargs = {}
    if builder == "text":
        if unit not in ("file", "line", "paragraph"):
            raise TinyGPTError(f"data.source.doc_unit={unit!r}: use file, line or paragraph for text files")
        kwargs["sample_by"] = {"file": "document", "line": "line", "paragraph": "paragraph"}[unit]
        kwargs["keep_linebreaks"] = True  # a line's newline is part of the text (char models have no end-of-text)
    try:
        ds = datasets.load_dataset(
            builder, data_files=[str(p) for p in files], split="train", streaming=True, cache_dir=str(cache), **kwargs
        )
    except Exception as e:  # datasets wraps parse errors of malformed files in its own types
        raise _unreadable(src, builder, e, files) from None
    return ds, builder


def _read_local(items: Iterator, src: SourceSettings, builder: str, files: list[Path]) -> Iterator:
    """Streamed files are parsed as they are read: a malformed line shows up here, not at load."""
    try:
        yield from items
    except TinyGPTError:
        raise
    except Exception as e:
        raise _unreadable(src, builder, e, files) from None


def _unreadable(src: SourceSettings, builder: str, e: Exception, files: list[Path]) -> TinyGPTError:
    bad = _first_bad_line(files) if builder == "json" else None
    if bad:
        return TinyGPTError(f"cannot read {bad}; fix or remove that line")
    cause = e.__cause__ or e  # datasets wraps parse errors of malformed files in its own types
    detail = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    return TinyGPTError(f"cannot read {src.path} as {builder} files: {detail}")


def _first_bad_line(files: list[Path]) -> str | None:
    """'<file> line <n> is not a JSON object (...)' for the first such line of the .jsonl files
    (read in the order datasets read them), or None. Found here, after datasets failed, because
    its json builder parses ~10 MB blocks with pyarrow, whose error counts rows from 0 within the
    block and names neither the file nor the line; and only then: it reads the files again."""
    for path in (p for p in files if p.suffix == ".jsonl"):
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    if (line := line.strip()) and not isinstance(json.loads(line), dict):
                        return f"{path} line {number}: not a JSON object ({line[:40].decode(errors='replace')!r})"
                except UnicodeDecodeError:
                    return f"{path} line {number}: not UTF-8 text"
                except json.JSONDecodeError as e:
                    return f"{path} line {number}: not JSON ({e.msg}: column {e.colno})"
    return None


def records(src: SourceSettings, data_root: Path, log=print) -> Iterator[dict]:
    """The source's records as dicts, for sources of labelled items (evaluation tasks) rather
    than documents: Hub and save_to_disk rows, local .jsonl/.parquet records (a local text file
    gives {"text": ...} per data.source.doc_unit), a downloaded .jsonl file."""
    check(src)
    return SOURCES[src.kind].records(src, data_root, log)


def first_record(src: SourceSettings, data_root: Path) -> dict | None:
    """The first record of local .jsonl/.json/.parquet files or of a save_to_disk folder, read
    without the datasets library's builders (one line, one row); None for other sources, text
    files, or nothing readable (the full read reports that properly)."""
    try:
        if src.kind == "local":
            files = local_files(str(src.path))
            if files[0].suffix == ".jsonl":
                with open(files[0], encoding="utf-8") as f:
                    line = next((line for line in f if line.strip()), None)
                return json.loads(line) if line else None
            if files[0].suffix == ".parquet":
                import pyarrow.parquet as pq

                rows = pq.ParquetFile(files[0]).iter_batches(batch_size=1)
                return next(rows).to_pylist()[0]
        if src.kind == "disk":
            dataset = _disk_dataset(src)
            return dataset[0] if len(dataset) else None
    except (OSError, ValueError, StopIteration, IndexError, TinyGPTError):
        return None
    return None


def _hub_records(src: SourceSettings, data_root: Path, log) -> Iterator[dict]:
    return iter(_hub_dataset(src)[0])


def _disk_records(src: SourceSettings, data_root: Path, log) -> Iterator[dict]:
    return iter(_disk_dataset(src))


def _local_records(src: SourceSettings, data_root: Path, log) -> Iterator[dict]:
    files = local_files(str(src.path))
    if all(p.stat().st_size == 0 for p in files):  # no records (the json builder would fail on them)
        return iter(())
    ds, builder = _local_dataset(src, files, data_root / ".datasets-cache")
    return _read_local(iter(ds), src, builder, files)


def _url_records(src: SourceSettings, data_root: Path, log) -> Iterator[dict]:
    from gpt.data.download import ensure_file

    path = ensure_file(src.url, data_root / src.filename, src.sha256, log=log)
    if path.suffix != ".jsonl":
        raise TinyGPTError(f"{path}: records are read from .jsonl files; download a .jsonl or use data.source.kind=hub")
    return _jsonl(path)


def _jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise TinyGPTError(f"{path} line {number} is not JSON ({e.msg}); is it a .jsonl file?") from None


@dataclass(frozen=True)
class Kind:
    documents: Callable[..., Source]  # (settings, data root, log): the documents to train on
    records: Callable[..., Iterator[dict]]  # (settings, data root, log): rows of labelled items (tasks)
    needs: tuple[str, ...]  # the settings this kind requires


# A new source is an entry here (and its settings, when it needs new ones, fields of
# gpt.config.SourceSettings).
SOURCES = {
    "url": Kind(_url, _url_records, ("url", "sha256", "filename")),
    "hub": Kind(_hub_source, _hub_records, ("path",)),
    "disk": Kind(_disk_source, _disk_records, ("path",)),
    "local": Kind(_local_source, _local_records, ("path",)),
}
