"""Messages as every chat template takes them: who may speak when (`check_messages`), and what
a template does with a conversation whatever its format (`Turns`: fitting a prompt into the
context, the text of a reply). gpt.chat.template and gpt.chat.hf_template both build on it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpt.errors import TinyGPTError

ROLES = ("system", "user", "assistant")


class Turns:
    """What a chat tokenizer does with its `prompt(messages)` and `stop_ids`, whichever template
    renders them."""

    def prompt_within(self, messages: Sequence[dict], limit: int, where: str = "the conversation") -> tuple[list[int], int]:
        """The prompt of `messages` in at most `limit` ids where possible: the oldest turns go
        first, a user message with the reply it got, the system message staying; the newest user
        message always stays (a prompt still too long is cut by generation, with a notice).
        Returns (ids, how many messages were dropped)."""
        messages = list(messages)
        check_messages(messages, where, for_reply=True)
        head = messages[:1] if messages[0]["role"] == "system" else []
        turns = messages[len(head) :]
        dropped = 0
        ids = self.prompt(head + turns, where)
        while len(ids) > limit and len(turns) > 1:
            turns, dropped = turns[2:], dropped + 2
            ids = self.prompt(head + turns, where)
        return ids, dropped

    def reply_text(self, ids: Sequence[int]) -> str:
        """The text of a generated reply: its ids up to the first stop token, decoded."""
        for n, i in enumerate(ids):
            if i in self.stop_ids:
                ids = ids[:n]
                break
        return self.base.decode(list(ids))


def check_messages(messages, where: str = "the conversation", for_reply: bool = False) -> None:
    """Refuse what the template cannot render, naming `where` (a record, a request): messages
    must be a non-empty list of {"role", "content"} with a known role; a system message only
    first; then user and assistant turns alternate, starting with the user. For a reply
    (`for_reply`), the last message is the user's."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise TinyGPTError(f'{where} has no messages: give a non-empty list of {{"role": ..., "content": ...}}')
    previous = None
    for n, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise TinyGPTError(f'{where}, message {n}: write it as {{"role": ..., "content": ...}}')
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise TinyGPTError(f"{where}, message {n}: unknown role {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise TinyGPTError(f"{where}, message {n}: content must be text, not {type(content).__name__}")
        if role == "system" and n != 1:
            raise TinyGPTError(f"{where}, message {n}: a system message can only come first")
        if role != "system":
            expected = "user" if previous in (None, "system", "assistant") else "assistant"
            if role != expected:
                twice = f"two {role} turns in a row" if role == previous else f"an {role} turn before any user turn"
                raise TinyGPTError(f"{where}, message {n}: {twice}; user and assistant turns must alternate")
        previous = role
    if for_reply and previous != "user":
        raise TinyGPTError(f"{where}: the last message must be the user's for the assistant to answer it")
