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

**One target, shared at the plan's shares (choice, ``split.device_sharing``).** The verifier shares
the AD / SD engines' target model (one copy: the weights are read-only and every forward has its own
KV, so the two threads may run it at once). ``turns`` (default): the verification thread and the
round's engine thread take weighted turns on the device, one step each (:mod:`runtime.device_turns`),
the verifier at the round plan's ED share ``ed_share`` and the engines at the rest (with ED users
of earlier rounds still active: :meth:`SplitRoundServer.share_device`), so the share the planner
priced is the share the verifier gets (to within one engine step; work-conserving but for a 2 ms
anticipation window: a party with nothing to do lends its turns). ``os``: two free threads; on a CPU the OS and torch's thread
pools time-slice them (about half each while both run, whatever the plan said).

**Outcomes.** Every request ends with exactly one outcome (served / late / rejected / error), in
:meth:`finish`: counted in the server's metrics (``specsched_requests``) and, per kind of user, in
``specsched_split_requests{kind="edge"|"http", outcome}``. An ED request ends when its edge reports
its last token (served if that report arrived within the deadline, measured on the server's clock
from the request's arrival), or with ``error`` if the edge failed or its stream broke first.

**Faults on the placement stream.** Every wait of a placement stream is bounded: a request that has
no outcome ``report_grace_s`` after its deadline -- its edge stays connected but silent, no report
of its ED generation -- ends ``late``, so no request holds a stream (or any state) past deadline +
grace; a first message that does not come within ``first_message_s`` ends the stream
(DEADLINE_EXCEEDED). A request whose edge hangs up before its round is planned leaves the queue at
once: it is not planned and holds no ``edge_active`` entry. A message that does not parse, and an ED
report with token ids outside the vocabulary or more tokens than ``max_tokens``, end the stream with
INVALID_ARGUMENT naming the field (the request, if any, ends with ``error``); the server goes on.
The stream itself is :class:`runtime.split_placement_service.PlacementService`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from prometheus_client import Counter

from envs.config import EnvConfig
from envs.plan import AD, ED, SD
from envs.split_cost import SplitCostModel
from envs.split_plan import ed_time1, ed_users
from envs.workload import Round
from runtime.device_turns import DeviceTurns
from runtime.live_request import OUTCOMES, LiveRequest
from runtime.rounds import RoundServer
from runtime.split.batcher import VerificationBatcher
from runtime.split.grpc_server import KEEPALIVE_S, VerifierService, keepalive_options
from runtime.split.messages import SERVICE as VERIFY_SERVICE
from runtime.split.messages import VerdictMsg
from runtime.split.verifier import BatchVerifier
from runtime.split_placement import SERVICE as PLACEMENT_SERVICE
from runtime.split_placement import PlacementMsg
from runtime.split_placement_service import (
    FIRST_MESSAGE_S,
    REPORT_GRACE_S,
    EdgeRequest,
    PlacementService,
)

if TYPE_CHECKING:
    from agents.scheduler import Scheduler
    from envs.plan import Plan

log = logging.getLogger("specsched.serve")
KINDS = ("edge", "http")
#: the two parties of the device's turns (``split.device_sharing=turns``)
ENGINE_PARTY, ED_PARTY = "engine", "ed"


class SplitRoundServer(RoundServer):
    """A :class:`RoundServer` whose rounds also hold edge users, planned with a v1 scheduler."""

    def __init__(self, cfg, pair, metrics=None):
        super().__init__(cfg, pair, metrics)
        s = cfg.split
        if s.device_sharing == "turns":  # placement=split runs on one device (ServeConfig refuses ``devices``)
            self.device_turns = DeviceTurns({ENGINE_PARTY: 1.0, ED_PARTY: 1.0})
        self.batcher = VerificationBatcher(BatchVerifier(pair.target, max_depth=s.max_depth), cohorts=s.cohorts, window_s=s.window_ms / 1e3,
                                           max_batch=s.max_clients, turns=self.device_turns, party=ED_PARTY)
        self.by_kind = Counter("specsched_split_requests", "Requests that ended, by kind of user (edge over gRPC, http) and outcome",
                               ["kind", "outcome"], registry=self.metrics.registry)
        for kind in KINDS:
            for o in OUTCOMES:
                self.by_kind.labels(kind, o)  # present at 0
        self.kind_counts = {kind: dict.fromkeys(OUTCOMES, 0) for kind in KINDS}
        self.split_cost = SplitCostModel(self.base_cost.profile)  # ServeConfig checked the edge and network sections
        self.edge_active: dict[str, EdgeRequest] = {}  #: ED requests between their decision and their end
        self.ed_round_shares: dict[float, float] = {}  #: round start (monotonic) -> its plan's ED share, while its ED users are active
        self.loop: asyncio.AbstractEventLoop | None = None
        self.grpc_server: grpc.Server | None = None
        self.split_port: int | None = None
        self.report_grace_s = REPORT_GRACE_S  # instance attributes: tests shorten them
        self.first_message_s = FIRST_MESSAGE_S

    # ------------------------------------------------------------------------- planning
    def make_scheduler(self) -> Scheduler:
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

    def share_device(self, plan: Plan, round_start: float) -> None:
        """The device's turns from the round plans in force (``split.device_sharing=turns``).

        Each round is planned on its own, with the whole device, while ED users of earlier rounds may
        still be drafting; so each party is weighted by what its own plans gave it (only the ratio
        matters): the verifier by the ED shares of the rounds whose ED users are still active, this
        one's included (summed, at most 1), the engines by this plan's AD + SD share (``1 - ed_share``;
        a plan without AD / SD users leaves them the rest). A plan that puts everyone in ED (ED share
        1) against a later AD / SD round so splits the device half and half, not all to the verifier."""
        if self.device_turns is None:
            return
        placed = plan.ed_depth is not None and bool(np.any(plan.modes == ED))
        if placed:
            self.ed_round_shares[round_start] = float(plan.ed_share)
        active = {r.round_start for r in self.edge_active.values()} | ({round_start} if placed else set())
        self.ed_round_shares = {k: v for k, v in self.ed_round_shares.items() if k in active}
        ed = min(sum(self.ed_round_shares.values()), 1.0)
        engines = 1.0 - float(plan.ed_share) if np.any((plan.modes == AD) | (plan.modes == SD)) else 1.0 - ed
        self.device_turns.set_shares({ENGINE_PARTY: max(engines, 0.0), ED_PARTY: ed})

    def place_other(self, req: LiveRequest, index: int, plan: Plan, loop: asyncio.AbstractEventLoop) -> bool:
        if plan.modes[index] != ED or not isinstance(req, EdgeRequest) or plan.ed_depth is None:
            return False
        if req.outcome is not None:  # it ended while its round was planned (its edge hung up): nothing to place
            return True
        req.mode, req.ed_depth = "ed", int(plan.ed_depth[index])
        self.edge_active[req.id] = req
        # finish (event loop) may have run between the check above and the entry: it sets the outcome
        # before it drops the entry, so an outcome seen now means the entry may have missed its drop
        if req.outcome is not None:
            self.edge_active.pop(req.id, None)
        req.placed.set()  # the placement stream tells the edge
        return True

    def finish(self, req: LiveRequest, outcome: str, reason: str = "") -> None:
        first = req.outcome is None
        super().finish(req, outcome, reason)
        if not first:
            return
        # a request that ends while queued (its edge hung up) leaves the queue: a round must not plan it
        # (an ED plan would hold its edge_active entry forever). By identity: LiveRequest compares by value.
        if any(r is req for r in self.pending):
            self.pending = [r for r in self.pending if r is not req]
            self.metrics.queue.set(len(self.pending))
        kind = "edge" if isinstance(req, EdgeRequest) else "http"
        self.by_kind.labels(kind, outcome).inc()
        self.kind_counts[kind][outcome] += 1
        if isinstance(req, EdgeRequest):
            self.edge_active.pop(req.id, None)
            req.ended.set()
            req.placed.set()

    # ------------------------------------------------------------------------- the gRPC side
    def _start_grpc(self) -> None:
        s = self.cfg.split
        verify = VerifierService(self.batcher)
        handlers = (
            grpc.method_handlers_generic_handler(VERIFY_SERVICE, {"Verify": grpc.stream_stream_rpc_method_handler(
                verify.verify, request_deserializer=None, response_serializer=VerdictMsg.SerializeToString)}),
            # raw bytes, parsed by place: a message that does not parse is INVALID_ARGUMENT, as on Verify
            grpc.method_handlers_generic_handler(PLACEMENT_SERVICE, {"Place": grpc.stream_stream_rpc_method_handler(
                PlacementService(self).place, request_deserializer=None, response_serializer=PlacementMsg.SerializeToString)}),
        )
        from concurrent.futures import ThreadPoolExecutor

        # two streams per edge user (placement + verification); keepalive pings drop an edge that froze
        # or was cut off without a TCP reset (its streams, target KV and slots are freed as on a close)
        server = grpc.server(ThreadPoolExecutor(max_workers=2 * s.max_clients + 4, thread_name_prefix="split-stream"), maximum_concurrent_rpcs=2 * s.max_clients,
                             options=keepalive_options(KEEPALIVE_S))
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
