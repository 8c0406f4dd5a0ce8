"""Loss, perplexity and bits per byte of a model on its data's split or on a text file:

    tinygpt eval                                                   # the newest run, on its val split
    tinygpt eval run_dir=outputs/runs/<stamp> split=train max_tokens=200000
    tinygpt eval ckpt=outputs/runs/<stamp>/checkpoints/best.pt data=shakespeare   # another dataset
    tinygpt eval init_from=gpt2 text_file=essay.txt
    tinygpt eval paths.runs_dir=elsewhere                          # the newest run under another folder
    tinygpt eval init_from=gpt2 task=hellaswag                     # zero-shot: hellaswag | lambada | arc_easy | arc_challenge
    tinygpt eval task=arc_easy task.limit=500 task.path=ARC-Easy-Test.jsonl

Settings and defaults: gpt/config/commands.py (EvalConfig).
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpt.apps import common
from gpt.config import EvalConfig
from gpt.errors import TinyGPTError


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    common.run_command(
        argv, "eval", "tinygpt eval", __doc__, evaluate, verbatim=("run_dir", "ckpt", "init_from", "text_file", "task.path")
    )


def evaluate(s: EvalConfig) -> dict:
    import numpy as np

    from gpt.apps.sample import read_text
    from gpt.checkpoints import loading
    from gpt.data.chat import ChatSplit
    from gpt.evals.perplexity import evaluate_conversations, evaluate_tokens
    from gpt.runtime import devices

    # The forward passes run under the runtime's autocast, as training's evals do (bf16 on GPUs
    # that have it; dtype=float32 to score in full precision).
    rt = devices.setup(s.device, s.dtype, False, threads=s.threads)
    loaded = loading.load(loading.choose(s.ckpt, s.run_dir, s.init_from, s.paths.runs_dir), dropout=0.0)
    tokenizer = loaded.tokenizer()
    if s.task is not None:
        return _task(s, loaded, tokenizer, rt)
    if s.text_file:
        path = Path(s.text_file).expanduser()
        if not path.is_file():
            raise TinyGPTError(f"text_file {path} does not exist")
        tokens, source = np.array(tokenizer.encode(read_text(path, "text_file")), dtype=np.int64), str(path)
    else:
        tokens, source = _split_tokens(s, loaded)
    if isinstance(tokens, ChatSplit):  # a chat finetune's conversations: its replies, as it trains on them
        with rt.autocast():
            r = evaluate_conversations(rt.place(loaded.model), tokens, tokenizer, rt.device, s.batch_size, s.max_tokens)
        left = f"; {r['left_out']:,} longer than the context left out, as in training" if r["left_out"] else ""
        scored = f"{r['tokens']:,} reply tokens scored in {r['conversations']:,} conversations ({r['bytes']:,} bytes{left})"
    else:
        with rt.autocast():
            r = evaluate_tokens(rt.place(loaded.model), tokens, tokenizer, rt.device, s.batch_size, s.max_tokens, s.stride)
        scored = f"{r['tokens']:,} tokens scored ({r['bytes']:,} bytes, stride {r['stride']})"
    figures = f"loss {r['loss']:.4f}, perplexity {r['perplexity']:.2f}, bits per byte {r['bits_per_byte']:.4f}"
    print(f"{loaded.source} on {source}: {scored}: {figures}")
    return r


def _task(s: EvalConfig, loaded, tokenizer, rt) -> dict:
    from gpt.evals.tasks import evaluate_task, examples

    items = examples(s.task, s.paths.data_root())
    with rt.autocast():
        r = evaluate_task(rt.place(loaded.model), tokenizer, s.task.name, items, rt.device, s.batch_size)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in r.items() if k not in ("task", "items"))
    print(f"{loaded.source} on {s.task.name} ({r['items']:,} items): {shown}")
    return r


def _split_tokens(s: EvalConfig, loaded):
    """The tokens of a prepared split: of data=<name> when given, else of the model's own data."""
    from gpt.config import DataSettings
    from gpt.data import load_data
    from gpt.data.shards import PreparedOtherwise
    from gpt.evals.perplexity import split_tokens
    from gpt.tokenizers import require_same

    data_settings = s.data
    if data_settings is None:
        data_settings, ignored = loaded.checkpoint.settings("data", DataSettings) if loaded.checkpoint else (None, [])
        if data_settings is None:
            raise TinyGPTError(f"{loaded.source} carries no data settings; pass text_file=<file> or data=<name>")
        if ignored:
            print(f"notice: {loaded.source} records {', '.join(ignored)}, unknown to this tinygpt: ignored", file=sys.stderr)

    def same(tokenizer: dict) -> None:  # checked before any work: data the model cannot read is not prepared
        mismatch = f"data {data_settings.name} uses another tokenizer than the model"
        require_same(loaded.tokenizer_spec, tokenizer, mismatch, "pick data prepared with the model's")

    try:
        # eval reads prepared data: it prepares data that is not there, never over other data
        # a finetune's conversations were tokenized with its model's tokenizer (gpt.training.build)
        finetuned = loaded.checkpoint is not None and (loaded.checkpoint.config or {}).get("init_from")
        data = load_data(
            data_settings,
            s.paths.data_root(),
            log=lambda m: print(m, file=sys.stderr),
            base_tokenizer=loaded.tokenizer_spec if finetuned else None,
            replace=False,
            check_tokenizer=same,
        )
    except PreparedOtherwise as e:
        raise TinyGPTError(f"{e}; tinygpt eval does not prepare over it: {_prepare_again(s, loaded)}") from None
    if data.kind == "chat":  # scored conversation by conversation (evaluate_conversations)
        return data.splits[s.split], f"{data.name} {s.split}"
    return split_tokens(getattr(data, s.split), s.max_tokens), f"{data.name} {s.split}"


def _prepare_again(s: EvalConfig, loaded) -> str:
    """How to prepare the data eval was asked for in place of the other (or beside it)."""
    from gpt.training.claim import recorded_overrides

    ours = recorded_overrides(Path(loaded.source), ("data", "experiment")) if s.data is None and loaded.checkpoint else []
    command = f"`tinygpt prepare {' '.join(ours)}`" if ours else "`tinygpt prepare` and the same data settings"
    return f"prepare it again with {command} (in its place, for every run that reads it), or pass data= with another data.name"


if __name__ == "__main__":  # python -m gpt.apps.eval, as `tinygpt eval`
    main()
