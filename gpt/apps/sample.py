"""Generate text from a trained model: `tinygpt sample [key=value ...]` (or `python sample.py`).

    tinygpt sample                                   # best checkpoint of the most recent run
    tinygpt sample run_dir=outputs/runs/<stamp> prompt="ROMEO:" num_samples=5 top_p=0.9
    tinygpt sample init_from=gpt2 prompt="The meaning of life is"
    echo "First Citizen:" | tinygpt sample prompt=-
    tinygpt sample prompt_file=prompts.jsonl stream=false out_file=samples.jsonl

The prompt is taken verbatim (any Unicode, no Hydra quoting). Samples go to stdout, status
lines to stderr. Settings and defaults: gpt/config/commands.py (SampleConfig; the generation controls
are SamplingSettings).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TextIO

from gpt.apps import common
from gpt.config import SampleConfig
from gpt.errors import TinyGPTError

_COMMAND = "tinygpt sample"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    free = ("prompt", "prompt_file", "out_file", "run_dir", "ckpt", "init_from")
    common.run_command(argv, "sample", _COMMAND, __doc__, lambda s: sample(s, out=sys.stdout, status=sys.stderr), free)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    """\\n, \\t, \\r and \\\\ in text typed on a command line as the characters they name (a
    shell passes them on as a backslash and a letter); any other backslash stays as it is."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def read_prompts(s: SampleConfig, stdin: TextIO | None = None) -> list[str]:
    """The prompt(s): `prompt` as typed, `prompt=-` for stdin, or `prompt_file` (a .jsonl file
    holds one prompt per line, as a string or {"prompt": ...}; any other file is one prompt)."""
    if s.prompt_file:
        path = Path(s.prompt_file).expanduser()
        if path.is_dir():
            raise TinyGPTError(f"prompt_file {path} is a folder; name a text or .jsonl file, or pass prompt='text'")
        if not path.is_file():
            raise TinyGPTError(f"prompt_file {path} does not exist; check the path or pass prompt='text'")
        text = read_text(path, "prompt_file")
        return _jsonl_prompts(path, text) if path.suffix == ".jsonl" else [text]
    from gpt.generation import utf8

    if s.prompt == "-":
        return [utf8((stdin or sys.stdin).read(), "the prompt read from stdin (prompt=-)")]
    return [utf8(s.prompt, "prompt")]


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file, or a one-line error saying where it is not."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TinyGPTError(
            f"{what} {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); save it as UTF-8"
        ) from None
    except OSError as e:
        raise TinyGPTError(f"cannot read {what} {path} ({e.strerror or e})") from None


def _jsonl_prompts(path: Path, text: str) -> list[str]:
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise TinyGPTError(f'{path}:{n} is not valid JSON; write one JSON string or {{"prompt": ...}} per line') from None
        prompts.append(item["prompt"] if isinstance(item, dict) and "prompt" in item else item)
        if not isinstance(prompts[-1], str):
            raise TinyGPTError(f'{path}:{n} holds no prompt string; write one JSON string or {{"prompt": ...}} per line')
    if not prompts:
        raise TinyGPTError(f"{path} holds no prompts")
    return prompts


def sample(
    s: SampleConfig, out: TextIO | None = None, status: TextIO | None = None, stdin: TextIO | None = None
) -> list[list[str]]:
    """Generate per the settings; result[i][j] is sample j of prompt i. Samples stream to `out`
    as they are generated (stream=true), or come as one padded batch; status lines go to
    `status`. None for either prints nothing (the Python API)."""
    from gpt.checkpoints import loading
    from gpt.generation.text import utf8
    from gpt.runtime import devices

    s.stop = tuple(utf8(unescape(stop), "stop") for stop in s.stop)  # typed in a shell: \n is a backslash and an n
    prompts = read_prompts(s, stdin)
    if s.out_file:  # refused now, not after every sample was generated
        _check_out_file(Path(s.out_file).expanduser())
    rt = devices.setup(s.device, s.dtype, s.compile, threads=s.threads)
    loaded = loading.load(loading.choose(s.ckpt, s.run_dir, s.init_from, s.paths.runs_dir))
    model, tokenizer = rt.place(loaded.model), loaded.tokenizer()
    if hasattr(tokenizer, "unknown_chars"):  # fail before any output, not mid-way
        for p in prompts:
            tokenizer.encode(p)
    from gpt.generation import ready_to_decode

    ready_to_decode(model, rt.compile)
    ckpt = loaded.checkpoint
    where = f"step {ckpt.step}, val loss {ckpt.best_val_loss:.4f}" if ckpt else "pretrained"
    _say(status, f"sampling from {loaded.source} ({where}; {rt.describe()})")
    t0 = time.time()
    with rt.autocast():
        results = _generate(model, tokenizer, prompts, s, out)
    _say(status, f"generated {sum(len(t) for r in results for t in r)} characters in {time.time() - t0:.1f} s")
    if s.out_file:
        try:
            write_jsonl(Path(s.out_file).expanduser(), prompts, results, s, loaded.source)
        except OSError as e:
            raise TinyGPTError(f"cannot write out_file={s.out_file} ({e.strerror or e}); pass a file you can write") from None
    return results


def _generate(model, tokenizer, prompts: list[str], s: SampleConfig, out: TextIO | None) -> list[list[str]]:
    from gpt.generation import generate, stream

    total = len(prompts) * s.num_samples
    if not s.stream:
        results = generate(model, tokenizer, prompts, s, num_samples=s.num_samples)
        for i, prompt in enumerate(prompts):
            for j, text in enumerate(results[i]):
                _say(out, f"---------- sample {i * s.num_samples + j + 1}/{total} ----------\n{prompt}{text}")
        return results
    results: list[list[str]] = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        for j in range(s.num_samples):
            _say(out, f"---------- sample {i * s.num_samples + j + 1}/{total} ----------\n{prompt}", end="")
            text = ""
            for piece in stream(model, tokenizer, prompt, s, sample_index=j):
                text += piece
                _say(out, piece, end="")
            _say(out, "")
            results[i].append(text)
    return results


def _say(stream: TextIO | None, text: str, end: str = "\n") -> None:
    if stream is not None:
        print(text, end=end, file=stream, flush=True)


def _check_out_file(path: Path) -> None:
    """Refused before sampling if it cannot be written, creating nothing (a later refusal, a
    prompt outside a char vocabulary, must leave no empty file or folder behind)."""
    if path.is_dir():
        raise TinyGPTError(f"out_file={path} is a folder; name a file to append the samples to, e.g. {path / 'samples.jsonl'}")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise TinyGPTError(f"cannot write out_file={path} (permission denied); pass a file you can write")
        return
    folder = next(p for p in path.parents if p.exists())  # where the missing folders would be made
    if not folder.is_dir():
        raise TinyGPTError(f"cannot write out_file={path} ({folder} is a file); pass a file you can write")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TinyGPTError(f"cannot write out_file={path} (permission denied in {folder}); pass a file you can write")


def write_jsonl(path: Path, prompts: list[str], results: list[list[str]], s: SampleConfig, source: str) -> None:
    settings = s.sampling_only()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # append: earlier samples are kept
        for prompt, texts in zip(prompts, results):
            for j, text in enumerate(texts):
                record = {"checkpoint": source, "prompt": prompt, "sample": j, "text": text, "settings": settings}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":  # python -m gpt.apps.sample, as `tinygpt sample`
    main()
