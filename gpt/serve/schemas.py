"""The request bodies of POST /v1/completions and /v1/chat/completions (OpenAI's APIs plus
tinygpt's sampling controls), and OpenAI's error shape. Checked here for form; the server's limits (max_tokens,
n, prompt length) are checked in app.py, which knows them, and the sampling values by
gpt.config.SamplingSettings, as for sample.py."""

from __future__ import annotations

import json
import types
import typing

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from gpt.config import SamplingSettings

# OpenAI parameters this server accepts only at their "off" value, with what to use instead.
UNSUPPORTED = {
    "logprobs": (None, "logprobs are not supported"),
    "echo": (False, "echo is not supported; prepend the prompt yourself"),
    "suffix": (None, "suffix (insertion) is not supported"),
    "best_of": (1, "best_of is not supported; use n"),
    "logit_bias": (None, "logit_bias is not supported"),
    "presence_penalty": (0.0, "presence_penalty is not supported; use repetition_penalty"),
    "frequency_penalty": (0.0, "frequency_penalty is not supported; use repetition_penalty"),
}

# Every value is taken only as the JSON type it should be (OpenAI refuses the others too):
# "yes" is no boolean, true and 5.0 are no integers (a fraction or an exponent makes a JSON
# number a decimal one), "0.5" is no number. An integer is a number: JSON has one number type,
# and temperature 1 is 1.0.
STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


class StreamOptions(BaseModel):
    model_config = STRICT  # a nested model is only as strict as its own config
    include_usage: bool = False


# Where OpenAI's behaviour differs from sample.py's defaults: it filters nothing unless asked.
API_DEFAULTS = {"top_k": None}
# tinygpt's own controls beside OpenAI's temperature and top_p, with their defaults (the openai
# client sends them with extra_body={...}): every control of SamplingSettings, so a new one is
# served as it lands there.
CONTROLS = {
    name: API_DEFAULTS.get(name, default)
    for name, default in SamplingSettings().controls().items()
    if name not in ("temperature", "top_p")
}
# The same controls as request fields typed as SamplingSettings types them, so that a new one is
# as strictly typed as the rest with no change here (its ranges stay SamplingSettings' to check).
_TYPES = typing.get_type_hints(SamplingSettings)
_Controls = create_model("_Controls", __config__=STRICT, **{n: (_TYPES[n], d) for n, d in CONTROLS.items()})


class _Request(_Controls):
    """What both endpoints take: the model, OpenAI's sampling parameters (its defaults:
    temperature 1, no top-k; `seed` absent draws one), streaming, and tinygpt's controls (the
    fields of _Controls, CONTROLS); any other key is refused."""

    model_config = STRICT

    model: str | None = None  # one of GET /v1/models' ids; absent: the first
    temperature: float = Field(1.0, ge=0, le=100)  # 0 = greedy
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    # OpenAI's, accepted only when off (null counts as off)
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])  # empty ones: SamplingSettings refuses them
        if len(stops) > 16:
            raise ValueError(f"at most 16 stop strings, got {len(stops)}")
        if any(len(s) > 256 for s in stops):  # each is matched against the text at every token
            raise ValueError("stop strings must be at most 256 characters")
        return tuple(stops)

    def controls(self) -> dict:
        """tinygpt's controls: as asked, else their defaults (CONTROLS)."""
        return {name: getattr(self, name) for name in CONTROLS}


class CompletionRequest(_Request):
    """POST /v1/completions: a prompt; max_tokens defaults to OpenAI's 16."""

    prompt: str | list[str] | list[int] | list[list[int]] = ""
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = 1

    def unsupported(self) -> str | None:
        """The message for the first OpenAI parameter set to something this server cannot do."""
        return _first_unsupported(self, UNSUPPORTED)

    def prompts(self) -> list[str | list[int]]:
        """The prompts: text, or token ids (a list of ints is one prompt)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [list(self.prompt)]
        return list(self.prompt)


def _first_unsupported(request, names) -> str | None:
    """UNSUPPORTED's message for the first of `names` that `request` sets to something but off."""
    for name in names:
        off, message = UNSUPPORTED[name]
        value = getattr(request, name)
        if value not in (off, None) and not (name == "logit_bias" and value == {}):
            return message
    return None


class ChatMessage(BaseModel):
    model_config = STRICT
    role: str
    # text, or OpenAI's content parts ([{"type": "text", "text": ...}]) joined
    content: str | list[dict]
    name: str | None = None  # accepted and ignored

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in self.content):
            raise ValueError("only text content parts are supported ({'type': 'text', 'text': ...})")
        return "".join(part["text"] for part in self.content)


class ChatCompletionRequest(_Request):
    """POST /v1/chat/completions: `messages` instead of `prompt`; the reply ends at the chat
    template's end of turn, or at max_tokens (or max_completion_tokens). Absent both, as OpenAI's:
    the room left in the model's context (block_size minus the prompt's tokens), at most the
    server's limit (serve's max_tokens); messages that leave no room are refused (app.py)."""

    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool | None = False

    def unsupported(self) -> str | None:
        if self.logprobs:
            return "logprobs are not supported"
        return _first_unsupported(self, ("logit_bias", "presence_penalty", "frequency_penalty"))


def describe(error: ValidationError, data: dict, request=CompletionRequest) -> tuple[str, str | None, str | None]:
    """One line for the first problem pydantic found in request `data` (a body of the
    `request` model), the parameter it concerns (dotted when nested: stream_options.include_usage)
    and OpenAI's code for it."""
    first = error.errors()[0]
    if first["type"] == "extra_forbidden":
        param = ".".join(str(p) for p in first["loc"])
        return f"unknown parameter {param!r}", param, None
    path, hint = _field_at(first["loc"], request)
    param = ".".join(path) or None
    if first["type"].endswith("_type") and hint is not None:  # int_type, bool_type, model_type, ...
        value = _value_at(data, path)
        shown = json.dumps(value, ensure_ascii=False)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        if isinstance(value, int) and not isinstance(value, bool) and float in _kinds(hint):
            return f"{param} is too large for a number, got {shown}", param, "invalid_type"
        return f"{param} must be {_expected(hint)}, got {shown}", param, "invalid_type"
    return (f"{param}: {first['msg']}" if param else first["msg"]), param, None


def _field_at(loc: tuple, request=CompletionRequest) -> tuple[list[str], object]:
    """The request fields that pydantic's error location `loc` passes through, and the type of
    the last; the rest of it (a union's branch, a list index) is inside that field's value."""
    path, model, hint = [], request, None
    for part in loc:
        if model is None or part not in model.model_fields:
            break
        path.append(part)
        hint = model.model_fields[part].annotation
        model = next((t for t in _kinds(hint) if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return path, hint


def _value_at(data: dict, path: list[str]):
    for name in path:
        data = data[name]
    return data


def _kinds(hint) -> tuple:
    """The types a union allows (`int | None` -> int, NoneType); any other type alone."""
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", type(None): "null"}


def _expected(hint) -> str:
    """What a value of type `hint` is called in JSON: 'an integer or null', 'a list of strings'."""
    kinds = _kinds(hint)
    if len(kinds) > 1:
        names = [_expected(k) for k in kinds]
        return ", ".join(names[:-1]) + " or " + names[-1]
    if typing.get_origin(hint) is list:
        return f"a list of {_plural(typing.get_args(hint)[0])}"
    if typing.get_origin(hint) is dict:  # JSON's keys are strings: say what the values are
        return f"an object of {_plural(typing.get_args(hint)[1])}"
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return "an object"
    return _NAMES.get(hint, "another type")


def _plural(hint) -> str:
    """'integers', 'lists of integers': many values of type `hint`."""
    head, _, rest = _expected(hint).split(" ", 1)[1].partition(" ")  # "a list of x" -> "list", "of x"
    return f"{head}s {rest}".rstrip()


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
