"""OpenAI-style requests in and answers out, shared by the server's API (:mod:`runtime.api`) and
the edge process's local endpoint (:mod:`runtime.edge_http`): parsing a body into a validated
request (400 naming the field), encoding its prompt (limits named), and building the response and
stream-chunk bodies OpenAI's clients expect. Schemas: :mod:`runtime.openai_schemas`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import Request as HTTPRequest  # module level: FastAPI resolves annotations by name
from pydantic import ValidationError

from runtime.openai_schemas import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
    ModelCard,
    ModelList,
    UnsupportedParameter,
    Usage,
    error_body,
    plain_chat_prompt,
)

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel

    from runtime.tokenizer import Tokenizer

MODEL_ID = "specsched"


class BadRequest(Exception):
    """A request refused before it is queued: HTTP ``status``, the field (``param``) and OpenAI's error ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def _union_member(part: str) -> bool:
    return "[" in part or part in ("str", "int", "float", "bool", "list", "dict", "none")


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """The first validation error as ``(message naming the field, the field's dotted path)``."""
    first = err.errors()[0]
    # a union's member shows in the path as its type ("prompt.str", "stop.list[str]"): the field is the rest
    loc = ".".join(str(p) for p in first.get("loc", ()) if not isinstance(p, int) and not _union_member(str(p))) or None
    if first.get("type") == "json_invalid":
        return f"request body is not valid JSON: {first.get('msg')}", None
    if first.get("type") == "model_type" and not first.get("loc"):
        return "request body must be a JSON object", None
    return (f"'{loc}': {first.get('msg')}" if loc else str(first.get("msg"))), loc


def parse_request(schema: type[BaseModel], body: bytes, served_by: str = "this server") -> BaseModel:
    """``body`` validated against ``schema`` (a request model of :mod:`runtime.openai_schemas`), or
    :class:`BadRequest`: 400 naming the field or the unsupported parameter, 404 for another model."""
    try:
        req = schema.model_validate_json(body)
        req.check_supported()
    except ValidationError as err:
        message, param = validation_message(err)
        raise BadRequest(400, message, param) from None
    except UnsupportedParameter as err:
        raise BadRequest(400, str(err), err.param, "unsupported_parameter") from None
    if req.model not in (None, MODEL_ID):
        raise BadRequest(404, f"model {req.model!r} does not exist; {served_by} serves {MODEL_ID!r}", "model", "model_not_found")
    return req


def chat_prompt(tokenizer: Tokenizer, messages: list[tuple[str, str]]) -> str:
    """The pair's chat template where its tokenizer has one, the documented plain template otherwise."""
    hf = getattr(tokenizer, "tok", None)
    if hf is not None and getattr(hf, "chat_template", None):
        return hf.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=False, add_generation_prompt=True)
    return plain_chat_prompt(messages)


def chat_messages(req: ChatCompletionRequest) -> list[tuple[str, str]]:
    """A chat request's ``(role, text)`` pairs, or :class:`BadRequest` for content parts it cannot take."""
    try:
        return [(m.role, m.text()) for m in req.messages]
    except UnsupportedParameter as err:
        raise BadRequest(400, str(err), err.param, "unsupported_parameter") from None


def encode_prompt(tokenizer: Tokenizer, text: str, param: str, max_prompt_tokens: int, limit_name: str) -> list[int]:
    """Token ids of ``text`` (the request field ``param``), or :class:`BadRequest`: not Unicode, no
    tokens, or more than ``max_prompt_tokens`` (the setting ``limit_name``)."""
    try:
        text.encode("utf-8")  # lone surrogates cannot be tokenised
    except UnicodeEncodeError:
        raise BadRequest(400, f"'{param}' is not valid Unicode text (lone surrogate)", param) from None
    ids = tokenizer.encode(text)
    if not ids:
        raise BadRequest(400, f"'{param}' encodes to no tokens", param)
    if len(ids) > max_prompt_tokens:
        raise BadRequest(400, f"'{param}' has {len(ids)} tokens; the limit is {max_prompt_tokens} ({limit_name})", param, "context_length_exceeded")
    return ids


def completion_json(chat: bool, request_id: str, text: str, finish_reason: str | None, usage: Usage, specsched: dict) -> dict:
    """A non-streamed answer's body (``usage`` always present, as OpenAI sends it)."""
    common = dict(id=request_id, model=MODEL_ID, usage=usage, specsched=specsched)
    if chat:
        body = ChatCompletionResponse(choices=[ChatChoice(message=ChatMessageOut(content=text), finish_reason=finish_reason)], **common)
    else:
        body = CompletionResponse(choices=[CompletionChoice(text=text, finish_reason=finish_reason)], **common)
    return body.model_dump(exclude_none=True) | {"usage": usage.model_dump()}


class StreamChunks:
    """Server-sent events of one streamed answer: ``chunks(text)`` is one ``data: ...`` event."""

    def __init__(self, chat: bool, request_id: str, created: int, usage: Callable[[], Usage]):
        self.chat, self.request_id, self.created, self.usage = chat, request_id, created, usage

    def __call__(self, text: str | None, finish_reason: str | None = None, specsched: dict | None = None, role: bool = False, usage_only: bool = False) -> str:
        usage = self.usage() if usage_only else None
        if self.chat:
            choices = [] if usage_only else [ChatChunkChoice(delta=ChatDelta(role="assistant" if role else None, content=text), finish_reason=finish_reason)]
            body = ChatCompletionChunk(id=self.request_id, created=self.created, model=MODEL_ID, choices=choices, usage=usage, specsched=specsched)
        else:
            choices = [] if usage_only else [CompletionChoice(text=text or "", finish_reason=finish_reason)]
            body = CompletionResponse(id=self.request_id, created=self.created, model=MODEL_ID, choices=choices, usage=usage, specsched=specsched)
        data = body.model_dump(exclude_none=True)
        for c in data["choices"]:  # OpenAI sends these keys even when null
            c.setdefault("finish_reason", None)
            c.setdefault("logprobs", None)
        return f"data: {json.dumps(data)}\n\n"


def error_response(status: int, message: str, param: str | None = None, code: str | None = None, summary: dict | None = None) -> JSONResponse:
    """OpenAI's error body (plus the ``specsched`` summary when given) as a JSON response."""
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(status, message, param, code, summary), status_code=status)


def add_openai_routes(app: FastAPI, handle: Callable, health: Callable[[], dict], created: int) -> None:
    """The routes and error handlers the server and the edge share: ``POST /v1/completions`` and
    ``/v1/chat/completions`` (``await handle(request, chat=...)``), ``GET /v1/models``, ``GET /health``
    (``health()``'s body; 503 while its ``status`` is ``closing``), and OpenAI error bodies for
    FastAPI's own HTTP and validation errors."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(HTTPException)
    async def http_error(request, exc):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return error_response(400, str(exc.errors()[0].get("msg")))

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await handle(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=MODEL_ID, created=created)]).model_dump()

    @app.get("/health")
    async def health_route():
        body = health()
        return JSONResponse(body, status_code=503 if body["status"] == "closing" else 200)
