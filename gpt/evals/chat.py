"""Conversations scored by what the model writes: for each held-out conversation, the model
replies greedily to everything before its last assistant message, and the reply counts when it
equals that message exactly (surrounding whitespace aside). Accuracy overall and per `skill`
(a record's optional label, e.g. the synthetic suite's). `tinygpt eval task=chat task.path=<.jsonl>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt.config import SamplingSettings
from gpt.errors import TinyGPTError


@dataclass(frozen=True)
class ChatItem:
    messages: tuple  # the conversation up to the reply: ends with the user's message
    answer: str  # the reply that counts as right
    skill: str | None = None


def parse(record: dict) -> ChatItem:
    from gpt.data.chat import conversation_of

    messages = conversation_of(record, "the item")
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("its last message is not the assistant's (the answer to score against)")
    return ChatItem(tuple(messages[:-1]), str(messages[-1]["content"]), record.get("skill"))


def evaluate_chat(
    model, tokenizer, items: list[ChatItem], device, batch_size: int = 16, name: str = "chat", lockstep: bool = False
) -> dict:
    """{"acc", "acc/<skill>"..., "items"}; the replies are generated greedily, in batches (`lockstep`:
    by every process of a sharded model together, gpt.generation.generate)."""
    from gpt.generation import generate

    if not hasattr(tokenizer, "prompt"):
        raise TinyGPTError(
            f"task {name} needs a chat model: this model has no chat template; finetune it on conversations first "
            f"(tinygpt train experiment=sft init_from=<run>)"
        )
    prompts = [tokenizer.prompt(list(item.messages), f"task {name} item {n + 1}") for n, item in enumerate(items)]
    longest = max(len(tokenizer.encode(item.answer)) for item in items)
    settings = SamplingSettings(max_new_tokens=longest + 8, temperature=0.0)
    replies: list[str] = []
    for start in range(0, len(items), batch_size):
        replies += [
            r[0]
            for r in generate(model, tokenizer, prompts[start : start + batch_size], settings, device=device, lockstep=lockstep)
        ]
    right = [reply.strip() == item.answer.strip() for reply, item in zip(replies, items)]
    result: dict = {"task": name, "items": len(items), "acc": sum(right) / len(items)}
    for skill in sorted({item.skill for item in items if item.skill}):
        mine = [ok for ok, item in zip(right, items) if item.skill == skill]
        result[f"acc/{skill}"] = sum(mine) / len(mine)
    return result
