"""The placement stream of ``runtime.serve placement=split``: one edge request's exchange with the
server over gRPC (:mod:`runtime.split_placement` is the edge's side and the wire messages).

:class:`PlacementService` serves the ``Place`` method for a :class:`runtime.split_rounds.SplitRoundServer`
(``server``): it checks the request (INVALID_ARGUMENT naming the field), hands it to the server's
event loop to queue (bounded by ``SUBMIT_TIMEOUT_S``), waits for the round's decision, and for an
ED request the edge's report; it ends the request with the server's one outcome (``server.finish``,
on the event loop) and answers the ``result``. Every wait is bounded -- the first message by
``server.first_message_s``, everything after by the request's deadline + ``server.report_grace_s``
-- as the server's docstring sets out (**Faults on the placement stream**). Separate from the
rounds (planning, sharing the device, counting outcomes) as :class:`runtime.split.grpc_server.VerifierService`
is from the batcher.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from runtime.live_request import LiveRequest
from runtime.rounds import Refused
from runtime.split.rtt_estimate import MAX_RTT_S
from runtime.split_placement import PlacementMsg, PlaceMsg
from runtime.textstream import TextStream

if TYPE_CHECKING:
    from google.protobuf.message import Message

REPORT_GRACE_S = 5.0  #: how long after its deadline a placement stream waits for its request's end (an ED report), s
FIRST_MESSAGE_S = 30.0  #: how long a new placement stream waits for its request message, s
SUBMIT_TIMEOUT_S = 10.0  #: how long a placement stream waits for the event loop to queue its request, s


@dataclass(eq=False)
class EdgeRequest(LiveRequest):
    """A request of an edge user (it can draft on its edge: ED)."""

    rtt_s: float = 0.0  #: the edge's round trip to this server, s
    ed_depth: int = 0  #: the plan's ED depth (mode ``ed``)
    ed_alone_s: float | None = None  #: the profile's time for it alone in ED at its best depth (set by the queue)
    client_id: str = ""  #: the edge's own name for the request (``id`` is the server's, unique)
    placed: threading.Event = field(default_factory=threading.Event)  #: planned as ED, or ended
    ended: threading.Event = field(default_factory=threading.Event)  #: has its outcome


class PlacementHost(Protocol):
    """What the placement stream needs of its server (:class:`runtime.split_rounds.SplitRoundServer`)."""

    cfg: Any  #: the ServeConfig (``max_prompt_tokens``, ``max_tokens_limit``)
    batcher: Any  #: the VerificationBatcher (its verifier's ``vocab_size``)
    pair: Any  #: the ModelPair (its tokenizer)
    loop: asyncio.AbstractEventLoop | None  #: the server's event loop, once it runs
    first_message_s: float  #: how long a new stream waits for its request, s
    report_grace_s: float  #: how long after its deadline a request waits for its end, s

    def submit(self, req: LiveRequest) -> None: ...

    def finish(self, req: LiveRequest, outcome: str, reason: str = "") -> None: ...


class PlacementService:
    """The ``Place`` method: one edge request per bidirectional stream (a gRPC worker thread each)."""

    def __init__(self, server: PlacementHost):
        self.server = server

    async def _queue(self, req: EdgeRequest) -> None:
        # a hand-off that timed out has ended its request (``place``), possibly before this runs:
        # an ended request must not be queued, or a round would plan it with no stream to answer on
        if req.outcome is None:
            self.server.submit(req)

    def end_soon(self, req: EdgeRequest, outcome: str, reason: str) -> None:
        """End ``req`` from a gRPC thread (the event loop sets the outcome; once it has stopped, shutdown did)."""
        try:
            self.server.loop.call_soon_threadsafe(self.server.finish, req, outcome, reason)
        except RuntimeError:  # the loop is closed: the server has shut down and ended every request
            pass

    def end(self, req: EdgeRequest, outcome: str, reason: str = "") -> None:
        """End ``req`` from a gRPC thread and wait until the event loop has."""
        self.end_soon(req, outcome, reason)
        req.ended.wait(10.0)

    def validate(self, msg: Message) -> str | None:
        """Why a placement request is refused (INVALID_ARGUMENT), naming the field; None if valid."""
        cfg, vocab = self.server.cfg, self.server.batcher.verifier.vocab_size
        if not msg.prompt or len(msg.prompt) > cfg.max_prompt_tokens:
            return f"prompt must hold 1..{cfg.max_prompt_tokens} token ids, got {len(msg.prompt)}"
        if any(not 0 <= t < vocab for t in msg.prompt):
            return f"prompt token ids must lie in [0, {vocab})"
        if not 1 <= msg.max_tokens <= cfg.max_tokens_limit:
            return f"max_tokens must lie in [1, {cfg.max_tokens_limit}], got {msg.max_tokens}"
        if not (np.isfinite(msg.deadline_s) and msg.deadline_s > 0):
            return f"deadline_s must be finite seconds > 0, got {msg.deadline_s}"
        if not (np.isfinite(msg.rtt_s) and 0 <= msg.rtt_s <= MAX_RTT_S):
            return f"rtt_s must lie in [0, {MAX_RTT_S:g}] seconds, got {msg.rtt_s}"
        if not 0 <= msg.temperature <= 100:
            return f"temperature must lie in [0, 100], got {msg.temperature}"
        return None

    def result(self, req: EdgeRequest) -> Message:
        end = req.completed_at or time.monotonic()
        return PlacementMsg(request_id=req.client_id, kind="result", mode=req.mode if req.mode != "-" else req.outcome, depth=req.ed_depth,
                            outcome=req.outcome or "error", reason=req.reason, tokens=req.text.ids if req.mode in ("ad", "sd") else [],
                            latency_s=end - req.arrival, wait_s=(req.round_start - req.arrival) if req.round_start else float("nan"))

    @staticmethod
    def next_raw(messages: Iterator[bytes], until: float, context: grpc.ServicerContext) -> tuple[str, bytes | None]:
        """The stream's next message as raw bytes, waiting until monotonic ``until`` at most:
        ``("msg", raw)``, ``("end", None)`` (the edge half-closed or went away) or ``("timeout", None)``.

        gRPC's request iterator has no timeout of its own, so a helper thread reads it; one left
        waiting ends with the stream (the iterator stops once the handler has returned)."""
        box: queue.Queue = queue.Queue(maxsize=1)

        def read() -> None:
            try:
                box.put(("msg", next(messages)))
            except StopIteration:
                box.put(("end", None))
            except Exception:  # noqa: BLE001 - the client cancelled or the stream broke: the same as its end here
                box.put(("end", None))

        threading.Thread(target=read, name="split-place-read", daemon=True).start()
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return "timeout", None
            try:
                return box.get(timeout=min(left, 0.5))
            except queue.Empty:
                if not context.is_active():
                    return "end", None

    def parse(self, raw: bytes, context: grpc.ServicerContext, req: EdgeRequest | None = None) -> Message:
        """A :data:`PlaceMsg` from raw bytes; if they do not parse, ``req`` (if any) ends with ``error`` and
        the stream with INVALID_ARGUMENT (gRPC's own deserializer would answer INTERNAL / UNKNOWN)."""
        try:
            return PlaceMsg.FromString(raw)
        except DecodeError as exc:
            problem = f"placement message: not a PlaceMsg: {exc}"
            if req is not None:
                self.end(req, "error", f"edge: invalid report: {problem}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

    def report_problem(self, req: EdgeRequest, report: Message) -> str | None:
        """Why an ED report is refused (INVALID_ARGUMENT), naming the field; None if valid."""
        vocab = self.server.batcher.verifier.vocab_size
        if len(report.tokens) > req.max_tokens:
            return f"report tokens: {len(report.tokens)} tokens, more than the request's max_tokens={req.max_tokens}"
        if any(not 0 <= t < vocab for t in report.tokens):
            return f"report tokens: token ids must lie in [0, {vocab})"
        return None

    def place(self, request_iterator: Iterator[Message], context: grpc.ServicerContext) -> Iterator[Message]:
        """One edge request over its bidirectional placement stream (a gRPC worker thread).

        Every wait is bounded: the request's first message by ``first_message_s``; everything after
        by the request's deadline + ``report_grace_s`` (then it ends ``late``)."""
        messages = iter(request_iterator)
        got, raw = self.next_raw(messages, time.monotonic() + self.server.first_message_s, context)
        if got == "end":
            return
        if got == "timeout":
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no placement request within {self.server.first_message_s:g} s")
        msg = self.parse(raw, context)
        problem = self.validate(msg)
        if problem is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        tok = self.server.pair.tokenizer
        # the server names the request: edges' own names may collide (the engines' outbox and edge_active key on it)
        req = EdgeRequest(id=f"edge-{uuid.uuid4().hex[:16]}", prompt_ids=list(msg.prompt), max_tokens=int(msg.max_tokens), deadline_s=float(msg.deadline_s),
                          text=TextStream(tok.decode), temperature=float(msg.temperature), seed=int(msg.seed), rtt_s=float(msg.rtt_s), client_id=msg.request_id)
        handoff = asyncio.run_coroutine_threadsafe(self._queue(req), self.server.loop)
        try:
            handoff.result(timeout=SUBMIT_TIMEOUT_S)
        except Refused as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        except concurrent.futures.TimeoutError:
            # the event loop did not take the request in time: it ends here, on the loop (finish takes
            # it off the queue if it got there; _queue skips it if it did not yet)
            handoff.cancel()
            reason = f"server busy: the event loop did not take the request within {SUBMIT_TIMEOUT_S:g} s"
            self.end_soon(req, "error", reason)
            context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        # a stream that goes away ends its request (finish ignores a request that has its outcome)
        context.add_callback(lambda: self.end_soon(req, "error", "edge: the placement stream closed early"))
        # past this the request has had its chance: queued, in a round or drafting on its edge, it ends late
        give_up = req.arrival + req.deadline_s + self.server.report_grace_s
        overdue = f"deadline missed: no end within report_grace_s={self.server.report_grace_s:g} s after the deadline"
        while not req.placed.wait(0.5):
            if not context.is_active():
                return
            if time.monotonic() > give_up:
                self.end(req, "late", overdue)
                break
        if req.outcome is None and req.mode == "ed":
            yield PlacementMsg(request_id=req.client_id, kind="decision", mode="ed", depth=req.ed_depth)
            got, raw = self.next_raw(messages, give_up, context)
            report = self.parse(raw, context, req) if got == "msg" else None
            if got == "timeout":
                self.end(req, "late", f"{overdue} (no report of the ED generation)")
            elif report is None or not report.done:
                self.end(req, "error", "edge: no report of the ED generation")
            elif (problem := self.report_problem(req, report)) is not None:
                self.end(req, "error", f"edge: invalid report: {problem}")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            else:
                req.completed_at = time.monotonic()
                req.text.feed(list(report.tokens))
                if report.outcome in ("length", "eos"):
                    on_time = req.completed_at - req.arrival <= req.deadline_s
                    self.end(req, "served" if on_time else "late", "" if on_time else "deadline missed")
                else:
                    self.end(req, "error", f"edge: {report.outcome}: {report.error}")
        # set by now unless the event loop has stopped (shutdown ended every request then): bounded anyway
        req.ended.wait(10.0)
        yield self.result(req)

