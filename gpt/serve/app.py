"""The web layer: an OpenAI-compatible completions API and the playground page, over the
batching engine (gpt/serve/engine.py). No tensors here, and no file read but the page itself.

    GET  /                 the playground (gpt/serve/static/playground.html)
    GET  /health           ok, and each model's load (no API key needed)
    GET  /v1/models        the models this server was started with
    POST /v1/completions   OpenAI's completions API, streaming or not
    POST /v1/chat/completions   OpenAI's chat completions API (a model with a chat template)

Every error is OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}; a failure of
the server's own is logged there and answered with one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpt.config import SamplingSettings, ServeConfig
from gpt.errors import TinyGPTError
from gpt.generation import encode_prompt
from gpt.serve.engine import Engine, Job
from gpt.serve.replies import ChatReply, EventStream, Reply, stream
from gpt.serve.schemas import CONTROLS, ChatCompletionRequest, CompletionRequest, describe, error_body

logger = logging.getLogger("tinygpt")

RETRY_AFTER_S = 1  # what a client told to come back (503, 429) waits


@dataclass
class ServedModel:
    id: str  # what requests name it by (never a path the server opens)
    engine: Engine
    tokenizer: object
    block_size: int
    source: str  # for the server's own log
    created: int = field(default_factory=lambda: int(time.time()))


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param=None, code=None, headers=None):
        super().__init__(message)
        self.status, self.body, self.headers = status, error_body(message, kind, param, code), headers


def create_app(models: list[ServedModel], settings: ServeConfig, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving `models` (the first is the default) under `settings`' limits;
    `api_key`, when given, is required as `Authorization: Bearer <key>` on /v1/*."""
    app = FastAPI(title="tinygpt", docs_url=None, redoc_url=None, openapi_url=None)
    by_id = {m.id: m for m in models}
    streams = {"open": 0}
    _answer_errors_as_openai_does(app)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' with the key the server was started with",
                code="invalid_api_key",
            )

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(resources.files("gpt.serve").joinpath("static/playground.html").read_text(encoding="utf-8"))

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": {m.id: m.engine.load() for m in models}, "open_streams": streams["open"]}

    @app.get("/v1/models")
    async def list_models(request: Request):
        authorize(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": m.id,
                    "object": "model",
                    "created": m.created,
                    "owned_by": "tinygpt",
                    "context_length": m.block_size,
                    "chat": hasattr(m.tokenizer, "prompt"),  # has a chat template: /v1/chat/completions works
                }
                for m in models
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        req = _parse(await _json_body(request, settings.max_body_bytes))
        served = _pick_model(req, by_id, models)
        _check_limits(req, settings)
        prompts, n_prompt_tokens = _encode(req, served, settings)
        return await run(
            request, req, served, prompts, _sampling(req), Reply(req, served.id, len(prompts) * req.n, n_prompt_tokens)
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        req = _parse(await _json_body(request, settings.max_body_bytes), ChatCompletionRequest)
        served = _pick_model(req, by_id, models)
        prompt = _chat_prompt(req, served, settings)
        asked = req.max_completion_tokens or req.max_tokens
        if req.n > settings.max_n:
            raise ApiError(400, f"n = {req.n} exceeds this server's limit of {settings.max_n}", param="n")
        if asked is not None and asked > settings.max_tokens:
            raise ApiError(400, f"max_tokens {asked} exceeds this server's limit of {settings.max_tokens}", param="max_tokens")
        # Absent a max, as OpenAI's: the room left in the model's context, so that the reply never
        # slides its own prompt out of the window (at most the server's limit). A prompt that
        # leaves no room is refused, as OpenAI refuses it, rather than answered with 1 token.
        room = served.block_size - len(prompt)
        if asked is None and room < 1:
            raise ApiError(
                400,
                f"{_context(served)} and your messages resulted in {len(prompt)} tokens, leaving no room for a reply: "
                f"drop older messages, or pass max_tokens for a reply that runs past the context "
                f"(the model then sees only the last {served.block_size} tokens)",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens = asked or min(settings.max_tokens, room)
        reply = ChatReply(req, served.id, req.n, len(prompt))
        return await run(request, req, served, [prompt], _sampling(req, max_tokens), reply)

    async def run(request: Request, req, served: ServedModel, prompts: list[list[int]], sampling, reply: Reply):
        """Queue the job and answer: a stream of events, or the whole reply once done."""
        if req.stream and streams["open"] >= settings.max_streams:
            raise ApiError(
                429,
                f"{streams['open']} streams are open, this server's limit; retry shortly",
                kind="rate_limit_error",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job = Job(prompts, sampling, req.n, emit=lambda evs: loop.call_soon_threadsafe(events.put_nowait, evs))
        if not served.engine.submit(job):
            raise ApiError(
                503,
                "the server is busy (its queue is full); retry shortly",
                kind="server_overloaded",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if req.stream:
            streams["open"] += 1

            def closed() -> None:
                job.cancel()  # a no-op once finished; else the client has gone: free its rows
                streams["open"] -= 1

            return EventStream(stream(events, reply), closed)
        return await _whole(request, job, events, reply)

    return app


async def _whole(request: Request, job: Job, events: asyncio.Queue, reply: Reply):
    """The answer of a request that does not stream, once every row has ended."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job, events))
    try:
        while not reply.finished:
            batch = await events.get()
            if job.cancelled.is_set():  # nobody is waiting for the answer
                return JSONResponse(error_body("client disconnected"), status_code=499)
            reply.take(batch)
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once finished; frees the rows if this handler was cancelled
    if reply.error:
        raise ApiError(500, reply.error, kind="server_error")
    return reply.body()


def _answer_errors_as_openai_does(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours with their status, routing errors (404, 405), and a
    bug as a 500 that says nothing of the server's internals (the traceback goes to its log)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        return JSONResponse(e.body, status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), kind), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, e: Exception):
        logger.exception("unexpected error answering %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal server error; see the server's log", "server_error"), status_code=500)


async def _json_body(request: Request, limit: int):
    """The body as JSON, read up to `limit` bytes (more: 413, whatever Content-Length says).
    Only a body sent as JSON is read as JSON: one sent with no Content-Type, as text/plain or
    as curl -d's default (form-urlencoded) is a 415 that says which header to send."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()  # "; charset=..." is fine
    if media_type != "application/json":
        got = f"Content-Type {media_type!r}" if media_type else "no Content-Type"
        raise ApiError(
            415,
            f"the request body must be JSON sent with the header 'Content-Type: application/json' (this one had {got})",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, f"the request body is {int(declared)} bytes; this server takes at most {limit}", code="body_too_large"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over this server's limit of {limit} bytes", code="body_too_large")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply to be read as JSON") from None
    try:  # JSON may escape half of a surrogate pair ("\udcff"): no text a tokenizer can take
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            400, f"the request body holds {e.object[e.start]!r}, half of a surrogate pair: no text; send UTF-8 text"
        ) from None
    return data


def _parse(data, request=CompletionRequest):
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        req = request.model_validate(data)
    except ValidationError as e:
        message, param, code = describe(e, data, request)
        raise ApiError(400, message, param=param, code=code) from None
    unsupported = req.unsupported()
    if unsupported:
        raise ApiError(400, unsupported)
    return req


def _check_limits(req: CompletionRequest, settings: ServeConfig) -> None:
    rows = len(req.prompts()) * req.n
    if rows > settings.max_n:
        raise ApiError(400, f"n x prompts = {rows} exceeds this server's limit of {settings.max_n}", param="n")
    if req.max_tokens > settings.max_tokens:
        raise ApiError(
            400, f"max_tokens {req.max_tokens} exceeds this server's limit of {settings.max_tokens}", param="max_tokens"
        )


def _sampling(req, max_tokens: int | None = None) -> SamplingSettings:
    """The request's sampling settings, checked by SamplingSettings' rules as sample.py's are."""
    try:
        return SamplingSettings(
            max_new_tokens=max_tokens or req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            **req.controls(),
            stop=list(req.stop or ()),
            seed=req.seed if req.seed is not None else secrets.randbelow(2**31),
        )
    except TinyGPTError as e:  # "<control> must be ...": name it as the param
        named = str(e).split(" ", 1)[0]
        raise ApiError(400, str(e), param=named if named in (*CONTROLS, "temperature", "top_p", "stop") else None) from None


def _pick_model(req: CompletionRequest, by_id: dict, models: list[ServedModel]) -> ServedModel:
    if req.model is None:
        return models[0]
    if req.model not in by_id:
        raise ApiError(
            404,
            f"model {req.model!r} is not served here; choose one of: {', '.join(by_id)} (GET /v1/models)",
            param="model",
            code="model_not_found",
        )
    return by_id[req.model]


def _encode(req: CompletionRequest, served: ServedModel, settings: ServeConfig) -> tuple[list[list[int]], int]:
    """Each prompt's tokens, within the limits; a prompt longer than the context keeps its last
    block_size tokens, as sample.py does (only when max_prompt_tokens allows it)."""
    limit = settings.max_prompt_tokens or served.block_size
    vocab = served.tokenizer.vocab_size
    prompts = req.prompts()
    if not prompts:
        raise ApiError(400, "prompt is an empty list; give at least one prompt", param="prompt")
    encoded, total = [], 0
    for p in prompts:
        if isinstance(p, str):
            try:
                ids = encode_prompt(served.tokenizer, p, None)
            except TinyGPTError as e:
                raise ApiError(400, str(e), param="prompt") from None
        else:
            ids = list(p) or encode_prompt(served.tokenizer, "", None)
            if any(not 0 <= t < vocab for t in ids):
                raise ApiError(400, f"prompt token ids must be in 0..{vocab - 1} (this model's vocabulary)", param="prompt")
        if len(ids) > limit:
            which = "your prompt" if len(prompts) == 1 else f"prompt {len(encoded) + 1} of {len(prompts)}"
            raise ApiError(
                400,
                f"{_too_long(served, settings, which, len(ids))}: shorten it",
                param="prompt",
                code="context_length_exceeded",
            )
        total += len(ids)
        encoded.append(ids[-served.block_size :])
    return encoded, total


def _chat_prompt(req: ChatCompletionRequest, served: ServedModel, settings: ServeConfig) -> list[int]:
    """The chat template's prompt for the request's messages: the ids `tinygpt chat` gives the
    same conversation (gpt.chat.template), within the server's prompt limit."""
    tokenizer = served.tokenizer
    if not hasattr(tokenizer, "prompt"):
        raise ApiError(
            400,
            f"model {served.id!r} has no chat template (it was trained on plain text): use /v1/completions, or finetune it "
            f"on conversations (tinygpt train experiment=sft init_from=<run> ...)",
            param="model",
            code="no_chat_template",
        )
    try:
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        ids = tokenizer.prompt(messages, "messages")
    except (TinyGPTError, ValueError) as e:
        raise ApiError(400, str(e), param="messages") from None
    if len(ids) > (settings.max_prompt_tokens or served.block_size):
        raise ApiError(
            400,
            f"{_too_long(served, settings, 'your messages', len(ids))}: drop older messages",
            param="messages",
            code="context_length_exceeded",
        )
    return ids


def _context(served: ServedModel) -> str:
    return f"this model's maximum context length is {served.block_size} tokens"


def _too_long(served: ServedModel, settings: ServeConfig, what: str, n: int) -> str:
    """What a prompt of n tokens over the server's prompt limit is told (OpenAI's wording, and the
    server's own limit where max_prompt_tokens sets one other than the model's context)."""
    if settings.max_prompt_tokens is None:
        return f"{_context(served)}, but {what} resulted in {n} tokens"
    return f"{what} resulted in {n} tokens; this server takes at most {settings.max_prompt_tokens} (max_prompt_tokens; {_context(served)})"


async def _cancel_on_disconnect(request: Request, job: Job, events: asyncio.Queue) -> None:
    """Once the body is read, the next ASGI message is the client's disconnect: the job is then
    cancelled (its rows leave the batch) and the waiting handler woken."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()
    events.put_nowait([])
