"""Placement of edge users (``runtime.serve placement=split``): the wire protocol and the edge's side.

An edge client serves one user with its own draft model. For each of its user's requests it opens
one bidirectional ``Place`` stream to the server's gRPC port (the same port as the verification
service of :mod:`runtime.split`):

1. edge -> server: a :data:`PlaceMsg` with the request (prompt token ids, ``max_tokens``, the
   deadline in seconds from now, the edge's round trip to the server ``rtt_s``, sampling);
2. the server queues it beside its HTTP requests; the next round's v1 plan decides
   reject / AD / SD / ED@g for every user (:mod:`runtime.split_rounds`);
3. server -> edge:
   - **ED@g**: a ``decision`` (mode ``ed``, depth ``g``); the edge drafts at depth ``g`` and the
     server verifies over the verification stream (:class:`runtime.split.edge_client.EdgeClient`);
     then edge -> server a ``done`` :data:`PlaceMsg` (its tokens and its own outcome), and
     server -> edge the ``result`` (the request's one outcome: served / late / error);
   - **AD / SD / reject / error**: the ``result`` only (for AD / SD with the tokens the server
     generated).

Every request ends with exactly one outcome, decided and counted by the server; the edge gets it in
the ``result``. A stream that breaks before its ``done`` ends the request with ``error``.

**A dead or frozen server.** The edge bounds its waits for the server: the decision or result within
the request's deadline + ``reply_timeout_s`` from its send, and, after its ED report, the result
within ``reply_timeout_s`` (the ED generation itself is bounded by the verification stream's
``reply_timeout_s``). Past that the edge cancels the stream and the request ends with ``error``
(reason ``timeout``); the server, if alive, sees the stream go and ends it with ``error`` too.

**Network emulation.** :class:`EdgeUser` wraps its verification link in
:class:`~runtime.split.transport.DelayedLink` (``rtt_s``, read at each request: half each way); the placement exchange
itself (one or two messages per request, against ``J`` verification round trips) is not delayed.
The round trip the edge *reports* (``PlaceMsg.rtt_s``, what the server plans with) is, by default
(``rtt_report="measured"``), the emulated delay plus the stack time its recent verification round
trips took beyond their emulated delays (:mod:`runtime.split.rtt_estimate`): what a client on a
real link measures. :meth:`EdgeUser.probe_link` measures it before the first request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
from google.protobuf import descriptor_pb2

from runtime.split.batched_drafter import BatchedDrafter
from runtime.split.depth import PROBES, DepthController
from runtime.split.draft_device import SharedDraftDevice
from runtime.split.edge_client import EdgeClient, RequestOutcome
from runtime.split.messages import build_messages
from runtime.split.rtt_estimate import RTT_REPORTS, MeasuredRtt
from runtime.split.transport import DelayedLink, GrpcLink

PACKAGE = "specsched.placement"
SERVICE = f"{PACKAGE}.Placement"
METHOD = f"/{SERVICE}/Place"

_F = descriptor_pb2.FieldDescriptorProto
_FIELDS = {
    # edge -> server: the request (first message) or, after ED, the report (done = true)
    "PlaceMsg": [("request_id", _F.TYPE_STRING, False), ("prompt", _F.TYPE_INT32, True), ("max_tokens", _F.TYPE_UINT32, False),
                 ("deadline_s", _F.TYPE_DOUBLE, False), ("rtt_s", _F.TYPE_DOUBLE, False), ("temperature", _F.TYPE_FLOAT, False),
                 ("seed", _F.TYPE_UINT64, False), ("done", _F.TYPE_BOOL, False), ("tokens", _F.TYPE_INT32, True),
                 ("outcome", _F.TYPE_STRING, False), ("error", _F.TYPE_STRING, False)],
    # server -> edge: kind "decision" (ED only) or "result" (the one outcome)
    "PlacementMsg": [("request_id", _F.TYPE_STRING, False), ("kind", _F.TYPE_STRING, False), ("mode", _F.TYPE_STRING, False),
                     ("depth", _F.TYPE_UINT32, False), ("outcome", _F.TYPE_STRING, False), ("reason", _F.TYPE_STRING, False),
                     ("tokens", _F.TYPE_INT32, True), ("latency_s", _F.TYPE_DOUBLE, False), ("wait_s", _F.TYPE_DOUBLE, False)],
}


PlaceMsg, PlacementMsg = build_messages("specsched_placement.proto", PACKAGE, _FIELDS)


@dataclass
class EdgeResult:
    """One request of an edge user, as the edge saw it (times: edge wall clock, s)."""

    request_id: str
    mode: str  #: ed | ad | sd | rejected | error (what the plan decided, or how it failed)
    outcome: str  #: the server's one outcome: served | late | rejected | error
    reason: str
    tokens: list[int]
    depth: int  #: ED draft depth the plan gave (0 otherwise)
    sent_at: float
    decided_at: float | None  #: the ED decision arrived (None: not ED)
    ended_at: float  #: the result arrived
    last_token_at: float | None  #: the edge had its last token (ED: its last verdict; else the result)
    server_latency_s: float  #: the server's arrival -> end
    wait_s: float  #: the server's arrival -> planned
    edge: RequestOutcome | None = field(default=None, repr=False)  #: the ED generation's log
    reported_rtt_s: float = float("nan")  #: the round trip the edge reported to the server for this request, s

    @property
    def latency_s(self) -> float:
        """Send -> last token, on the edge's clock."""
        return (self.last_token_at or self.ended_at) - self.sent_at


class EdgeUser:
    """One edge-capable user: its draft model, its streams to the server, its requests one at a time.

    ``depth``: ``plan`` drafts at the plan's ED depth; ``auto`` starts there and lets the per-client
    controller (:class:`~runtime.split.depth.DepthController`, SpecEdge's calibration rule) move it.
    ``rtt_s`` / ``jitter_s``: the emulated link (may change between requests). ``rtt_report``: the round
    trip reported to the server, ``measured`` (the emulated mean delay ``rtt_s + jitter_s`` plus the
    stack time measured on this user's recent round trips) or ``link`` (``rtt_s`` alone).
    """

    def __init__(self, address: str, draft, rtt_s: float = 0.0, eos_id: int | None = None, depth: str = "plan", max_depth: int = 8,
                 proactive: bool = True, draft_device: SharedDraftDevice | BatchedDrafter | None = None, connect_timeout_s: float = 10.0, reply_timeout_s: float = 60.0,
                 jitter_s: float = 0.0, seed: int = 0, depth_probe: str = "inside", rtt_report: str = "measured"):
        if depth not in ("plan", "auto"):
            raise ValueError(f"depth must be plan or auto, got {depth!r}")
        if rtt_s < 0 or jitter_s < 0:
            raise ValueError(f"rtt_s and jitter_s must be >= 0 seconds, got {rtt_s}, {jitter_s}")
        if depth_probe not in PROBES:
            raise ValueError(f"depth_probe must be one of {PROBES}, got {depth_probe!r}")
        if rtt_report not in RTT_REPORTS:
            raise ValueError(f"rtt_report must be one of {list(RTT_REPORTS)}, got {rtt_report!r}")
        self.rtt_report, self.measured_rtt = rtt_report, MeasuredRtt()
        self.address, self.draft, self.rtt_s, self.eos_id, self.depth = address, draft, rtt_s, eos_id, depth
        self.max_depth, self.proactive, self.draft_device, self.jitter_s, self.seed = max_depth, proactive, draft_device, jitter_s, seed
        self.connect_timeout_s, self.reply_timeout_s = connect_timeout_s, reply_timeout_s
        self.depth_probe = depth_probe  #: with depth auto: the controller's probe rule (runtime.split.depth)
        self.channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=connect_timeout_s)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise ConnectionError(f"no split server at {address} within {connect_timeout_s} s") from None
        self._place = self.channel.stream_stream(METHOD, request_serializer=PlaceMsg.SerializeToString, response_deserializer=PlacementMsg.FromString)
        self._client: EdgeClient | None = None

    def _edge_client(self, depth: int, link_s: tuple[float, float]) -> EdgeClient:
        """The verification stream's client (kept between requests; a new stream after a failure),
        its link emulating ``link_s = (rtt_s, jitter_s)``."""
        if self._client is not None and self._client.broken:
            self._client.link.close()
            self._client = None
        ctl: int | DepthController = depth
        if self.depth == "auto":
            ctl = DepthController(1, self.max_depth, initial=min(depth, self.max_depth), probe=self.depth_probe)
        if self._client is None:
            # always behind the WAN shim (no delay at rtt 0), so a later request's RTT applies to the same stream
            link = DelayedLink(GrpcLink(self.address, self.connect_timeout_s), 1e3 * link_s[0], 1e3 * link_s[1], seed=self.seed)
            self._client = EdgeClient(self.draft, link, depth=ctl, proactive=self.proactive, max_depth=max(self.max_depth, depth),
                                      eos_id=self.eos_id, reply_timeout_s=self.reply_timeout_s, draft_device=self.draft_device)
        else:
            self._client.depth, self._client.max_depth = ctl, max(self.max_depth, depth)
        self._client.link.rtt_s, self._client.link.jitter_s = link_s  # this request's network (rtt_s may change between requests)
        return self._client

    def _link_s(self) -> tuple[float, float]:
        """This request's emulated link ``(rtt_s, jitter_s)``, read once: the report and the link agree."""
        return self.rtt_s, self.jitter_s

    def _report(self, link_s: tuple[float, float]) -> float:
        """The round trip to report for a request on ``link_s``, s (DelayedLink's mean delay is rtt + jitter)."""
        return self.measured_rtt.rtt_s(link_s[0] + link_s[1]) if self.rtt_report == "measured" else link_s[0]

    @property
    def reported_rtt_s(self) -> float:
        """The round trip the next request reports to the server, s."""
        return self._report(self._link_s())

    def _generate(self, depth: int, link_s: tuple[float, float], prompt: list[int], max_tokens: int, temperature: float, seed: int,
                  request_id: str | None) -> RequestOutcome:
        """One generation over the verification stream on ``link_s``; its round trips feed the measured RTT."""
        out = self._edge_client(depth, link_s).generate(list(prompt), max_tokens, temperature, seed=seed, request_id=request_id)
        self.measured_rtt.observe((log.network_ms for log in out.iterations), link_s[0] + link_s[1])
        return out

    def probe_link(self, prompt: list[int], max_tokens: int = 48, depth: int = 4) -> float:
        """Measure the stack's round trip before any placed request: one generation straight over
        the verification stream (no placement: nothing planned or counted by the rounds), whose
        stream is then closed, so the server's batcher does not keep this client as a member until
        its first ED request; returns the mean stack time per round trip, s. Raises
        ``RuntimeError`` if the generation does not finish (the estimate keeps what it measured)."""
        try:
            out = self._generate(depth, self._link_s(), prompt, max_tokens, 0.0, 0, None)
        finally:
            if self._client is not None:
                self._client.link.close()
                self._client = None
        if out.outcome not in ("length", "eos"):
            raise RuntimeError(f"link probe ended {out.outcome}: {out.error}")
        return self.measured_rtt.stack_s

    def request(self, prompt: list[int], max_tokens: int, deadline_s: float, temperature: float = 0.0, seed: int = 0, request_id: str = "") -> EdgeResult:
        """Submit one request and see it through (blocking); every call returns one :class:`EdgeResult`."""
        link_s = self._link_s()
        reported_rtt_s = self._report(link_s)
        outbox: list = [PlaceMsg(request_id=request_id, prompt=list(prompt), max_tokens=max_tokens, deadline_s=deadline_s, rtt_s=reported_rtt_s,
                                 temperature=temperature, seed=seed)]
        cond = threading.Condition()
        closed = [False]

        def messages():  # the request, then (ED) the report once it is queued
            sent = 0
            while True:
                with cond:
                    cond.wait_for(lambda n=sent: len(outbox) > n or closed[0])
                    if sent >= len(outbox):
                        return
                    msg = outbox[sent]
                sent += 1
                yield msg

        def send(msg) -> None:
            with cond:
                outbox.append(msg)
                cond.notify_all()

        sent_at = time.time()
        decided_at, depth, edge_out, last_token_at = None, 0, None, None
        call = self._place(messages())
        # the watchdog: a server that neither answers nor breaks the stream (frozen, or a lost network
        # without a reset) would leave `for reply in call` waiting forever; gRPC's call timeout cannot
        # follow the phases (the ED generation may rightly run past the deadline), so a thread cancels it
        waiting = {"until": time.monotonic() + min(deadline_s, 1e9) + self.reply_timeout_s,
                   "what": f"the decision or result within deadline_s + reply_timeout_s = {deadline_s:g} + {self.reply_timeout_s:g} s"}
        timed_out, stop = threading.Event(), threading.Event()

        def watch() -> None:
            while not stop.wait(0.1):
                with cond:
                    until = waiting["until"]
                if until is not None and time.monotonic() > until:
                    timed_out.set()
                    call.cancel()
                    return

        watchdog = threading.Thread(target=watch, name="edge-place-watchdog", daemon=True)
        watchdog.start()
        try:
            for reply in call:
                if reply.kind == "decision" and reply.mode == "ed":
                    decided_at, depth = time.time(), int(reply.depth)
                    with cond:
                        waiting["until"] = None  # the generation bounds itself (each verification within reply_timeout_s)
                    try:
                        edge_out = self._generate(depth, link_s, prompt, max_tokens, temperature, seed, request_id or None)
                    except Exception as exc:  # noqa: BLE001 - a fault before the generation starts (the client, the draft session) is reported, not raised
                        with cond:
                            waiting["until"] = time.monotonic() + self.reply_timeout_s
                            waiting["what"] = f"the result within reply_timeout_s = {self.reply_timeout_s:g} s of the ED report"
                        send(PlaceMsg(request_id=request_id, done=True, tokens=[], outcome="error", error=f"edge generation failed: {type(exc).__name__}: {exc}"))
                        continue
                    last_token_at = edge_out.iterations[-1].reply_at if edge_out.iterations else None
                    with cond:
                        waiting["until"] = time.monotonic() + self.reply_timeout_s
                        waiting["what"] = f"the result within reply_timeout_s = {self.reply_timeout_s:g} s of the ED report"
                    send(PlaceMsg(request_id=request_id, done=True, tokens=edge_out.tokens, outcome=edge_out.outcome, error=edge_out.error))
                    continue
                tokens = list(reply.tokens) if reply.mode != "ed" else (edge_out.tokens if edge_out else [])
                ended = time.time()
                return EdgeResult(request_id, reply.mode, reply.outcome, reply.reason, tokens, depth, sent_at, decided_at, ended,
                                  last_token_at if reply.mode == "ed" else ended, reply.latency_s, reply.wait_s, edge_out, reported_rtt_s)
            reason = "the server ended the placement stream without a result"
        except grpc.RpcError as err:
            reason = f"placement stream failed: {err.code().name}: {err.details()}"
            if timed_out.is_set():
                reason = f"timeout: the server sent no reply: it owed {waiting['what']}"
        finally:
            stop.set()
            with cond:
                closed[0] = True
                cond.notify_all()
        now = time.time()
        return EdgeResult(request_id, "error", "error", reason, edge_out.tokens if edge_out else [], depth, sent_at, decided_at, now, last_token_at, float("nan"),
                          float("nan"), edge_out, reported_rtt_s)

    def close(self) -> None:
        if self._client is not None:
            self._client.link.close()
        self.channel.close()
