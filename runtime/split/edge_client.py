"""One edge client: serves its user's requests one after another by drafting locally and asking
the server (through any :class:`~runtime.split.transport.VerifierLink`) to verify.

Per iteration: propose ``depth`` drafts (the chain may already hold them from proactive drafting),
send, and -- with ``proactive`` on -- keep drafting one token at a time until the reply arrives
(at most ``2 * depth + 1`` tokens: the block, the guessed bonus and a next block of the same depth), then
commit the verdict. Clients that share one draft device pass it as ``draft_device``: a
:class:`~runtime.split.draft_device.SharedDraftDevice` drafts their blocks one after another, first
come, first served, and proactive drafting only uses it when no client drafts or waits to; a
:class:`~runtime.split.batched_drafter.BatchedDrafter` drafts every waiting client's next token in
one batched step. Every iteration is logged (:class:`IterationLog`); every request ends with
exactly one :class:`RequestOutcome` (``length``, ``eos``, ``error`` or ``timeout``; or the outcome an
``on_tokens`` callback names to end it early, e.g. ``stop`` at a stop sequence or ``cancelled``
when its HTTP client went away: the edge's local endpoint, :mod:`runtime.edge_http`).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from runtime.split.batched_drafter import BatchedDrafter
from runtime.split.depth import DepthController
from runtime.split.draft_device import SharedDraftDevice
from runtime.split.drafter import DraftChain, DraftSession
from runtime.split.transport import VerifierLink
from runtime.split.verifier import VerifyRequest


@dataclass(frozen=True)
class IterationLog:
    request_id: str
    iteration: int
    depth: int
    sent_at: float  #: edge wall clock, s
    arrived_at: float  #: server wall clock when queued, s (same clock on one host)
    reply_at: float  #: edge wall clock, s
    draft_ms: float  #: drafting before the send (proactive drafting excluded)
    proactive_ms: float  #: drafting while the reply was in flight
    queue_wait_ms: float
    server_compute_ms: float
    network_ms: float  #: round trip minus queue and compute
    batch_size: int
    cohort: int
    accepted: int
    emitted: int  #: tokens this iteration added to the output (after the limit and EOS)
    proactive_hit: bool
    device_wait_ms: float = 0.0  #: on-demand drafting's wait for a shared draft device to take it (0 with a device of its own)
    batch_prompts: int = 0  #: rows of the verification batch that began a request (their prefill is in server_compute_ms)


@dataclass
class RequestOutcome:
    request_id: str
    prompt_tokens: int
    tokens: list[int]
    outcome: str  #: length | eos | error | timeout, or what an ``on_tokens`` callback ended it with
    started_at: float  #: wall clock, s
    ended_at: float
    first_token_at: float | None = None
    error: str = ""
    iterations: list[IterationLog] = field(default_factory=list)

    @property
    def itl_ms(self) -> float | None:
        """Inter-token latency after the first iteration (which includes the prefill): the time
        from the first iteration's reply to the last one's, per token emitted in between."""
        its = self.iterations
        emitted = sum(log.emitted for log in its[1:])
        return 1e3 * (its[-1].reply_at - its[0].reply_at) / emitted if len(its) > 1 and emitted else None


def describe_error(exc: BaseException) -> str:
    """One line for a failed request: a gRPC error's status and details (its ``str`` is a
    multi-line dump), any other exception's type and message."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        try:
            return f"the verification stream failed: {code().name} ({details()})"
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            pass
    return f"{type(exc).__name__}: {exc}"


class EdgeClient:
    def __init__(self, draft, link: VerifierLink, depth: int | DepthController = 4, proactive: bool = True, max_depth: int = 8,
                 eos_id: int | None = None, reply_timeout_s: float = 30.0, on_iteration: Callable[[IterationLog], None] | None = None,
                 draft_device: SharedDraftDevice | BatchedDrafter | None = None):
        if isinstance(depth, int) and not 0 <= depth <= max_depth:
            raise ValueError(f"depth must lie in [0, {max_depth}], got {depth}")
        self.draft, self.link, self.depth, self.proactive, self.max_depth = draft, link, depth, proactive, max_depth
        self.eos_id, self.reply_timeout_s, self.on_iteration = eos_id, reply_timeout_s, on_iteration
        self.broken = False  #: the last request failed on its link; use a new link before the next
        #: clients drafting one after another on one device share its arbiter (speculation never delays another user's block)
        self.arbiter = draft_device if isinstance(draft_device, SharedDraftDevice) else None
        #: clients drafting in one batch share the device that batches them (it is the arbiter)
        self.batcher = draft_device if isinstance(draft_device, BatchedDrafter) else None

    def _speculate(self, session: DraftChain, fut, wake: threading.Event) -> None:
        """One proactive draft step -- unless the shared draft device is drafting or promised to
        another client's block, which goes first (then sleep until it is free or the reply is in)."""
        with self.arbiter.if_idle() as granted:
            if granted:
                session.draft_one()
                return
        self.arbiter.wait_idle(wake, fut.done, timeout_s=0.05)

    def _next_depth(self) -> int:
        return self.depth.current if isinstance(self.depth, DepthController) else self.depth

    def generate(self, prompt: list[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0, request_id: str | None = None,
                 on_tokens: Callable[[list[int]], str | None] | None = None) -> RequestOutcome:
        """One request, to its one outcome. ``on_tokens`` gets each iteration's new output tokens
        (on this thread) and may end the request there by returning an outcome name."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompt:
            raise ValueError("prompt needs at least one token")
        rid = request_id or uuid.uuid4().hex[:12]
        out = RequestOutcome(rid, len(prompt), [], "length", time.time(), 0.0)
        session = None
        try:
            session = self.batcher.session(prompt) if self.batcher is not None else DraftSession(self.draft, prompt)
            self._loop(session, prompt, max_new_tokens, temperature, seed, out, on_tokens)
        except FutureTimeout:
            out.outcome, out.error = "timeout", f"no verdict within {self.reply_timeout_s} s"
        except Exception as exc:  # noqa: BLE001 - a failed link ends this request with an outcome, not a crash
            out.outcome, out.error = "error", describe_error(exc)
        finally:
            out.ended_at = time.time()
            if session is not None:
                session.close()
            self.link.release()
        # after an error or a timeout a late reply could answer the next request: the owner must
        # give this client a fresh link (``broken``)
        self.broken = out.outcome in ("error", "timeout")
        return out

    def _loop(self, session: DraftChain, prompt: list[int], max_new: int, temperature: float, seed: int, out: RequestOutcome,
              on_tokens: Callable[[list[int]], str | None] | None = None) -> None:
        first, it = True, 0
        while True:
            remaining = max_new - len(out.tokens)
            depth = min(self._next_depth(), remaining - 1)  # never draft past the token limit
            steps0, d0, w0 = session.draft_steps, session.draft_seconds, session.wait_seconds
            # the device only when the block needs drafting (not when speculation already holds it, nor at depth 0)
            need_device = self.arbiter is not None and depth > 0 and len(session.chain) < depth
            with self.arbiter.on_demand() if need_device else contextlib.nullcontext(0.0) as waited_s:
                drafts = session.propose(depth) if depth > 0 else []
            waited_s += session.wait_seconds - w0  # a batching device's wait (the arbiter's is 0 here, and vice versa)
            new_drafted = session.draft_steps - steps0
            draft_s = session.draft_seconds - d0
            req = VerifyRequest("", tuple(drafts), tuple(prompt) if first else (), len(session.tokens), temperature, seed)
            sent_at, t_send = time.time(), time.perf_counter()
            fut = self.link.submit(req)
            p0, ps0, h0 = session.draft_seconds, session.draft_steps, session.held_seconds
            if self.proactive and self.arbiter is None:  # the guessed bonus and one more block, or until the verdict
                session.extend(2 * depth + 1, stop=fut.done, speculative=True)
            elif self.proactive:
                wake = threading.Event()  # a speculator asleep on the busy shared device stops at once
                fut.add_done_callback(lambda _f, wake=wake: wake.set())
                while not fut.done() and len(session.chain) < 2 * depth + 1:
                    self._speculate(session, fut, wake)
                self.arbiter.pass_on()  # a wake-up this client got but will not use goes to the next speculator
            reply = fut.result(timeout=self.reply_timeout_s)
            t_reply = time.perf_counter()
            # the steps a yielding device held it back for others' blocks are not drafting time
            proactive_s, proactive_steps = session.draft_seconds - p0 - (session.held_seconds - h0), session.draft_steps - ps0
            before = len(session.tokens)
            hit = session.commit(depth, reply.accepted, reply.bonus)
            if reply.committed != len(session.tokens):
                raise RuntimeError(f"desynchronised: the server holds {reply.committed} tokens, the edge {len(session.tokens)}")
            new = session.tokens[before:][:remaining]
            if self.eos_id is not None and self.eos_id in new:
                new = new[: new.index(self.eos_id) + 1]
                out.outcome = "eos"
            if new and out.first_token_at is None:
                out.first_token_at = time.time()
            out.tokens.extend(new)
            round_trip_ms = 1e3 * (t_reply - t_send)
            network_ms = round_trip_ms - reply.queue_wait_ms - reply.compute_ms
            log = IterationLog(out.request_id, it, depth, sent_at, reply.arrived_at, time.time(), 1e3 * draft_s, 1e3 * proactive_s,
                               reply.queue_wait_ms, reply.compute_ms, network_ms, reply.batch_size, reply.cohort, reply.accepted, len(new), hit, 1e3 * waited_s,
                               reply.prompts)
            out.iterations.append(log)
            if self.on_iteration:
                self.on_iteration(log)
            if isinstance(self.depth, DepthController):
                # every token drafted this iteration is a sample of the per-token time: with proactive
                # hits the block is drafted ahead, and an estimate fed by on-demand drafting alone went
                # stale (one slow first block held clients at depth 1 for a whole run); the first
                # block's on-demand time carries the prompt's prefill, not a per-token cost
                spent, drafted = proactive_s + (0.0 if first else draft_s), proactive_steps + (0 if first else new_drafted)
                per_token = spent / drafted if drafted else None
                # likewise a batch that prefilled a prompt (this client's first, or another client's)
                # is not a verification sample: one such outlier at a low depth turned the verify
                # slope's fit flat or negative (results/depth_settle/temperature1_texts, at 5 ms)
                verify_s = reply.compute_ms / 1e3 if reply.prompts == 0 and not first else None
                self.depth.observe(per_token, network_ms / 1e3, verify_s, reply.accepted, depth)
            first, it = False, it + 1
            if on_tokens is not None and (ended := on_tokens(new)):
                out.outcome = ended
                return
            if out.outcome == "eos" or len(out.tokens) >= max_new:
                return
