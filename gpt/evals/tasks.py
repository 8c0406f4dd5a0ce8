"""Zero-shot tasks scored as the published GPT-2/GPT-3 numbers are (`tinygpt eval task=...`).

Multiple choice (HellaSwag, ARC): the model scores each choice as a continuation of the context;
`acc` picks the highest total log-likelihood, `acc_norm` the highest per character of the
choice (lm-evaluation-harness's acc_norm, comparable across tokenizers; longer endings are not
penalised for their length). Cloze (LAMBADA): the last word of a passage is the continuation;
`acc` is whether greedy decoding gives exactly it, `perplexity` is exp(-mean log-likelihood of
it). Prompts follow lm-evaluation-harness, so figures are comparable with its tables.

A task's items come from, in order: `task.path` when set; a local copy at
<data root>/tasks/<name>.jsonl (the task's official or Hub format); its Hub dataset (cached by
the datasets library after the first download).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpt.config import SourceSettings, TaskSettings
from gpt.errors import TinyGPTError
from gpt.evals.scoring import score

DELIMITER = " "  # between context and choice, as in the harness (whose acc_norm divides by the choice alone)


@dataclass(frozen=True)
class Example:
    context: str
    choices: tuple[str, ...]  # what follows the context after a space; a cloze item has one
    gold: int  # index of the right choice


def _hellaswag_text(text: str) -> str:
    # WikiHow items carry bracketed section markers ("[title]", "[step]"): the harness's clean-up
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def _hellaswag(record: dict) -> Example:
    if "endings" in record and record.get("label") in (None, ""):
        raise TinyGPTError("HellaSwag items without a label (the test split): use the validation split")
    context = _hellaswag_text(f"{record['activity_label']}: {record['ctx_a']} {record['ctx_b'].capitalize()}")
    return Example(context, tuple(_hellaswag_text(e) for e in record["endings"]), int(record["label"]))


def _arc(record: dict) -> Example:
    question = record["question"]
    if isinstance(question, dict):  # AI2's own jsonl: {"stem", "choices": [{"text", "label"}]}
        texts = [c["text"] for c in question["choices"]]
        labels = [c["label"] for c in question["choices"]]
        question = question["stem"]
    else:  # the Hub's: question, choices {"text": [...], "label": [...]}
        texts, labels = record["choices"]["text"], record["choices"]["label"]
    if record["answerKey"] not in labels:
        raise TinyGPTError(f"ARC item {record.get('id')}: answerKey {record['answerKey']!r} is not among {labels}")
    return Example(f"Question: {question}\nAnswer:", tuple(texts), labels.index(record["answerKey"]))


def _chat(record: dict):
    from gpt.evals.chat import parse

    return parse(record)


def _lambada(record: dict) -> Example:
    context, _, word = record["text"].rpartition(" ")
    if not context:
        raise TinyGPTError(f"LAMBADA passage {record['text'][:40]!r} has no space before its last word")
    return Example(context, (word,), 0)


@dataclass(frozen=True)
class Task:
    parse: Callable[[dict], Example]
    cloze: bool  # one continuation, scored by greedy match and perplexity
    source: dict  # where its items come from by default (gpt.config.SourceSettings fields)
    official: str  # the file name of the official copy, for the offline hint
    generate: bool = False  # scored by generating replies (gpt.evals.chat), not by likelihoods


TASKS = {
    "hellaswag": Task(
        _hellaswag,
        False,
        dict(kind="hub", path="Rowan/hellaswag", split="validation"),
        "hellaswag_val.jsonl (github.com/rowanz/hellaswag)",
    ),
    "lambada": Task(
        _lambada,
        True,
        dict(kind="hub", path="EleutherAI/lambada_openai", config="default", split="test"),
        "lambada_test.jsonl (OpenAI's)",
    ),
    "arc_easy": Task(
        _arc,
        False,
        dict(kind="hub", path="allenai/ai2_arc", config="ARC-Easy", split="test"),
        "ARC-Easy-Test.jsonl (allenai.org)",
    ),
    "arc_challenge": Task(
        _arc,
        False,
        dict(kind="hub", path="allenai/ai2_arc", config="ARC-Challenge", split="test"),
        "ARC-Challenge-Test.jsonl (allenai.org)",
    ),
    # Conversations of your own (held out): the reply to each, generated greedily, against its last
    # assistant message. No default source: task.path=<file.jsonl>, or <data root>/tasks/chat.jsonl.
    "chat": Task(_chat, False, dict(kind="local", path=None), 'a .jsonl of {"messages": [...]} records', generate=True),
}


def task_of(name: str) -> Task:
    if name not in TASKS:
        raise TinyGPTError(f"task={name!r} is unknown; use one of {', '.join(TASKS)}")
    return TASKS[name]


def check_names(names: list[str]) -> None:
    """Refuse a task name that is not one of TASKS (train.eval_tasks, before anything runs)."""
    for name in names:
        task_of(name)


def source_of(settings: TaskSettings, data_root: Path) -> SourceSettings:
    """Where the task's items come from: task.path, else a local copy, else the Hub."""
    path = Path(settings.path).expanduser() if settings.path else local_copy(settings.name, data_root)
    if settings.path is None and not path.is_file():
        if task_of(settings.name).source.get("path") is None:
            raise TinyGPTError(f"task {settings.name} has no default items: pass task.path=<file.jsonl> (or put them at {path})")
        return SourceSettings(**task_of(settings.name).source)
    if path.is_dir() and any((path / f).is_file() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
        return SourceSettings(kind="disk", path=str(path), split=task_of(settings.name).source["split"])
    return SourceSettings(kind="local", path=str(path))


def local_copy(name: str, data_root: Path) -> Path:
    return Path(data_root) / "tasks" / f"{name}.jsonl"


def examples(settings: TaskSettings, data_root: Path, path_setting: bool = True) -> list[Example]:
    """The task's items, the first `limit` of them, parsed. `path_setting`: whether the command
    takes task.path (tinygpt eval does; training's train.eval_tasks read the local copy or the Hub)."""
    from gpt.data.sources import HubUnreachable, records

    task = task_of(settings.name)
    src = source_of(settings, data_root)
    if src.kind == "local" and Path(src.path).is_file() and Path(src.path).stat().st_size == 0:
        raise TinyGPTError(f"task {settings.name}: {src.path} is empty; it should hold the task's items, one JSON object a line")
    try:
        items = _parsed(settings.name, task, records(src, data_root))
        out = list(itertools.islice(items, settings.limit))
    except HubUnreachable as e:  # its hint names data.source.* settings, which no task command takes
        elsewhere = " or pass task.path=<file> (a .jsonl or .parquet of its items, or a save_to_disk folder)" * path_setting
        raise TinyGPTError(
            f"task {settings.name}: cannot reach {e.where} (offline?); download it once with network (it is then cached), "
            f"or put the task's items ({task.official}) at {local_copy(settings.name, data_root)}{elsewhere}"
        ) from None
    except TinyGPTError as e:
        message = str(e).replace("data.source.path", "task.path")  # the source module speaks of data sources
        if src.kind == "hub":
            message += f"; or put the task's items ({task.official}) at {local_copy(settings.name, data_root)}" + (
                " or pass task.path=<file>" * path_setting
            )
        raise TinyGPTError(f"task {settings.name}: {message}") from None
    if not out:
        raise TinyGPTError(f"task {settings.name}: {src.path} holds no items")
    return out


def _parsed(name: str, task: Task, items: Iterable[dict]) -> Iterator[Example]:
    for number, record in enumerate(items, 1):
        try:
            example = task.parse(record)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            fields = ", ".join(record) if isinstance(record, dict) else type(record).__name__
            raise TinyGPTError(f"item {number} is not a {name} item ({type(e).__name__}: {e}; its fields: {fields})") from None
        if task.generate:
            yield example
            continue
        # what scoring cannot rank: no choices, an empty one (acc_norm divides by its length), no right one
        if not example.choices or not all(example.choices) or not 0 <= example.gold < len(example.choices):
            raise TinyGPTError(
                f"item {number} cannot be scored: {len(example.choices)} choice(s) "
                f"{'(one of them empty) ' if not all(example.choices) else ''}and the right one is number {example.gold + 1}"
            )
        yield example


def metric_names(name: str) -> tuple[str, ...]:
    if task_of(name).generate:
        return ("acc",)
    return ("acc", "perplexity") if task_of(name).cloze else ("acc", "acc_norm")


def training_items(ts, data_root: Path, tokenizer, log) -> dict[str, list[Example]]:
    """The items of a training run's eval tasks (`ts`: its TrainSettings), read and encoded once
    before training: a task that cannot be had (offline, no local copy) or read with this
    tokenizer fails now, not at the first eval."""
    out = {}
    for name in ts.eval_tasks:
        out[name] = examples(TaskSettings(name, limit=ts.eval_task_limit), data_root, path_setting=False)
        requests(tokenizer, name, out[name])
        log(f"task {name}: {len(out[name]):,} items scored at every eval")
    return out


def requests(tokenizer, name: str, items: list[Example]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """Every (context, choice) of the items as token ids, and the item each belongs to. Raises a
    one-line error naming the item when the tokenizer cannot encode it (a char vocabulary). A
    chat task's items become prompts (checked against the chat template)."""
    out, owners = [], []
    if task_of(name).generate:
        for number, item in enumerate(items):
            if hasattr(tokenizer, "prompt"):
                out.append((tokenizer.prompt(list(item.messages), f"task {name} item {number + 1}"), []))
                owners.append(number)
        return out, owners
    for number, item in enumerate(items):
        context = _encode(tokenizer, item.context, name, number) or _start(tokenizer, name)
        for choice in item.choices:
            out.append((context, _encode(tokenizer, DELIMITER + choice, name, number)))
            owners.append(number)
    return out, owners


def evaluate_task(
    model, tokenizer, name: str, items: list[Example], device, batch_size: int = 16, lockstep: bool = False
) -> dict:
    """Accuracy (both normalisations, or greedy match and perplexity for a cloze task; replies
    matched exactly for a chat task) over the items."""
    task = task_of(name)
    if task.generate:
        from gpt.evals.chat import evaluate_chat

        return evaluate_chat(model, tokenizer, items, device, batch_size, name, lockstep)
    pairs, owners = requests(tokenizer, name, items)
    scores = score(model, pairs, device, batch_size)
    per_item: list[list] = [[] for _ in items]
    for owner, s in zip(owners, scores):
        per_item[owner].append(s)
    result = {"task": name, "items": len(items)}
    if task.cloze:
        result["acc"] = sum(s[0].greedy for s in per_item) / len(items)
        result["perplexity"] = math.exp(-sum(s[0].logprob for s in per_item) / len(items))
        return result
    right = right_norm = 0
    for item, item_scores in zip(items, per_item):
        right += _best([s.logprob for s in item_scores]) == item.gold
        right_norm += _best([s.logprob / len(c) for s, c in zip(item_scores, item.choices)]) == item.gold
    result["acc"], result["acc_norm"] = right / len(items), right_norm / len(items)
    return result


def _best(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # the first of equal scores


def _encode(tokenizer, text: str, name: str, number: int) -> list[int]:
    try:
        return tokenizer.encode(text)
    except TinyGPTError as e:
        raise TinyGPTError(f"task {name} item {number + 1}: {e}") from None


def _start(tokenizer, name: str) -> list[int]:
    if tokenizer.eot_id is None:
        raise TinyGPTError(f"task {name}: an item has an empty context and this tokenizer has no end-of-text token to start from")
    return [tokenizer.eot_id]
