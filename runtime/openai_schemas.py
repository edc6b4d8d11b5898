"""OpenAI-compatible request and response bodies (vLLM's server is the reference), as pydantic models.

Supported request fields: ``model``, ``prompt`` / ``messages``, ``max_tokens`` (chat:
``max_completion_tokens`` too), ``stream``, ``stream_options.include_usage``, ``temperature``
(0 = greedy, the default; up to 2), ``top_p`` (nucleus, in (0, 1]), ``seed`` (a request with a
seed is reproducible when it runs in the same mode and draft depth: :mod:`runtime.sampling`),
``stop``, ``user`` and SpecSched's ``deadline_s`` (seconds from arrival). Each request samples
with its own parameters, whatever else is in its batch. Parameters the server
does not implement (``n > 1``, ``logprobs``, ``echo``, ``suffix``, penalties, ``logit_bias``,
``best_of``, tools) get a 400 naming the parameter; any other unknown field too.

Every error has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: fields OpenAI defines that the server refuses unless they hold a neutral value (null always is):
#: each value a client may send that asks for nothing the server lacks -- clients often send the
#: defaults explicitly (``logprobs: false``, ``response_format: {"type": "text"}``, ``tool_choice: "none"``).
#: Compared type-aware: ``n: true`` is not ``n: 1``. A completion's ``logprobs: 0`` is not neutral (it
#: asks for the sampled token's log-probability).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "response_format": ({"type": "text"},), "parallel_tool_calls": (True, False),  # without tools there is nothing to call in parallel
}
#: output tokens of a request that sets no limit (OpenAI's completions default), capped at the server's limit
DEFAULT_MAX_TOKENS = 16


def _same(value: Any, neutral: Any) -> bool:
    """``value == neutral`` as JSON types: no bool/int mixing (``True == 1``), an integer field's
    neutral value is an integer (``n: 1.0`` is not ``n: 1``, as strict ``max_tokens: 1.0`` is refused),
    a number field's any number (``presence_penalty: 0`` is ``0.0``)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(neutral, int):
        return isinstance(value, int) and value == neutral
    if isinstance(neutral, float):
        return isinstance(value, int | float) and value == neutral
    if isinstance(value, dict) and isinstance(neutral, dict):
        return value.keys() == neutral.keys() and all(_same(value[k], neutral[k]) for k in value)
    return value == neutral


class UnsupportedParameter(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = Field(False, strict=True)  # "yes" is not a yes


class _Common(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")  # extras are checked by name in check_supported (a 400 naming them)

    model: str | None = None
    stream: bool = Field(False, strict=True)  # strict: "yes" or 1 is a malformed request, not a stream
    stream_options: StreamOptions | None = None
    # strict: true is not a temperature of 1 nor a 1 s deadline, "5" is not 5 (an int is still a float)
    temperature: float = Field(0.0, ge=0.0, le=2.0, allow_inf_nan=False, strict=True)
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, strict=True)
    stop: str | list[str] | None = None
    user: str | None = Field(None, max_length=256)
    deadline_s: float | None = Field(None, gt=0.0, allow_inf_nan=False, strict=True)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, list) and len(v) > 4:
            raise ValueError(f"at most 4 stop sequences, got {len(v)}")
        if (isinstance(v, list) and any(not s for s in v)) or (isinstance(v, str) and not v):
            raise ValueError("a stop sequence must not be empty")
        return v

    def limit_field(self) -> str:
        """The request field that set the output token limit (named in a refusal)."""
        return "max_tokens"

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def check_supported(self) -> None:
        """Raise :class:`UnsupportedParameter` for any field the server does not implement."""
        for name, value in (self.model_extra or {}).items():
            neutral = UNSUPPORTED.get(name)
            if value is None or (neutral is not None and any(_same(value, n) for n in neutral)):
                continue
            if neutral is not None:
                allowed = " or ".join(["null", *(repr(n) for n in neutral)])
                raise UnsupportedParameter(name, f"'{name}' = {value!r} is not supported by this server (only {allowed})")
            raise UnsupportedParameter(name, f"unknown parameter '{name}'")


class CompletionRequest(_Common):
    prompt: str | list[str]
    # strict: true is not 1 token. No lower bound here: the server's own range check answers
    # with both ends, [1, its configured limit] (runtime.api / runtime.edge_http). None: not sent
    max_tokens: int | None = Field(None, strict=True)

    def token_limit(self, server_limit: int) -> int:
        """``max_tokens`` if sent, else ``DEFAULT_MAX_TOKENS`` capped at ``server_limit`` (a limit the
        client never sent must not get its request refused)."""
        return self.max_tokens if self.max_tokens is not None else min(DEFAULT_MAX_TOKENS, server_limit)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request (a list of one string is accepted)")
            v = v[0]
        if not v:
            raise ValueError("the prompt must be a non-empty string")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: text only
            parts = []
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise UnsupportedParameter("messages", "only text content parts are supported")
                parts.append(part["text"])
            return "".join(parts)
        return self.content or ""


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, strict=True)  # range checked by the server (see CompletionRequest)
    max_completion_tokens: int | None = Field(None, strict=True)

    def token_limit(self, server_limit: int) -> int:
        """``max_completion_tokens`` if sent (it supersedes ``max_tokens``), else ``max_tokens``, else
        ``DEFAULT_MAX_TOKENS`` capped at ``server_limit``; a sent 0 stays 0 so that the range check refuses it."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens if self.max_tokens is not None else min(DEFAULT_MAX_TOKENS, server_limit)

    def limit_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


# ----------------------------------------------------------------------------------- responses


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    specsched: dict[str, Any] | None = None  #: SpecSched's extension: outcome, reason, mode, timings


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    specsched: dict[str, Any] | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    specsched: dict[str, Any] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specsched"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
    specsched: dict[str, Any] | None = None


def error_type(status: int) -> str:
    """OpenAI's error type for an HTTP status."""
    return {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
            413: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None, specsched: dict | None = None) -> dict:
    body = ErrorResponse(error=ErrorInfo(message=message, type=error_type(status), param=param, code=code or str(status)), specsched=specsched).model_dump()
    if specsched is None:
        del body["specsched"]
    return body


PLAIN_CHAT_TEMPLATE = "{role}: {content}\n"  #: pairs without a chat template: one line per message, then "assistant: "


def plain_chat_prompt(messages: list[tuple[str, str]]) -> str:
    """The documented plain template: ``role: content`` per line, then ``assistant: ``."""
    return "".join(PLAIN_CHAT_TEMPLATE.format(role=r, content=c) for r, c in messages) + "assistant: "
