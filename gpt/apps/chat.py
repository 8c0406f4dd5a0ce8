"""Talk to a model finetuned on conversations: `tinygpt chat [key=value ...]`.

    tinygpt chat run_dir=outputs/runs/<sft run>
    tinygpt chat run_dir=<run> system="You are terse." temperature=0 max_new_tokens=64
    printf 'What is 2 + 2?\\nAnd 3 + 3?\\n' | tinygpt chat run_dir=<run> temperature=0

On a terminal: type a message and Enter; the reply streams as it is generated. `/clear` starts
the conversation again (the system message stays), `/exit` (or Ctrl-D) ends it. The history is
kept while it fits the model's context; then the oldest turns are dropped, with a notice. When
stdin is not a terminal, each line is one user message of one conversation, and each reply is
printed on stdout as one block followed by a newline: scripts read replies, status goes to
stderr. Settings and defaults: gpt/config/commands.py (ChatConfig; the controls are SamplingSettings).
"""

from __future__ import annotations

import sys
from typing import TextIO

from gpt.apps import common
from gpt.config import ChatConfig
from gpt.errors import TinyGPTError

_COMMAND = "tinygpt chat"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    free = ("run_dir", "ckpt", "init_from", "system")
    common.run_command(argv, "chat", _COMMAND, __doc__, lambda s: chat(s), free)


def load_chat_model(s, status: TextIO | None = None):
    """(model on its device, tokenizer with the chat template, runtime) of the model `s` names;
    a model without the template is refused, saying how to give it one."""
    from gpt.checkpoints import loading
    from gpt.generation import ready_to_decode
    from gpt.runtime import devices

    rt = devices.setup(s.device, s.dtype, s.compile, threads=s.threads)
    loaded = loading.load(loading.choose(s.ckpt, s.run_dir, s.init_from, s.paths.runs_dir))
    tokenizer = loaded.tokenizer()
    if not hasattr(tokenizer, "prompt"):
        raise TinyGPTError(no_template(loaded.source))
    if status is not None:
        print(f"chatting with {loaded.source} ({rt.describe()}); /clear starts again, /exit ends", file=status, flush=True)
    model = rt.place(loaded.model)
    ready_to_decode(model, rt.compile)
    return model, tokenizer, rt


def no_template(source: str) -> str:
    return (
        f"{source} has no chat template (it was trained on plain text); finetune it on conversations first: "
        f"tinygpt train experiment=sft init_from={source} data=local data.source.path=<conversations.jsonl> data.name=<name>"
    )


def reply_room(model, max_new_tokens: int) -> int | None:
    """The ids a prompt may take so that a reply still fits the context (None: no limit, a
    recurrent model). The reply gets max_new_tokens, or half the context if that is less."""
    if getattr(model, "recurrent", False):
        return None
    block = model.config.block_size
    return block - min(max_new_tokens, block // 2)


def chat(s: ChatConfig, stdin: TextIO | None = None, out: TextIO | None = None, status: TextIO | None = None) -> list[dict]:
    """Run the conversation; returns its messages (what the history holds at the end)."""
    from gpt.generation import stream, utf8

    stdin, out, status = stdin or sys.stdin, out or sys.stdout, status or sys.stderr
    utf8(s.system or "", "system")
    model, tokenizer, rt = load_chat_model(s, status)
    interactive = stdin.isatty()
    start = [{"role": "system", "content": s.system}] if s.system else []
    history = list(start)
    limit = reply_room(model, s.max_new_tokens)
    while True:
        if interactive:
            print("you> ", end="", file=out, flush=True)
        line = stdin.readline()
        if not line:  # end of input (Ctrl-D)
            break
        text = line.rstrip("\n")
        if text.strip() in ("/exit", "/quit"):
            break
        if text.strip() == "/clear":
            history = list(start)
            print("(conversation cleared)", file=status, flush=True)
            continue
        if not text.strip():
            continue
        try:
            utf8(text, "the message")
        except TinyGPTError as e:  # a typed slip ends no conversation; a piped file's does
            if not interactive:
                raise
            print(f"(not sent: {e})", file=status, flush=True)
            continue
        history.append({"role": "user", "content": text})
        if limit is None:
            ids, dropped = tokenizer.prompt(history), 0
        else:
            ids, dropped = tokenizer.prompt_within(history, limit)
        if dropped:
            del history[len(start) : len(start) + dropped]
            print(f"(notice: the {dropped} oldest messages no longer fit the context and were dropped)", file=status, flush=True)
        if interactive:
            print("assistant> ", end="", file=out, flush=True)
        reply = ""
        with rt.autocast():
            for piece in stream(model, tokenizer, ids, s):
                reply += piece
                print(piece, end="", file=out, flush=True)
        print("", file=out, flush=True)
        history.append({"role": "assistant", "content": reply})
    return history


if __name__ == "__main__":  # python -m gpt.apps.chat, as `tinygpt chat`
    main()
