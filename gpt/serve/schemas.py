"""The request body of POST /v1/completions (OpenAI's completions API plus tinygpt's sampling
controls), and OpenAI's error shape. Checked here for form; the server's limits (max_tokens,
n, prompt length) are checked in app.py, which knows them, and the sampling values by
gpt.config.SamplingSettings, as for sample.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
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


class CompletionRequest(BaseModel):
    """Defaults are OpenAI's (max_tokens 16, temperature 1, no top-k); `seed` absent draws one.
    Other keys are tinygpt's controls (CONTROLS), checked by SamplingSettings."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None  # one of GET /v1/models' ids; absent: the first
    prompt: str | list[str] | list[int] | list[list[int]] = ""
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0, le=100)  # 0 = greedy
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, lt=2**63)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored
    # OpenAI's, accepted only when off
    logprobs: Any = None
    echo: Any = False
    suffix: Any = None
    best_of: Any = 1
    logit_bias: Any = None
    presence_penalty: Any = 0.0
    frequency_penalty: Any = 0.0

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])  # empty ones: SamplingSettings refuses them
        if len(stops) > 16:
            raise ValueError(f"at most 16 stop strings, got {len(stops)}")
        if any(len(s) > 256 for s in stops):  # each is matched against the text at every token
            raise ValueError("stop strings must be at most 256 characters")
        return tuple(stops)

    def unknown(self) -> str | None:
        """The first key that is neither OpenAI's nor one of tinygpt's controls."""
        return next((key for key in self.model_extra or {} if key not in CONTROLS), None)

    def controls(self) -> dict:
        """tinygpt's controls: as asked, else their defaults (CONTROLS)."""
        return {name: (self.model_extra or {}).get(name, default) for name, default in CONTROLS.items()}

    def unsupported(self) -> str | None:
        """The message for the first OpenAI parameter set to something this server cannot do."""
        for name, (off, message) in UNSUPPORTED.items():
            value = getattr(self, name)
            if value not in (off, None) and not (name == "logit_bias" and value == {}):
                return message
        return None

    def prompts(self) -> list[str | list[int]]:
        """The prompts: text, or token ids (a list of ints is one prompt)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [list(self.prompt)]
        return list(self.prompt)


def describe(error: ValidationError) -> tuple[str, str | None]:
    """One line for the first problem pydantic found, and the parameter it concerns."""
    first = error.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if not str(p).startswith(("list[", "str", "int"))]
    param = loc[0] if loc else None
    message = first.get("msg", "invalid request")
    if first.get("type") == "extra_forbidden":
        return f"unknown parameter {param!r}", param
    return (f"{'.'.join(loc)}: {message}" if loc else message), param


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
