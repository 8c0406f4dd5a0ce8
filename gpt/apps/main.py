"""`tinygpt <command> [key=value ...]`: one console command for everything.

    tinygpt train   [key=value ...] [-m]   train a model (a sweep with -m)
    tinygpt sample  [key=value ...]        generate text from a trained model
    tinygpt chat    [key=value ...]        talk to a model finetuned on conversations
    tinygpt eval    [key=value ...]        loss, perplexity, bits per byte
    tinygpt export  out=<folder> ...       a checkpoint to a Hugging Face folder (transformers loads it)
    tinygpt plot    [key=value ...]        a run's loss curves, or its attention maps, as a PNG
    tinygpt prepare [key=value ...]        tokenize a dataset ahead of training
    tinygpt sweep   <sweep dir>            a sweep's leaderboard and val curves
    tinygpt scaling preset=<..> out=<dir>  an IsoFLOP study: the compute-optimal size for a budget
    tinygpt harness <lm_eval options>      lm-evaluation-harness tasks on a model
    tinygpt serve   [key=value ...]        a web playground and an OpenAI-compatible API

`tinygpt <command> --help` lists a command's settings with their defaults.
"""

from __future__ import annotations

import importlib
import sys

from gpt.apps.common import fail

COMMANDS = ("train", "sample", "chat", "eval", "export", "plot", "prepare", "sweep", "scaling", "harness", "serve")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; use one of: {', '.join(COMMANDS)} (tinygpt --help)")
    sys.argv = [f"tinygpt {command}", *rest]
    importlib.import_module(f"gpt.apps.{command}").main(rest)
