"""A synthetic conversation suite, made here with no network: skills whose answers can be checked
exactly, to show on a CPU in minutes that supervised finetuning teaches a model to answer.

Skills (each reply is short and has one right answer):
- arithmetic: "What is 47 + 58?" -> "105" (two 2-digit numbers, + or -, never negative; 3-digit
  operands are beyond what this suite's small CPU models learn in minutes, see benchmarks/chat.py)
- reverse: "Reverse the word 'plank'." -> "knalp"
- count: "How many times does the letter 'a' appear in 'banana'?" -> "3"
- spell: "Spell 'stone' letter by letter." -> "s-t-o-n-e"
- name: "What is your name?" (several phrasings) -> "I am tinygpt, a small language model."

Each skill's questions come in a few phrasings, one conversation in four opens with a system
message, and one in five asks a question of another skill first (answered), so the model must
read the last question rather than match one string. The test split holds
questions that appear nowhere in the train split (the numbers or the word differ); the name
skill's phrasings are shared by design (it is a fact to remember, not a computation).

    python -m gpt.chat.synthetic <folder> [--train N] [--test N] [--seed S]

writes <folder>/train.jsonl and <folder>/test.jsonl: {"messages": [...], "skill": ...} per line.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections.abc import Callable
from pathlib import Path

from gpt.runtime import io

NAME_ANSWER = "I am tinygpt, a small language model."
SYSTEM = ("You are a helpful assistant.", "Answer briefly.", "You are tinygpt.")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 7)))


def arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    if rng.random() < 0.5:
        q, ans = f"{a} + {b}", a + b
    else:
        a, b = max(a, b), min(a, b)
        q, ans = f"{a} - {b}", a - b
    phrasing = rng.choice(("What is {}?", "Compute {}.", "{} = ?"))
    return phrasing.format(q), str(ans)


def reverse(rng: random.Random) -> tuple[str, str]:
    w = _word(rng)
    return rng.choice(("Reverse the word '{}'.", "Write '{}' backwards.")).format(w), w[::-1]


def count(rng: random.Random) -> tuple[str, str]:
    w = _word(rng)
    letter = rng.choice(w) if rng.random() < 0.8 else rng.choice(string.ascii_lowercase)
    phrasing = rng.choice(("How many times does the letter '{}' appear in '{}'?", "Count the letter '{}' in '{}'."))
    return phrasing.format(letter, w), str(w.count(letter))


def spell(rng: random.Random) -> tuple[str, str]:
    w = _word(rng)
    return rng.choice(("Spell '{}' letter by letter.", "Spell out '{}'.")).format(w), "-".join(w)


def name(rng: random.Random) -> tuple[str, str]:
    phrasing = rng.choice(("What is your name?", "Who are you?", "What should I call you?", "Tell me your name."))
    return phrasing, NAME_ANSWER


SKILLS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "arithmetic": arithmetic,
    "reverse": reverse,
    "count": count,
    "spell": spell,
    "name": name,
}


def conversation(skill: str, rng: random.Random) -> dict:
    """A conversation whose last reply is `skill`'s answer."""
    messages = [{"role": "system", "content": rng.choice(SYSTEM)}] if rng.random() < 0.25 else []
    if rng.random() < 0.2:  # an earlier exchange first, of any skill
        question, answer = SKILLS[rng.choice(list(SKILLS))](rng)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    question, answer = SKILLS[skill](rng)
    messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return {"messages": messages, "skill": skill}


# Arithmetic is the hardest skill to learn (carries): it gets half of the train split (the test
# split holds the skills equally).
TRAIN_SHARES = {"arithmetic": 4, "reverse": 1, "count": 1, "spell": 1, "name": 1}


def suite(n_train: int, n_test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, test) conversations, the skills in turn (train by TRAIN_SHARES); no test question
    is a train question (except the name skill's few phrasings)."""
    rng = random.Random(seed)
    cycle = [skill for skill, share in TRAIN_SHARES.items() for _ in range(share)]
    train = [conversation(cycle[i % len(cycle)], rng) for i in range(n_train)]
    skills = list(SKILLS)
    seen = {c["messages"][-2]["content"] for c in train}
    test: list[dict] = []
    while len(test) < n_test:
        c = conversation(skills[len(test) % len(skills)], rng)
        if c["skill"] == "name" or c["messages"][-2]["content"] not in seen:
            test.append(c)
    return train, test


def write_suite(folder: str | Path, n_train: int = 60000, n_test: int = 500, seed: int = 0) -> tuple[Path, Path]:
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    train, test = suite(n_train, n_test, seed)
    paths = folder / "train.jsonl", folder / "test.jsonl"
    for path, items in zip(paths, (train, test)):
        io.write_bytes(path, "".join(json.dumps(c) + "\n" for c in items).encode())
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpt.chat.synthetic", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--train", type=int, default=60000, help="train conversations (default 60000)")
    parser.add_argument("--test", type=int, default=500, help="held-out test conversations (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train, test = write_suite(args.folder, args.train, args.test, args.seed)
    print(f"wrote {train} ({args.train:,} conversations) and {test} ({args.test:,})")


if __name__ == "__main__":
    main()
