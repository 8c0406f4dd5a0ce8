"""A job's events (gpt.serve.engine) as OpenAI's response objects: a completion or a chat
completion, whole or as a stream of server-sent events."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

from fastapi.responses import StreamingResponse

from gpt.serve.schemas import CompletionRequest, error_body


class Reply:
    """Collects a job's events into OpenAI's completion objects."""

    def __init__(self, req: CompletionRequest, model_id: str, rows: int, prompt_tokens: int):
        self.id, self.created, self.model = f"cmpl-{secrets.token_hex(12)}", int(time.time()), model_id
        self.texts, self.reasons = [""] * rows, [None] * rows
        self.prompt_tokens, self.completion_tokens = prompt_tokens, 0
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.error: str | None = None

    @property
    def finished(self) -> bool:
        return self.error is not None or all(r is not None for r in self.reasons)

    def take(self, batch: list) -> list[dict]:
        """Apply events (of one step or several); the choices they change, as a streamed chunk's
        choice entries: one per choice, with all its new text and, at its end, the reason."""
        out: dict[int, dict] = {}
        for event in batch:
            if event[0] == "error":
                self.error = event[1]
                continue
            choice = event[1]
            entry = out.setdefault(choice, {"text": "", "index": choice, "logprobs": None, "finish_reason": None})
            if event[0] == "text":
                self.texts[choice] += event[2]
                entry["text"] += event[2]
            elif event[0] == "end":
                self.reasons[choice] = entry["finish_reason"] = event[2]
                self.completion_tokens += event[3]
        return list(out.values())

    def usage(self) -> dict:
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}

    OBJECT, CHUNK = "text_completion", "text_completion"  # the objects' names, whole and streamed

    def choice(self, index: int, text: str, reason: str | None) -> dict:
        return {"text": text, "index": index, "logprobs": None, "finish_reason": reason}

    def chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        body = {"id": self.id, "object": self.CHUNK, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def body(self) -> dict:
        choices = [self.choice(i, t, r) for i, (t, r) in enumerate(zip(self.texts, self.reasons))]
        body = {"id": self.id, "object": self.OBJECT, "created": self.created, "model": self.model, "choices": choices}
        return {**body, "usage": self.usage()}


class EventStream(StreamingResponse):
    """A server-sent event stream that calls `closed` however it ends: finished, failed, or its
    client gone (Starlette then cancels it, possibly before the first event)."""

    def __init__(self, content, closed):
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.closed = closed

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.closed()


async def stream(events: asyncio.Queue, reply: Reply):
    """Server-sent events: a chunk per decoding step that made new text (token by token, as
    OpenAI streams; also under load, when steps come faster than chunks go out), the usage when
    asked for, then `data: [DONE]`."""
    while not reply.finished:
        choices = reply.take(await events.get())
        if reply.error:
            yield f"data: {json.dumps(error_body(reply.error, 'server_error'))}\n\n"
            break
        if choices:
            yield reply.chunk(choices)
    else:
        if reply.include_usage:
            yield reply.chunk([], reply.usage())
    yield "data: [DONE]\n\n"


class ChatReply(Reply):
    """The same events as chat.completion objects: a message per choice, or streamed deltas
    (the first of each choice carries its role)."""

    def __init__(self, req, model_id: str, rows: int, prompt_tokens: int):
        super().__init__(req, model_id, rows, prompt_tokens)
        self.id = f"chatcmpl-{secrets.token_hex(12)}"
        self._started: set[int] = set()

    def take(self, batch: list) -> list[dict]:
        out = []
        for entry in super().take(batch):
            delta = {"content": entry["text"]} if entry["text"] else {}
            if entry["index"] not in self._started:
                self._started.add(entry["index"])
                delta = {"role": "assistant", "content": entry["text"]}
            out.append({"index": entry["index"], "delta": delta, "logprobs": None, "finish_reason": entry["finish_reason"]})
        return out

    OBJECT, CHUNK = "chat.completion", "chat.completion.chunk"

    def choice(self, index: int, text: str, reason: str | None) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
