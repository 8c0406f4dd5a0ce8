"""Prepare a dataset ahead of training (e.g. on a CPU machine before a GPU run):

    tinygpt prepare data=tinystories
    tinygpt prepare data=local "data.source.path='~/corpus'" data.name=my_corpus data.num_proc=8

Takes the same overrides as `tinygpt train` (data.*, paths.data_dir) and composes the same configs.
"""

from __future__ import annotations

import sys

from gpt.apps import common
from gpt.config import RunConfig


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    common.run_command(argv, "config", "tinygpt prepare", __doc__, prepare)


def prepare(s: RunConfig):
    from gpt.data import load_data
    from gpt.tracking import ensure_console_logging, logger

    ensure_console_logging()
    root = s.paths.data_root()
    data = load_data(s.data, root, log=logger.info)
    meta = data.meta
    if meta.get("kind") == "chat":  # conversations: one file per split, no shards
        what, held = "conversations", ""
    else:
        what, held = "documents", f", {len(meta['shards']['train'])} + {len(meta['shards']['val'])} shards"
    logger.info(
        f"{data.name}: {meta['documents']:,} {what}, {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val "
        f"tokens ({meta['dtype']}{held}), tokenizer {meta['tokenizer']['kind']}, in {root / data.name}"
    )
    return data


if __name__ == "__main__":  # python -m gpt.apps.prepare, as `tinygpt prepare`
    main()
