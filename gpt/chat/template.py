"""The chat template: its special tokens, how a conversation becomes token ids, and which of
those ids training learns (the loss mask). The one owner of all three: data preparation,
generation, the server, `tinygpt chat` and export use this module and nothing else.

A conversation renders as

    [end-of-text]  <|system|> text <|end|>  <|user|> text <|end|>  <|assistant|> text <|end|> ...

- The four special tokens take the ids right after the base tokenizer's vocabulary, in the
  order of SPECIAL_TOKENS, so every id of ordinary text stays what it was: a base model's
  embeddings keep meaning the same text, and only four rows are new.
- Message text is encoded as ordinary text by the base tokenizer: a user who types
  "<|assistant|>" gets those characters, never the control token, so no message can forge a
  turn.
- End-of-text opens the conversation where the tokenizer has one: a pretrained model has seen
  it before every document, so a conversation starts where its documents did.
- Trained (mask 1): each assistant message's text and its <|end|>. Not trained: the role
  tokens and everything the user or system wrote, which the model is given, not asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpt.chat.messages import ROLES, Turns, check_messages
from gpt.errors import TinyGPTError

NAME = "tinygpt-v1"
SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")


class ChatTokenizer(Turns):
    """A base tokenizer (any kind) plus the template's special tokens. Ordinary text encodes and
    decodes exactly as the base does; everything else the base has (its kind, `enc`, `chars`,
    `piece_bytes`, ...) is the base's."""

    def __init__(self, base):
        self.base = base
        n = base.vocab_size
        self.ids = {name: n + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.role_ids = {role: self.ids[f"<|{role}|>"] for role in ROLES}
        self.end_id = self.ids["<|end|>"]
        self.special_ids = frozenset(self.ids.values())
        self._names = {i: name for name, i in self.ids.items()}
        # Generation stops at the end of the turn, or where the model starts another one.
        self.stop_ids = self.special_ids | ({base.eot_id} if base.eot_id is not None else set())

    def __getattr__(self, name):  # only called for what this class does not define itself
        if name == "base":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def kind(self) -> str:
        return self.base.kind

    @property
    def eot_id(self) -> int | None:
        return self.base.eot_id

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size + len(SPECIAL_TOKENS)

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if hasattr(self.base, "encode_batch"):
            return self.base.encode_batch(texts)
        return [self.base.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Ordinary ids as the base decodes them; a special token as its name."""
        out, run = [], []
        for i in ids:
            if i in self._names:
                if run:
                    out.append(self.base.decode(run))
                    run = []
                out.append(self._names[i])
            else:
                run.append(i)
        if run:
            out.append(self.base.decode(run))
        return "".join(out)

    def to_dict(self) -> dict:
        return {**self.base.to_dict(), "chat": {"template": NAME}}

    # --- the template ------------------------------------------------------------------------

    def render(self, messages: Sequence[dict], where: str = "the conversation") -> tuple[list[int], list[int]]:
        """(ids, mask) of a whole conversation; mask[i] = 1 where ids[i] is trained."""
        check_messages(messages, where)
        ids, mask = self._start()
        for message in messages:
            trained = int(message["role"] == "assistant")
            body = self._encode_text(message["content"], where) + [self.end_id]
            ids += [self.role_ids[message["role"]]] + body
            mask += [0] + [trained] * len(body)
        return ids, mask

    def prompt(self, messages: Sequence[dict], where: str = "the conversation") -> list[int]:
        """The ids a model continues to write the assistant's next reply: the conversation so far
        (ending with a user message) and the assistant's role token."""
        check_messages(messages, where, for_reply=True)
        ids, _ = self._start()
        for message in messages:
            ids += [self.role_ids[message["role"]]] + self._encode_text(message["content"], where) + [self.end_id]
        return ids + [self.role_ids["assistant"]]

    def _start(self) -> tuple[list[int], list[int]]:
        return ([self.eot_id], [0]) if self.eot_id is not None else ([], [])

    def _encode_text(self, text: str, where: str) -> list[int]:
        try:
            return self.base.encode(text)
        except TinyGPTError as e:  # a char vocabulary without some character of this message
            raise TinyGPTError(f"{where}: {e}") from None


def jinja_template(eot: str | None) -> str:
    """The template in the Jinja form Hugging Face's `apply_chat_template` renders (written into
    an export's tokenizer_config.json): the same text, hence the same ids, as `render`/`prompt`
    for messages that do not spell a special token themselves. `eot`: the base tokenizer's
    end-of-text text, or None when it has none."""
    start = eot or ""
    return (
        "{{ '" + start + "' }}"
        "{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )


def with_template(base, spec: dict | None):
    """`base` with the chat template a tokenizer's dict form records (its "chat" entry): tinygpt's
    own, or a Hugging Face tokenizer's (gpt.chat.hf_template); as it is when the record names none."""
    if not spec:
        return base
    if spec.get("template") == NAME:
        return ChatTokenizer(base)
    if spec.get("template") == "hf" and getattr(base, "kind", None) == "hf":
        from gpt.chat.hf_template import HFChatTokenizer

        return HFChatTokenizer(base, spec)
    raise TinyGPTError(
        f"chat template {spec.get('template')!r} is not one this tinygpt knows ({NAME}, hf); upgrade tinygpt to use this model"
    )
