"""A Hugging Face tokenizer's own chat template (its `chat_template`, Jinja, from
tokenizer_config.json), used instead of tinygpt's when a model ships one (SmolLM2, Qwen, Llama):
the conversation is rendered exactly as transformers' `apply_chat_template` renders it, with the
same Jinja settings, and the tokenizer's own special tokens mark the turns (no new tokens).

Message text stays ordinary text, as with tinygpt's template: the template is rendered with a
private-use placeholder for each message's content, the rendered string is split at the
placeholders, the template's pieces are encoded with special tokens recognised and the messages'
text without. That also gives the loss mask: an assistant message's text, and its template
piece up to the end-of-turn token, are trained. For text that spells no special token the ids
are those of `apply_chat_template` (tests/chat/test_hf_template.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpt.chat.messages import Turns, check_messages
from gpt.errors import TinyGPTError

NAME = "hf"
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: no template or message writes them


def jinja_environment():
    """The Jinja environment transformers renders chat templates in (sandboxed, trim_blocks,
    lstrip_blocks, its extensions and helpers), so a template renders here as it does there."""
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TinyGPTError(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda value, indent=None, **kw: __import__("json").dumps(value, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class HFChatTokenizer(Turns):
    """An `hf` tokenizer with its own chat template: the interface of gpt.chat.template's
    ChatTokenizer (render, prompt, prompt_within, reply_text, end_id, stop_ids, special_ids)."""

    def __init__(self, base, spec: dict):
        self.base, self.spec = base, dict(spec)
        self.template = jinja_environment().from_string(spec["jinja"])
        self.tokens = {k: spec.get(k) for k in ("bos", "eos")}
        self.special_ids = frozenset(i for i, t in base.tok.get_added_tokens_decoder().items() if t.special)
        self.end_id = self._end_of_turn()
        eos = base.tok.token_to_id(self.tokens["eos"]) if self.tokens["eos"] else None
        self.stop_ids = frozenset({self.end_id} | ({eos} if eos is not None else set()) | {base.eot_id} - {None})
        self.role_ids = {}  # turns are marked by text the template writes, not by one token per role

    def __getattr__(self, name):
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    kind = property(lambda self: self.base.kind)
    eot_id = property(lambda self: self.base.eot_id)
    vocab_size = property(lambda self: self.base.vocab_size)

    def encode(self, text: str) -> list[int]:
        return self.base.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.base.decode(ids)

    def to_dict(self) -> dict:
        return {**self.base.to_dict(), "chat": self.spec}

    # --- rendering -----------------------------------------------------------------------------

    def _pieces(self, messages: Sequence[dict], add_generation_prompt: bool, where: str) -> list[tuple[str, int | None]]:
        """The rendered conversation as (text, message index or None for the template's own)."""
        marked = [{**m, "content": f"{_OPEN}{i}{_CLOSE}"} for i, m in enumerate(messages)]
        try:
            text = self.template.render(
                messages=marked, add_generation_prompt=add_generation_prompt, **{f"{k}_token": v for k, v in self.tokens.items()}
            )
        except TinyGPTError:
            raise
        except Exception as e:  # a template's own error: jinja2's, or one it raised
            raise TinyGPTError(f"{where}: the model's chat template cannot render it ({type(e).__name__}: {e})") from None
        pieces: list[tuple[str, int | None]] = []
        for n, chunk in enumerate(text.split(_OPEN)):
            if n == 0:
                pieces.append((chunk, None))
                continue
            index, _, rest = chunk.partition(_CLOSE)
            pieces += [(messages[int(index)]["content"], int(index)), (rest, None)]
        return pieces

    def _ids(self, pieces, messages) -> tuple[list[int], list[int]]:
        ids, mask, trained_tail = [], [], False
        for text, index in pieces:
            if index is not None:
                part = self.base.encode(text)
                trained = messages[index]["role"] == "assistant"
                ids += part
                mask += [int(trained)] * len(part)
                trained_tail = trained
                continue
            part = self.base.encode_with_specials(text) if text else []
            if trained_tail and self.end_id in part:  # the assistant's turn ends with its end-of-turn token
                cut = part.index(self.end_id) + 1
                mask += [1] * cut + [0] * (len(part) - cut)
            else:
                mask += [0] * len(part)
            ids += part
            trained_tail = False
        return ids, mask

    def render(self, messages: Sequence[dict], where: str = "the conversation") -> tuple[list[int], list[int]]:
        check_messages(messages, where)
        return self._ids(self._pieces(messages, False, where), messages)

    def prompt(self, messages: Sequence[dict], where: str = "the conversation") -> list[int]:
        check_messages(messages, where, for_reply=True)
        return self._ids(self._pieces(messages, True, where), messages)[0]

    def _end_of_turn(self) -> int:
        """The special token the template writes right after an assistant's message (ChatML's
        <|im_end|>, Llama 3's <|eot_id|>): found by rendering a probe conversation."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        pieces = self._pieces(probe, False, "the chat template")
        reply = next(k for k, (_, index) in enumerate(pieces) if index == 1)
        after = pieces[reply + 1][0] if reply + 1 < len(pieces) else ""
        for i in self.base.encode_with_specials(after) if after else []:
            if i in self.special_ids:
                return i
        eos = self.tokens["eos"]
        if eos and self.base.tok.token_to_id(eos) is not None:
            return self.base.tok.token_to_id(eos)
        raise TinyGPTError("the model's chat template writes no special token after an assistant's message (no end of turn)")


def template_of(config: dict) -> dict | None:
    """The "chat" entry of a tokenizer's dict form from its tokenizer_config.json (None when it
    has no chat template): the Jinja text and the bos/eos tokens it may refer to."""
    jinja = config.get("chat_template")
    if isinstance(jinja, list):  # several named templates: the default one
        jinja = next((t.get("template") for t in jinja if t.get("name") == "default"), None)
    if not isinstance(jinja, str) or not jinja.strip():
        return None
    token = lambda v: v.get("content") if isinstance(v, dict) else v  # noqa: E731
    return {"template": NAME, "jinja": jinja, "bos": token(config.get("bos_token")), "eos": token(config.get("eos_token"))}
