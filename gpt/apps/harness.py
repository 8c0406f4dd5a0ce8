"""EleutherAI's lm-evaluation-harness on a tinygpt model: any of its tasks, its prompts and metrics.

    tinygpt harness --model_args pretrained=outputs/runs/<stamp> --tasks hellaswag --limit 100
    tinygpt harness --model_args pretrained=gpt2 --tasks arc_easy,lambada_openai --device cuda
    tinygpt harness --tasks my_task --include_path my_tasks/      # a task of your own: YAML + data
    tinygpt harness ls tasks                                      # what there is

The options are lm_eval's own (`tinygpt harness run --help`); tinygpt's defaults: --model tinygpt,
--device auto, --batch_size auto (16), and pretrained= the newest run under outputs/runs. In
--model_args, pretrained= is a run directory, a checkpoint file, or a GPT-2 name or folder.
Needs the eval extra: pip install 'tinygpt[eval]'. The adapter: gpt/evals/harness.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpt.apps import common
from gpt.errors import TinyGPTError


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in ([], ["-h"], ["--help"]):
        print(__doc__.strip())
        return
    common.guard(lambda: run(argv))


def run(argv: list[str]) -> None:
    import gpt.evals.harness  # noqa: F401  (registers the tinygpt model with lm_eval, or says how to install it)

    # lm_eval's other subcommands (ls, validate) and help take none of the options defaulted here
    if argv[0] not in ("ls", "validate") and not {"-h", "--help"} & set(argv):
        argv = with_defaults(argv)
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["tinygpt harness", *argv]
    try:
        cli_evaluate()
    except ValueError as e:  # the likeliest mistake of all, which lm_eval reports with a traceback
        if not str(e).startswith("Tasks not found"):
            raise
        raise TinyGPTError(f"{e}; list them with `tinygpt harness ls tasks`, or add yours with --include_path <folder>") from None


def with_defaults(argv: list[str]) -> list[str]:
    """argv plus tinygpt's defaults for what it does not set; a tinygpt model it names is checked
    now, before lm_eval reads any task."""
    peek = argparse.ArgumentParser(add_help=False)
    for flags in (("--model", "-M"), ("--model_args", "-a"), ("--device",), ("--batch_size", "-b"), ("--config", "-C")):
        peek.add_argument(*flags, nargs="+" if flags[0] == "--model_args" else None)
    given, _ = peek.parse_known_args(argv)
    if given.config:  # a config file's settings stand as lm_eval reads them (ours would override them)
        return argv
    extra = ["--model", "tinygpt"] * (given.model is None)
    if (given.model or "tinygpt") != "tinygpt":
        return argv + extra
    extra += ["--device", "auto"] * (given.device is None) + ["--batch_size", "auto"] * (given.batch_size is None)
    from gpt.checkpoints import loading
    from gpt.evals import harness

    args = model_args(given.model_args)
    harness.check_args(args)
    loading.check(harness.source(args.get("pretrained")), "pretrained")
    return argv + extra


def model_args(values: list[str] | None) -> dict:
    """--model_args as lm_eval reads it: a JSON object, or key=value items (comma- or space-separated)."""
    if not values:
        return {}
    if values[0].lstrip().startswith("{"):
        try:
            return json.loads(values[0])
        except json.JSONDecodeError as e:
            raise TinyGPTError(f"--model_args {values[0]!r} is not valid JSON ({e})") from None
    return dict(item.split("=", 1) for value in values for item in value.split(",") if "=" in item)


if __name__ == "__main__":  # python -m gpt.apps.harness, as `tinygpt harness`
    main()
