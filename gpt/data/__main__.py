"""Prepare a dataset ahead of training (e.g. on a CPU machine before a GPU run):

    python -m gpt.data data=tinystories
    python -m gpt.data data=local data.source.path=~/corpus data.name=my_corpus data.num_proc=8

Takes the same overrides as train.py (data.*, paths.data_dir) and composes the same configs.
"""

from __future__ import annotations

import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def main(argv: list[str]) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from gpt.cli import check_keys, guard, preflight
    from gpt.data import load_data
    from gpt.tracking import ensure_console_logging, logger

    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    if not CONFIGS.is_dir():
        raise SystemExit(f"error: no configs/ folder at {CONFIGS}; run from a tinygpt checkout (pip install -e .)")
    preflight(argv, CONFIGS)
    check_keys(argv, CONFIGS, "config")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=[*argv, "paths.output_dir=."])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    ensure_console_logging()
    data = guard(lambda: load_data(cfg["data"], cfg["paths"]["data_dir"], log=logger.info))
    meta = data.meta
    logger.info(f"{data.name}: {meta['documents']:,} documents, {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val "
                f"tokens ({meta['dtype']}, {len(meta['shards']['train'])} + {len(meta['shards']['val'])} shards), "
                f"tokenizer {meta['tokenizer']['kind']}, in {Path(cfg['paths']['data_dir']).expanduser() / data.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
