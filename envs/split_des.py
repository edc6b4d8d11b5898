"""Discrete-event simulation of split (SpecEdge) serving: N edge clients draft, one server verifies.

This is the *check* of the split mode's closed form (``envs.split_cost``): it is built only from
primitive latencies -- one target pass on the server for ``b`` clients x ``q`` tokens, one draft
pass on an edge device, the network's round-trip time, jitter and bandwidth -- and never from the
closed form's iteration formulas, so agreement between the two is evidence, not an identity.

This module is the simulation driver; the setting it runs (draft shapes, primitives, :class:`DesConfig`)
and its validation live in ``envs.split_des_config``, which needs no simpy.

## What is simulated (simpy, one process per client and one for the server)

Every client loops over iterations:

1. **Draft** on its own edge device: one pass per entry of ``DraftShape.pass_widths`` (a chain of
   depth ``g`` is ``g`` passes of one token; a tree forwards up to its beam count per level), each
   ``draft_pass_s(width, context)`` seconds.
2. **Send** the ``verify_tokens`` drafted tokens: one-way delay ``rtt/2`` (+ jitter) plus
   ``bytes / bandwidth``.
3. The **server** batches requests: when it is free it takes the oldest waiting request's cohort
   and waits (at most ``batch_window_s`` after that first arrival) until every client of that
   cohort has arrived, then runs one verify pass ``verify_s(b, verify_tokens, mean context)`` for
   the whole batch. With two cohorts the batches alternate, so the server verifies one cohort
   while the other drafts (pipeline-aware verification); with one cohort the server idles while
   everyone drafts.
4. The **verdict** comes back (``rtt/2`` + jitter + bytes / bandwidth). Acceptance is drawn level
   by level: level ``d`` is accepted with probability ``level_accept[d]`` given that the levels
   above it were (a chain: ``alpha`` per token); tokens gained = accepted levels + 1 (the bonus).
   For a tree, the accepted path is the edge's top path with ``reuse_path_prob`` given full depth.
5. **Proactive drafting** (switch ``proactive``): right after sending, the edge drafts the *next*
   block assuming every draft is accepted. The block is reused only if all levels were accepted
   along the path the edge extended **and** the target's bonus token equals the edge's guess
   (probability ``bonus_match``); then
   the passes already done are not repeated. Otherwise the block is discarded.
   ``proactive_gain="tokens"`` (SpecEdge's default ``excluded`` type): the edge drafts the
   ``proactive_shape``'s passes instead, and a reuse saves no passes: the next iteration drafts
   its full block on top of the ``h`` proactive levels finished in time and verifies
   ``deepened[h - 1]`` (acceptance, reuse path) instead of ``shape``; the verify pass is still
   priced at ``shape.verify_tokens`` (SpecEdge trims a deepened tree to its budget).

## Modelling choices (where the papers leave room)

* Proactive drafting stops when the verdict arrives; ``proactive_interrupt="step"`` (default)
  lets the pass in flight finish first (the edge GPU cannot abandon a kernel; SpecEdge's code even
  blocks for whole layers), ``"immediate"`` drops it at once (an idealised interruptible edge).
* The verify pass is priced at the batch's **mean** context (its sequences' KV are read once
  each; exact for the roofline, whose bytes are linear in the context sum).
* A client's context grows by the tokens it gains and restarts at ``prompt_tokens`` once it has
  produced ``output_tokens`` (a new request of the same shape), so a long run sees the same mean
  context as one request's lifetime.
* Jitter: each one-way delay is ``max(0, rtt/2 + N(0, rtt_jitter_s))``.
* Clients start staggered over one draft time per cohort so that cohorts settle into alternation;
  the first ``warmup_iterations`` of each client are dropped from every summary.

Outputs: per-iteration records (:class:`DesResult.records`) and the summary the closed form is
compared with -- mean client iteration time (one verdict to the next), inter-token latency
(iteration time per token gained), server throughput (tokens gained per second, all clients) and
the server's busy fraction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

from envs.split_des_config import (
    PROACTIVE_GAINS,
    PROACTIVE_INTERRUPTS,
    DesConfig,
    DesConfigError,
    DraftShape,
    SplitPrimitives,
)

# the setting's types live in envs.split_des_config; re-exported so `from envs.split_des import DesConfig` keeps working
__all__ = ["PROACTIVE_GAINS", "PROACTIVE_INTERRUPTS", "RECORD_FIELDS", "DesConfig", "DesConfigError", "DesResult", "DraftShape", "SplitPrimitives",
           "simulate"]


RECORD_FIELDS = (
    "client", "cohort", "iteration", "draft_start_s", "sent_s", "verify_start_s", "verify_end_s", "reply_s",
    "batch_size", "accepted", "tokens", "reused", "proactive_passes",
)


@dataclass
class DesResult:
    """Per-iteration records (arrays keyed by :data:`RECORD_FIELDS`, warm-up included) and summaries."""

    config: DesConfig
    records: dict[str, np.ndarray]
    server_busy_s: float  #: seconds the server spent in verify passes within the measured window
    window_s: tuple[float, float]  #: (start, end) of the measured window (seconds of simulated time)
    summary: dict[str, float] = field(default_factory=dict)


class _Request:
    __slots__ = ("client", "cohort", "context", "reply", "verify_start", "verify_end", "batch_size")

    def __init__(self, env: simpy.Environment, client: int, cohort: int, context: float):
        self.client, self.cohort, self.context = client, cohort, context
        self.reply = env.event()
        self.verify_start = self.verify_end = math.nan
        self.batch_size = 0


class _Server:
    """One verifying GPU: cohort-at-a-time batches, at most ``batch_window_s`` of waiting for stragglers."""

    def __init__(self, env: simpy.Environment, cfg: DesConfig, prim: SplitPrimitives, cohort_sizes: list[int], net_delay: Callable[[float], float]):
        self.env, self.cfg, self.prim = env, cfg, prim
        self.cohort_sizes = cohort_sizes
        self.queue: list[_Request] = []
        self.arrival = env.event()
        self.busy: list[tuple[float, float]] = []
        self.net_delay = net_delay
        env.process(self.run())

    def submit(self, req: _Request) -> None:
        self.queue.append(req)
        if not self.arrival.triggered:
            self.arrival.succeed()

    def _wait_arrival(self):
        if self.arrival.triggered:
            self.arrival = self.env.event()
        return self.arrival

    def run(self):
        env, cfg = self.env, self.cfg
        q = self.cfg.shape.verify_tokens
        while True:
            if not self.queue:
                yield self._wait_arrival()
                continue
            cohort = self.queue[0].cohort
            deadline = env.now + cfg.batch_window_s
            while sum(r.cohort == cohort for r in self.queue) < self.cohort_sizes[cohort] and env.now < deadline:
                waits = [self._wait_arrival()]
                if math.isfinite(deadline):
                    waits.append(env.timeout(deadline - env.now))
                yield env.any_of(waits)
            batch = [r for r in self.queue if r.cohort == cohort]
            self.queue = [r for r in self.queue if r.cohort != cohort]
            mean_ctx = float(np.mean([r.context for r in batch])) + q
            start = env.now
            yield env.timeout(self.prim.verify_s(len(batch), q, mean_ctx))
            self.busy.append((start, env.now))
            down = (self.prim.request_overhead_bytes + q * self.prim.bytes_per_reply_token) / self.prim.bandwidth_bytes_per_s
            for r in batch:
                r.verify_start, r.verify_end, r.batch_size = start, env.now, len(batch)
                env.process(self._deliver(r, down))

    def _deliver(self, req: _Request, transfer_s: float):
        yield self.env.timeout(self.net_delay(transfer_s))
        req.reply.succeed()


def simulate(cfg: DesConfig, prim: SplitPrimitives) -> DesResult:
    """Run one setting to ``warmup_iterations + iterations`` iterations per client."""
    env = simpy.Environment()
    rng = np.random.default_rng(cfg.seed)
    shape = cfg.shape
    cohort_of = [i % cfg.cohorts for i in range(cfg.num_clients)]
    cohort_sizes = [cohort_of.count(c) for c in range(cfg.cohorts)]
    half_rtt, jitter = prim.rtt_s / 2.0, prim.rtt_jitter_s

    def net_delay(transfer_s: float) -> float:
        base = half_rtt + (rng.normal(0.0, jitter) if jitter > 0 else 0.0)
        return max(0.0, base) + transfer_s

    server = _Server(env, cfg, prim, cohort_sizes, net_delay)
    total = cfg.warmup_iterations + cfg.iterations
    rec: dict[str, list] = {k: [] for k in RECORD_FIELDS}
    up_transfer = (prim.request_overhead_bytes + shape.verify_tokens * prim.bytes_per_draft_token) / prim.bandwidth_bytes_per_s
    levels = np.asarray(shape.level_accept)

    nodes = shape.level_nodes or (1,) * len(shape.pass_widths)
    before = np.concatenate([[0], np.cumsum(nodes)[:-1]])  # nodes drafted before each pass

    def draft_time(context: float, passes: range, of: DraftShape = shape) -> list[float]:
        ahead = before if of is shape else np.concatenate([[0], np.cumsum(of.level_nodes or (1,) * len(of.pass_widths))[:-1]])
        return [prim.draft_pass_s(of.pass_widths[i], context + ahead[i] + of.pass_widths[i]) for i in passes]

    tokens_gain = cfg.proactive_gain == "tokens"

    def client(i: int):
        cohort = cohort_of[i]
        generated = 0
        # stagger the second cohort by one draft block so cohorts start out of phase
        if cohort > 0:
            yield env.timeout(sum(draft_time(cfg.prompt_tokens, range(len(shape.pass_widths)))) * cohort / cfg.cohorts)
        ready = 0  # passes of the current block already drafted (proactively)
        cur = shape  # what this iteration verifies ("tokens": deepened after a reuse)
        for it in range(total):
            context = cfg.prompt_tokens + generated
            draft_start = env.now
            for t in draft_time(context, range(ready, len(shape.pass_widths))):
                yield env.timeout(t)
            req = _Request(env, i, cohort, context)
            sent = env.now
            yield env.timeout(net_delay(up_transfer))
            server.submit(req)
            done = 0
            if cfg.proactive:
                # draft the next block while the verdict is in flight, one pass at a time
                if tokens_gain:  # the proactive subtree, past the whole sent tree
                    steps = draft_time(context + shape.verify_tokens, range(len(cfg.proactive_shape.pass_widths)), cfg.proactive_shape)
                else:
                    steps = draft_time(context + shape.depth + 1, range(len(shape.pass_widths)))
                while done < len(steps) and not req.reply.triggered:
                    step = env.timeout(steps[done])
                    if cfg.proactive_interrupt == "step":
                        yield step
                        done += 1
                    else:
                        got = yield step | req.reply
                        if step in got:
                            done += 1
            yield req.reply  # returns at once if the verdict is already here
            # acceptance: levels pass in order until the first rejection
            draws = rng.random(cur.depth)
            fails = np.flatnonzero(draws >= (levels if cur is shape else np.asarray(cur.level_accept)))
            accepted = int(fails[0]) if len(fails) else cur.depth
            bonus_ok = rng.random() < cfg.bonus_match
            on_path = rng.random() < cur.reuse_path_prob
            reused = cfg.proactive and accepted == cur.depth and on_path and bonus_ok
            if tokens_gain:  # nothing saved; the next tree grows on the reused levels
                ready = 0
                cur = cfg.deepened[done - 1] if (reused and done > 0) else shape
            else:
                ready = done if reused else 0
            tokens = accepted + 1
            generated = generated + tokens
            if generated >= cfg.output_tokens:
                generated = 0
            for key, val in zip(RECORD_FIELDS, (i, cohort, it, draft_start, sent, req.verify_start, req.verify_end, env.now, req.batch_size, accepted, tokens, reused, done), strict=True):
                rec[key].append(val)

    for i in range(cfg.num_clients):
        env.process(client(i))
    env.run()
    records = {k: np.asarray(v) for k, v in rec.items()}
    return _summarise(cfg, records, server.busy)


def _summarise(cfg: DesConfig, records: dict[str, np.ndarray], busy: list[tuple[float, float]]) -> DesResult:
    it = records["iteration"]
    # the measured window: from the last client's end of warm-up to the first client's last reply,
    # so every client is in steady state throughout
    if cfg.warmup_iterations > 0:
        t0 = float(records["reply_s"][it == cfg.warmup_iterations - 1].max())
    else:
        t0 = 0.0
    last = cfg.warmup_iterations + cfg.iterations - 1
    t1 = float(records["reply_s"][it == last].min())
    inside = (records["reply_s"] > t0) & (records["reply_s"] <= t1)
    keep = it >= cfg.warmup_iterations
    # a client's iteration time: from its previous verdict to this one
    order = np.lexsort((it, records["client"]))
    reply = records["reply_s"][order]
    client = records["client"][order]
    prev = np.concatenate([[np.nan], reply[:-1]])
    prev[np.concatenate([[True], client[1:] != client[:-1]])] = np.nan
    cycle = np.empty_like(reply)
    cycle[order] = reply - prev
    measured = keep & np.isfinite(cycle)
    span = max(t1 - t0, 1e-12)
    busy_s = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in busy)
    tokens = records["tokens"]
    summary = {
        "iteration_s": float(cycle[measured].mean()),
        "itl_s": float(cycle[measured].sum() / tokens[measured].sum()),
        "tokens_per_iteration": float(tokens[keep].mean()),
        "server_throughput_tok_s": float(tokens[inside].sum() / span),
        "server_busy_fraction": busy_s / span,
        "mean_batch": float(records["batch_size"][keep].mean()),
        "reuse_rate": float(records["reused"][keep].mean()),
        "verify_wait_s": float((records["reply_s"] - records["sent_s"])[keep].mean()),
    }
    return DesResult(cfg, records, busy_s, (t0, t1), summary)
