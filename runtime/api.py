"""The HTTP surface: OpenAI-compatible completions and chat completions, models, health, metrics.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming and not; schemas in
:mod:`runtime.openai_schemas`), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus text), ``GET /stats`` (JSON). A served or late request gets 200 (``finish_reason``
``stop`` at a stop sequence or end of sequence, ``length`` otherwise; ``usage`` always, and in
the last stream chunk when ``stream_options.include_usage``); a rejected one gets 429 and one whose
round failed 500, both with OpenAI's error body plus the ``specsched`` summary; a stream always
ends with its outcome in the final chunk. 503 while shutting down or when the queue is full.

Limits (:class:`BodyLimits`, outermost, so every response is counted by status): a body over
``max_body_bytes`` gets 413 before it is read whole (from ``Content-Length``, or as soon as a
chunked body passes the limit); a body not complete after ``body_timeout_s`` gets 408; a
connection without complete headers after ``header_timeout_s`` is closed.

A request's deadline counts from its arrival at the app, or from the client's send stamp where the
client gives one (``X-Request-Start: t=<µs since the epoch>``; :mod:`runtime.admission`), and the
delay from each rejection's decision to its answer being written is fed back to the queue, which
decides that much earlier.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import Request as HTTPRequest  # module level: FastAPI resolves annotations by name

from runtime.admission import SENT_HEADER, AnswerMargin, client_sent_lead_s
from runtime.live_request import LiveRequest
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
    error_body,
)
from runtime.pair import ModelPair
from runtime.rounds import Refused, RoundServer
from runtime.serve_config import ServeConfig
from runtime.textstream import TextStream

ARRIVAL_KEY = "specsched.arrival"  #: ASGI scope key: monotonic time the request was sent (its stamp) or reached the app (before its body was read)
SENT_LEAD_KEY = "specsched.sent_lead"  #: ASGI scope key: seconds from the client's send stamp to the app (0 without a stamp)
LIVE_KEY = "specsched.live"  #: ASGI scope key: the request's LiveRequest, once queued (its answer's delay is measured)


async def _send_json(send, status: int, body: dict, close: bool = False) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class BodyLimits:
    """ASGI middleware: body size and read-time limits, every response counted by status."""

    def __init__(self, app, cfg: ServeConfig, metrics: ServeMetrics, margin: AnswerMargin | None = None, direct: dict | None = None):
        self.app, self.cfg, self.metrics, self.margin = app, cfg, metrics, margin
        self.direct = direct or {}  #: POST path -> ASGI app that bypasses the framework's routing (see ServeApp)

    def answered(self, live: LiveRequest) -> None:
        """A request's answer is out (its last byte handed to the transport): a rejection's delay
        since its decision teaches the queue how early to decide (:mod:`runtime.admission`)."""
        if self.margin is not None and live.outcome == "rejected" and live.completed_at is not None:
            self.margin.observe(time.monotonic() - live.completed_at)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(msg):
            if msg["type"] == "http.response.start":
                self.metrics.status(msg["status"])
            await send(msg)
            if msg["type"] == "http.response.body" and not msg.get("more_body", False) and (live := scope.get(LIVE_KEY)) is not None:
                self.answered(live)

        limit = self.cfg.max_body_bytes
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await _send_json(counted, 413, error_body(413, f"request body over the limit of {limit} bytes (max_body_bytes)", code="body_too_large"), close=True)
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, counted)
        # the request's arrival: its deadline counts from here, so time it spends queued inside this
        # process (a busy event loop under a burst) is seen by the admission check, not only by the client
        # counted from the client's send stamp where it gives one (X-Request-Start): the time its
        # request waited in the kernel's and uvicorn's queues is part of its deadline too
        lead = client_sent_lead_s(headers.get(SENT_HEADER), time.time())
        scope[ARRIVAL_KEY] = time.monotonic() - lead
        scope[SENT_LEAD_KEY] = lead
        # read the body here, bounded in size and time, then hand it to the app in one piece
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.cfg.body_timeout_s):  # one timer for the whole body (not a task per read)
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        return
                    size += len(msg.get("body", b""))
                    if size > limit:
                        break
                    chunks.append(msg.get("body", b""))
                    if not msg.get("more_body", False):
                        break
        except TimeoutError:
            return await _send_json(counted, 408, error_body(408, f"request body not complete within body_timeout_s={self.cfg.body_timeout_s}", code="body_timeout"), close=True)
        except asyncio.CancelledError:
            # uvicorn cancels a request still sending its body when the shutdown grace ends: answer it
            # as the queued ones are (503 shutting_down), not with uvicorn's plain-text 500 and an
            # error log. The task ends here, which is what the cancellation asked for.
            return await _send_json(counted, 503, error_body(503, "the server is shutting down; the request body was not complete", code="shutting_down"), close=True)
        if size > limit:
            return await _send_json(counted, 413, error_body(413, f"request body over the limit of {limit} bytes (max_body_bytes)", code="body_too_large"), close=True)
        body, given = b"".join(chunks), False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the client's disconnect, if any

        await self.direct.get(scope.get("path"), self.app)(scope, replay, counted)


class ServeApp:
    """The ASGI app (limits around FastAPI) and the round server behind it."""

    def __init__(self, cfg: ServeConfig, pair: ModelPair):
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, Response, StreamingResponse

        self.cfg, self.pair = cfg, pair
        self.metrics = ServeMetrics()
        rounds_class = RoundServer
        if getattr(cfg, "placement", "local") == "split":  # ED users over gRPC beside the HTTP ones
            from runtime.split_rounds import SplitRoundServer as rounds_class
        self.rounds = rounds_class(cfg, pair, self.metrics)
        rounds, tokenizer = self.rounds, pair.tokenizer
        created = int(time.time())

        @asynccontextmanager
        async def lifespan(app):
            task = asyncio.create_task(rounds.run())
            yield
            await rounds.shutdown()
            task.cancel()

        app = FastAPI(title="SpecSched", lifespan=lifespan)

        @app.exception_handler(Exception)
        async def crash(request, exc):
            return error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")

        def encode(text: str, param: str) -> list[int]:
            return encode_prompt(tokenizer, text, param, cfg.max_prompt_tokens, "max_prompt_tokens")

        def admit(req, ids: list[int], max_tokens: int, scope: dict) -> LiveRequest:
            if not 1 <= max_tokens <= cfg.max_tokens_limit:
                field = req.limit_field()
                raise BadRequest(400, f"'{field}' must be an integer in [1, {cfg.max_tokens_limit}], got {max_tokens}", field)
            live = LiveRequest(id=f"cmpl-{uuid.uuid4().hex[:16]}", prompt_ids=ids, max_tokens=max_tokens, arrival=scope.get(ARRIVAL_KEY) or time.monotonic(),
                               sent_lead_s=scope.get(SENT_LEAD_KEY, 0.0),
                               deadline_s=float(req.deadline_s if req.deadline_s is not None else cfg.default_deadline_s),
                               text=TextStream(tokenizer.decode, req.stop_list()), stream=req.stream, queue=asyncio.Queue() if req.stream else None,
                               temperature=req.temperature, top_p=req.top_p, seed=req.seed if req.seed is not None else secrets.randbits(63))
            scope[LIVE_KEY] = live  # its answer's delay is measured when the response is out (BodyLimits)
            rounds.submit(live)
            return live

        async def handle(request: HTTPRequest, chat: bool):
            try:
                body = await request.body()
                if chat:
                    req = parse_request(ChatCompletionRequest, body)
                    ids = encode(chat_prompt(tokenizer, chat_messages(req)), "messages")
                    live = admit(req, ids, req.token_limit(cfg.max_tokens_limit), request.scope)
                else:
                    req = parse_request(CompletionRequest, body)
                    live = admit(req, encode(req.prompt, "prompt"), req.token_limit(cfg.max_tokens_limit), request.scope)
            except BadRequest as err:
                return error_response(err.status, str(err), err.param, err.code)
            except Refused as err:
                return error_response(err.status, str(err), code="overloaded" if "queue" in str(err) else "shutting_down")

            def usage() -> Usage:
                return Usage(prompt_tokens=len(live.prompt_ids), completion_tokens=live.completion_tokens, total_tokens=len(live.prompt_ids) + live.completion_tokens)

            def finish() -> str | None:
                return live.finish_reason if live.outcome in ("served", "late") else live.outcome

            if not req.stream:
                await live.done.wait()
                if live.outcome == "rejected":
                    return error_response(429, f"rejected: {live.reason}", code="rejected", summary=live.summary())
                if live.outcome == "error":
                    return error_response(500, live.reason, code="engine_fault" if live.reason.startswith("engine") else "shutdown", summary=live.summary())
                return JSONResponse(completion_json(chat, live.id, live.text.text, finish(), usage(), live.summary()))
            started = int(time.time())
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            chunk = StreamChunks(chat, live.id, started, usage)

            def tail() -> str:
                """The last events in one piece (one write): outcome, usage if asked, [DONE]."""
                return chunk(None if chat else "", finish(), live.summary()) + (chunk(None, usage_only=True) if include_usage else "") + "data: [DONE]\n\n"

            await asyncio.sleep(0)  # one turn of the loop: the queue checks every request that arrived in this one (RoundServer.submit)
            if live.done.is_set():  # answered already (rejected on arrival): the whole stream in one response, no chunking
                return Response((chunk("", role=True) if chat else "") + tail(), media_type="text/event-stream")

            async def events():
                if chat:
                    yield chunk("", role=True)
                while True:
                    piece = await live.queue.get()
                    if piece is None:
                        break
                    yield chunk(piece)
                await live.done.wait()
                yield tail()

            return StreamingResponse(events(), media_type="text/event-stream")

        add_openai_routes(app, handle, rounds.health, created)

        @app.get("/metrics")
        async def metrics():
            from prometheus_client import CONTENT_TYPE_LATEST

            return Response(self.metrics.prometheus(), media_type=CONTENT_TYPE_LATEST)

        @app.get("/stats")
        async def stats():
            return {**self.metrics.snapshot(), "queued": len(rounds.pending), "alpha_estimate": rounds.alpha,
                    "calibration": dict(rounds.calibration.factor), "scheduler": cfg.scheduler}

        def direct(chat: bool):
            """The completion endpoints without FastAPI's routing, middleware and dependency
            machinery: they take the raw request and handle their own errors, and that machinery is
            about half of the app's CPU time per request -- under a burst, time every queued
            request waits before the server sees it. Same responses as the routes above."""

            async def endpoint(scope, receive, send):
                try:
                    response = await handle(HTTPRequest(scope, receive, send), chat=chat)
                except Exception as exc:  # noqa: BLE001 - as the app's crash handler
                    response = error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")
                await response(scope, receive, send)

            return endpoint

        self.fastapi = app
        self.asgi = BodyLimits(app, cfg, self.metrics, rounds.answer_margin, direct={"/v1/completions": direct(False), "/v1/chat/completions": direct(True)})

    async def __call__(self, scope, receive, send):
        await self.asgi(scope, receive, send)


def create_app(cfg: ServeConfig, pair: ModelPair | None = None) -> ServeApp:
    """The ASGI app; the whole config is validated first, then the pair is loaded (unless given)."""
    cfg.validate()
    if pair is None:
        from runtime.pair import build_pair, load_pair

        device = cfg.devices[1] if cfg.devices else cfg.device
        if cfg.target:
            pair = load_pair(cfg.target, cfg.draft, device=device, dtype=cfg.dtype)
        else:
            pair = load_pair(cfg.pair or build_pair(recipe=cfg.pair_preset), device=device, dtype=cfg.dtype)
    return ServeApp(cfg, pair)
