"""The edge process's local OpenAI endpoint: ``python -m runtime.edge --server ADDR --listen HOST:PORT``.

The users of this edge send their requests here, not to the server: ``POST /v1/completions`` and
``POST /v1/chat/completions`` (streaming and not; the live server's schemas,
:mod:`runtime.openai_schemas`, and its chat template, :func:`runtime.openai_requests.chat_prompt`),
``GET /v1/models`` and ``GET /health``. Each request is handed to one of the ``--clients`` edge
clients (:mod:`runtime.edge_pool`): a free one, or the bounded queue (``--http-queue``) -- when
that is full it gets 429 at once, while shutting down 503. The client drafts it here and has it
verified over its own gRPC stream, and the answer is the verified output.

Answers: 200 with the text (``finish_reason`` ``stop`` at a stop sequence or end of sequence,
``length`` otherwise; ``usage`` always, in the last stream chunk when
``stream_options.include_usage``); 502 (``verification_server_error``) when the verification
server is gone or unreachable, 504 (``verification_timeout``) when no verdict came within
``--reply-timeout-s``; a stream always ends with its outcome in the final chunk (``finish_reason``
``error`` / ``timeout`` there). Every answer carries the ``specsched`` summary (outcome, client,
depth, accepted drafts, queue wait, latency). A malformed request gets 400 naming the field, as on
the server; ``top_p`` other than 1 is refused (the edge drafts with temperature only) and
``deadline_s`` is accepted and ignored (no planner here: the request runs as soon as a client is
free). Bodies are limited as on the server (:class:`runtime.api.BodyLimits`: 413 / 408), and so are headers
(:mod:`runtime.header_timeout`: a connection without complete request headers after 10 s is closed).
Requests still queued when the edge stops get 503 (``shutting_down``). ``/health`` says ``ok``,
``closing``, or ``server_unreachable`` (the last connection to the verification server failed).
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import socket
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import Request as HTTPRequest  # module level: FastAPI resolves annotations by name

from runtime.api import BodyLimits
from runtime.edge_pool import FINISHED, EdgeJob, EdgePool, Refused
from runtime.header_timeout import header_timeout_protocol
from runtime.metrics import ServeMetrics
from runtime.openai_requests import (
    BadRequest,
    StreamChunks,
    add_openai_routes,
    chat_messages,
    chat_prompt,
    completion_json,
    encode_prompt,
    error_response,
    parse_request,
)
from runtime.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Usage,
)
from runtime.serve_config import ServeConfig
from runtime.textstream import TextStream

if TYPE_CHECKING:
    from pydantic import BaseModel

    from runtime.tokenizer import Tokenizer

#: HTTP status and error code of a job that did not finish
FAILED = {"error": (502, "verification_server_error"), "timeout": (504, "verification_timeout"), "cancelled": (499, "client_closed_request"),
          "shutdown": (503, "shutting_down")}


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) -> (host, port); port 0 picks a free one."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT with PORT in [0, 65535], got {value!r}")
    return host, int(port)


class EdgeHTTP:
    """The ASGI app: FastAPI routes inside the live server's body limits, over an :class:`EdgePool`."""

    def __init__(self, pool: EdgePool, tokenizer, server: str, max_tokens_limit: int = 512, max_prompt_tokens: int = 2048):
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, StreamingResponse

        self.pool, self.tokenizer, self.server = pool, tokenizer, server
        self.max_tokens_limit, self.max_prompt_tokens = max_tokens_limit, max_prompt_tokens
        self.metrics = ServeMetrics()  # BodyLimits counts every response by status here
        created = int(time.time())
        app = FastAPI(title="SpecSched edge")

        async def handle(request: HTTPRequest, chat: bool):
            try:
                req = self.parse(ChatCompletionRequest if chat else CompletionRequest, await request.body())
                if chat:
                    ids, limit = self.encode(chat_prompt(tokenizer, chat_messages(req)), "messages"), req.token_limit(max_tokens_limit)
                else:
                    ids, limit = self.encode(req.prompt, "prompt"), req.token_limit(max_tokens_limit)
                if not 1 <= limit <= max_tokens_limit:
                    field = req.limit_field()
                    raise BadRequest(400, f"'{field}' must be an integer in [1, {max_tokens_limit}], got {limit} (--http-max-tokens)", field)
                loop = asyncio.get_running_loop()
                job = EdgeJob(f"cmpl-{uuid.uuid4().hex[:16]}", ids, limit, req.temperature, req.seed if req.seed is not None else secrets.randbits(63),
                              TextStream(tokenizer.decode, req.stop_list()), loop, stream=req.stream, pieces=asyncio.Queue() if req.stream else None)
                pool.submit(job)
            except BadRequest as err:
                return error_response(err.status, str(err), err.param, err.code)
            except Refused as err:
                return error_response(err.status, str(err), code=err.code)

            def usage() -> Usage:
                n = job.text.tokens
                return Usage(prompt_tokens=len(ids), completion_tokens=n, total_tokens=len(ids) + n)

            if not req.stream:
                if not await self._wait(job, request):
                    return error_response(499, "the client closed the request", code="client_closed_request")
                outcome = job.outcome.outcome
                if outcome not in FINISHED:
                    status, code = FAILED.get(outcome, (500, "internal_error"))
                    return error_response(status, f"{outcome}: {job.outcome.error or 'no reason given'}", code=code, summary=job.summary())
                return JSONResponse(completion_json(chat, job.id, job.text.text, job.finish_reason, usage(), job.summary()))
            started = int(time.time())
            include_usage = bool(req.stream_options and req.stream_options.include_usage)

            chunk = StreamChunks(chat, job.id, started, usage)

            async def events():
                try:
                    if chat:
                        yield chunk("", role=True)
                    while (piece := await job.pieces.get()) is not None:
                        yield chunk(piece)
                    await job.done.wait()
                    yield chunk(None if chat else "", job.finish_reason, job.summary()) + (chunk(None, usage_only=True) if include_usage else "") + "data: [DONE]\n\n"
                finally:  # the client went away mid-stream (the generator is closed): free its edge client
                    if not job.done.is_set():
                        job.cancelled.set()

            return StreamingResponse(events(), media_type="text/event-stream")

        add_openai_routes(app, handle, lambda: {**pool.health(), "server": server}, created)

        self.fastapi = app
        self.asgi = BodyLimits(app, ServeConfig(), self.metrics)

    async def __call__(self, scope, receive, send):
        await self.asgi(scope, receive, send)

    @staticmethod
    def parse(schema: type[BaseModel], body: bytes) -> BaseModel:
        """A validated request, or :class:`BadRequest` naming the field (the server's messages)."""
        req = parse_request(schema, body, served_by="this edge")
        if req.top_p != 1.0:
            raise BadRequest(400, f"'top_p' = {req.top_p} is not supported by the edge process (only 1.0: it drafts and verifies with temperature alone)",
                             "top_p", "unsupported_parameter")
        return req

    def encode(self, text: str, param: str) -> list[int]:
        return encode_prompt(self.tokenizer, text, param, self.max_prompt_tokens, "--http-max-prompt-tokens")

    async def _wait(self, job: EdgeJob, request: HTTPRequest, poll_s: float = 0.25) -> bool:
        """Wait for a non-streamed job's outcome; False when its client disconnected first (the
        job is cancelled: its edge client is freed at its next iteration)."""
        while not job.done.is_set():
            try:
                await asyncio.wait_for(job.done.wait(), poll_s)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancelled.set()
                    return False
        return True


def serve(listen: str, pool: EdgePool, tokenizer: Tokenizer, server: str, max_tokens_limit: int, max_prompt_tokens: int,
          on_listening: Callable[[str], None] = lambda url: print(f"listening on {url}", flush=True), close_timeout_s: float = 30.0,
          header_timeout_s: float = ServeConfig.header_timeout_s) -> EdgePool:
    """Serve the endpoint until SIGINT / SIGTERM, then close the pool (waiting jobs end with
    ``error``, running ones finish); returns the pool (its ``finished`` list holds every outcome)."""
    import uvicorn

    host, port = parse_listen(listen)
    sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    bound = sock.getsockname()[1]
    app = EdgeHTTP(pool, tokenizer, server, max_tokens_limit, max_prompt_tokens)
    # a connection that never completes its request headers is closed, as on the live server
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=close_timeout_s, timeout_keep_alive=5,
                            http=header_timeout_protocol(header_timeout_s))
    on_listening(f"http://{host if ':' not in host else f'[{host}]'}:{bound}")  # the socket listens already: connections wait in its backlog

    class EdgeServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # uvicorn would re-raise the signal once it has stopped, ending the process before the
            # pool is closed and the reports written; a second SIGINT still forces the exit
            self.force_exit = self.should_exit and sig == signal.SIGINT
            self.should_exit = True

        async def shutdown(self, sockets=None) -> None:
            pool.refuse()  # first: queued requests get their error answer before uvicorn waits for connections
            await super().shutdown(sockets)

    try:
        EdgeServer(config).run(sockets=[sock])
    finally:
        pool.close(close_timeout_s)
        sock.close()
    return pool
