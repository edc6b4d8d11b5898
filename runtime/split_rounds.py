"""Rounds with edge users: ``runtime.serve placement=split``.

The server accepts two kinds of users into the same rounds:

- **HTTP users** (OpenAI-style completions, :mod:`runtime.api`): no edge; AD or SD on the server;
- **edge users** over gRPC (:mod:`runtime.split_placement`): they have their own draft model and a
  round trip ``rtt_s`` to the server, so they may also run **ED@g** -- draft on the edge at depth
  ``g``, verified here by the split verifier (:mod:`runtime.split`: batched verification, cohorts
  taking turns, a short batching window).

Every round is planned with a v1 scheduler (``balance_ed``, ``edge_first`` or a policy trained on
``EdgeSchedule-v1``, e.g. ``policies/split_k20``) on the serve profile, which must have ``edge`` and
``network`` sections: the round is :meth:`Round.from_requests` with ``has_edge`` (edge users) and
``rtt_s`` (each edge user's reported round trip). AD / SD users run on the engines exactly as with
``placement=local`` (:class:`runtime.rounds.RoundServer`); an ED user gets its depth over its
placement stream and the round moves on -- ED work is the verifier's, not the round's.

**One target, time-sliced (choice).** The verifier shares the AD / SD engines' target model (one
copy: the weights are read-only and every forward has its own KV, so the two threads may run it at
once). On a CPU the verification thread and the round's engine thread share the cores (the OS and
torch's thread pools time-slice them); the plan's ED share ``ed_share`` is not enforced -- it is the
planner's estimate, the verifier takes what the CPU gives it.

**Outcomes.** Every request ends with exactly one outcome (served / late / rejected / error), in
:meth:`finish`: counted in the server's metrics (``specsched_requests``) and, per kind of user, in
``specsched_split_requests{kind="edge"|"http", outcome}``. An ED request ends when its edge reports
its last token (served if that report arrived within the deadline, measured on the server's clock
from the request's arrival), or with ``error`` if the edge failed or its stream broke first.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from prometheus_client import Counter

from envs.config import EnvConfig
from envs.plan import ED
from envs.split_cost import SplitCostModel
from envs.split_plan import ed_time1, ed_users
from envs.workload import Round
from runtime.live_request import OUTCOMES, LiveRequest
from runtime.rounds import Refused, RoundServer
from runtime.split.batcher import VerificationBatcher
from runtime.split.grpc_server import VerifierService
from runtime.split.messages import SERVICE as VERIFY_SERVICE
from runtime.split.messages import VerdictMsg
from runtime.split.verifier import BatchVerifier
from runtime.split_placement import SERVICE as PLACEMENT_SERVICE
from runtime.split_placement import PlacementMsg, PlaceMsg
from runtime.textstream import TextStream

log = logging.getLogger("specsched.serve")
KINDS = ("edge", "http")


@dataclass(eq=False)
class EdgeRequest(LiveRequest):
    """A request of an edge user (it can draft on its edge: ED)."""

    rtt_s: float = 0.0  #: the edge's round trip to this server, s
    ed_depth: int = 0  #: the plan's ED depth (mode ``ed``)
    ed_alone_s: float | None = None  #: the profile's time for it alone in ED at its best depth (set by the queue)
    client_id: str = ""  #: the edge's own name for the request (``id`` is the server's, unique)
    placed: threading.Event = field(default_factory=threading.Event)  #: planned as ED, or ended
    ended: threading.Event = field(default_factory=threading.Event)  #: has its outcome


class SplitRoundServer(RoundServer):
    """A :class:`RoundServer` whose rounds also hold edge users, planned with a v1 scheduler."""

    def __init__(self, cfg, pair, metrics=None):
        super().__init__(cfg, pair, metrics)
        s = cfg.split
        self.batcher = VerificationBatcher(BatchVerifier(pair.target, max_depth=s.max_depth), cohorts=s.cohorts, window_s=s.window_ms / 1e3,
                                           max_batch=s.max_clients)
        self.by_kind = Counter("specsched_split_requests", "Requests that ended, by kind of user (edge over gRPC, http) and outcome",
                               ["kind", "outcome"], registry=self.metrics.registry)
        for kind in KINDS:
            for o in OUTCOMES:
                self.by_kind.labels(kind, o)  # present at 0
        self.kind_counts = {kind: dict.fromkeys(OUTCOMES, 0) for kind in KINDS}
        self.split_cost = SplitCostModel(self.base_cost.profile)  # ServeConfig checked the edge and network sections
        self.edge_active: dict[str, EdgeRequest] = {}  #: ED requests between their decision and their end
        self.loop: asyncio.AbstractEventLoop | None = None
        self.grpc_server: grpc.Server | None = None
        self.split_port: int | None = None

    # ------------------------------------------------------------------------- planning
    def make_scheduler(self):
        if self.cfg.scheduler == "policy":  # a v1 policy (ServeConfig checked its env id)
            from agents.policy_v1 import PolicyV1Scheduler

            return PolicyV1Scheduler(self.cost, EnvConfig.max_gamma, draft_depth=self.cfg.draft_depth, seed=0, path=self.cfg.policy_path)
        return super().make_scheduler()

    def as_round(self, batch: list[LiveRequest], now: float) -> Round:
        rnd = super().as_round(batch, now)
        rnd.has_edge = np.array([isinstance(r, EdgeRequest) for r in batch], dtype=bool)
        rnd.rtt_s = np.array([r.rtt_s if isinstance(r, EdgeRequest) else 0.0 for r in batch], dtype=float)
        return rnd

    def min_service_s(self, req: LiveRequest) -> float:
        """The queue's hopeless check: an edge user may also be served in ED, alone at its best depth
        (the v1 model: verification + edge prefill + iterations of drafting and network), scaled by SD's
        calibration factor (the same host's slowness; the verifier has no factor of its own)."""
        fastest = super().min_service_s(req)
        if not isinstance(req, EdgeRequest):
            return fastest
        if req.ed_alone_s is None:
            rnd = Round.from_requests([len(req.prompt_ids)], [req.max_tokens], [1e9], [self.alpha], 0.0, 0.0)
            rnd.has_edge, rnd.rtt_s = np.array([True]), np.array([req.rtt_s])
            users = ed_users(self.split_cost, rnd, EnvConfig.max_gamma)
            times = [ed_time1(self.base_cost, 1, len(req.prompt_ids), req.max_tokens, int(users.iterations[0, g - 1]), g + 1)
                     + float(users.prefill_s[0]) + float(users.iterations[0, g - 1] * users.edge_s[0, g - 1])
                     for g in range(1, EnvConfig.max_gamma + 1) if users.allowed[0, g - 1]]
            req.ed_alone_s = min(times, default=float("inf"))
        return min(fastest, req.ed_alone_s * self.calibration.factor["sd"])

    def place_other(self, req: LiveRequest, index: int, plan, loop) -> bool:
        if plan.modes[index] != ED or not isinstance(req, EdgeRequest) or plan.ed_depth is None:
            return False
        req.mode, req.ed_depth = "ed", int(plan.ed_depth[index])
        self.edge_active[req.id] = req
        req.placed.set()  # the placement stream tells the edge
        return True

    def finish(self, req: LiveRequest, outcome: str, reason: str = "") -> None:
        first = req.outcome is None
        super().finish(req, outcome, reason)
        if not first:
            return
        kind = "edge" if isinstance(req, EdgeRequest) else "http"
        self.by_kind.labels(kind, outcome).inc()
        self.kind_counts[kind][outcome] += 1
        if isinstance(req, EdgeRequest):
            self.edge_active.pop(req.id, None)
            req.ended.set()
            req.placed.set()

    # ------------------------------------------------------------------------- the gRPC side
    def _validate(self, msg) -> str | None:
        """Why a placement request is refused (INVALID_ARGUMENT), naming the field; None if valid."""
        cfg, vocab = self.cfg, self.batcher.verifier.vocab_size
        if not msg.prompt or len(msg.prompt) > cfg.max_prompt_tokens:
            return f"prompt must hold 1..{cfg.max_prompt_tokens} token ids, got {len(msg.prompt)}"
        if any(not 0 <= t < vocab for t in msg.prompt):
            return f"prompt token ids must lie in [0, {vocab})"
        if not 1 <= msg.max_tokens <= cfg.max_tokens_limit:
            return f"max_tokens must lie in [1, {cfg.max_tokens_limit}], got {msg.max_tokens}"
        if not (np.isfinite(msg.deadline_s) and msg.deadline_s > 0):
            return f"deadline_s must be finite seconds > 0, got {msg.deadline_s}"
        if not (np.isfinite(msg.rtt_s) and 0 <= msg.rtt_s <= 10):
            return f"rtt_s must lie in [0, 10] seconds, got {msg.rtt_s}"
        if not 0 <= msg.temperature <= 100:
            return f"temperature must lie in [0, 100], got {msg.temperature}"
        return None

    async def _submit(self, req: EdgeRequest) -> None:
        self.submit(req)

    def _end_soon(self, req: EdgeRequest, outcome: str, reason: str) -> None:
        """End ``req`` from a gRPC thread (the event loop sets the outcome; once it has stopped, shutdown did)."""
        try:
            self.loop.call_soon_threadsafe(self.finish, req, outcome, reason)
        except RuntimeError:  # the loop is closed: the server has shut down and ended every request
            pass

    def _end(self, req: EdgeRequest, outcome: str, reason: str = "") -> None:
        """End ``req`` from a gRPC thread and wait until the event loop has."""
        self._end_soon(req, outcome, reason)
        req.ended.wait(10.0)

    def _result(self, req: EdgeRequest):
        end = req.completed_at or time.monotonic()
        return PlacementMsg(request_id=req.client_id, kind="result", mode=req.mode if req.mode != "-" else req.outcome, depth=req.ed_depth,
                            outcome=req.outcome or "error", reason=req.reason, tokens=req.text.ids if req.mode in ("ad", "sd") else [],
                            latency_s=end - req.arrival, wait_s=(req.round_start - req.arrival) if req.round_start else float("nan"))

    def place(self, request_iterator, context):
        """One edge request over its bidirectional placement stream (a gRPC worker thread)."""
        messages = iter(request_iterator)
        msg = next(messages, None)
        if msg is None:
            return
        problem = self._validate(msg)
        if problem is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        tok = self.pair.tokenizer
        # the server names the request: edges' own names may collide (the engines' outbox and edge_active key on it)
        req = EdgeRequest(id=f"edge-{uuid.uuid4().hex[:16]}", prompt_ids=list(msg.prompt), max_tokens=int(msg.max_tokens), deadline_s=float(msg.deadline_s),
                          text=TextStream(tok.decode), temperature=float(msg.temperature), seed=int(msg.seed), rtt_s=float(msg.rtt_s), client_id=msg.request_id)
        try:
            asyncio.run_coroutine_threadsafe(self._submit(req), self.loop).result(timeout=10.0)
        except Refused as err:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        # a stream that goes away ends its request (finish ignores a request that has its outcome)
        context.add_callback(lambda: self._end_soon(req, "error", "edge: the placement stream closed early"))
        while not req.placed.wait(0.5):
            if not context.is_active():
                return
        if req.outcome is None and req.mode == "ed":
            yield PlacementMsg(request_id=req.client_id, kind="decision", mode="ed", depth=req.ed_depth)
            report = next(messages, None)
            if report is None or not report.done:
                self._end(req, "error", "edge: no report of the ED generation")
            else:
                req.completed_at = time.monotonic()
                req.text.feed(list(report.tokens))
                if report.outcome in ("length", "eos"):
                    on_time = req.completed_at - req.arrival <= req.deadline_s
                    self._end(req, "served" if on_time else "late", "" if on_time else "deadline missed")
                else:
                    self._end(req, "error", f"edge: {report.outcome}: {report.error}")
        req.ended.wait()
        yield self._result(req)

    def _start_grpc(self) -> None:
        s = self.cfg.split
        verify = VerifierService(self.batcher)
        handlers = (
            grpc.method_handlers_generic_handler(VERIFY_SERVICE, {"Verify": grpc.stream_stream_rpc_method_handler(
                verify.verify, request_deserializer=None, response_serializer=VerdictMsg.SerializeToString)}),
            grpc.method_handlers_generic_handler(PLACEMENT_SERVICE, {"Place": grpc.stream_stream_rpc_method_handler(
                self.place, request_deserializer=PlaceMsg.FromString, response_serializer=PlacementMsg.SerializeToString)}),
        )
        from concurrent.futures import ThreadPoolExecutor

        # two streams per edge user (placement + verification)
        server = grpc.server(ThreadPoolExecutor(max_workers=2 * s.max_clients + 4, thread_name_prefix="split-stream"), maximum_concurrent_rpcs=2 * s.max_clients)
        server.add_generic_rpc_handlers(handlers)
        port = server.add_insecure_port(f"{self.cfg.host}:{s.port}")
        if port == 0:
            raise OSError(f"could not bind the split port {self.cfg.host}:{s.port}")
        server.start()
        self.grpc_server, self.split_port = server, port
        log.info("split placement and verification on %s:%d", self.cfg.host, port)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._start_grpc()
        await super().run()

    async def shutdown(self) -> None:
        """The round server's shutdown, then ED requests still generating end with ``error``, then gRPC stops."""
        if self.closing:
            return
        await super().shutdown()
        for req in list(self.edge_active.values()):
            self.finish(req, "error", "shutdown: the server is shutting down")
        if self.grpc_server is not None:
            await asyncio.get_running_loop().run_in_executor(None, lambda: self.grpc_server.stop(grace=1.0).wait(5.0))
        self.batcher.stop()

    def health(self) -> dict[str, Any]:
        return {**super().health(), "placement": "split", "split_port": self.split_port, "edge_active": len(self.edge_active),
                "by_kind": {k: dict(v) for k, v in self.kind_counts.items()}}
