"""Running a planned round's batches on the engines, and handing their output to the event loop.

On one device the AD and SD batches share it by weighted time-slicing (:func:`run_shared`); on two
devices each runs in its own thread (:func:`run_parallel`). Both measure each batch's own device
time (for the online calibration) and stop at the next step once ``cancel`` is set (shutdown).
An exception inside an engine propagates to the caller, which ends the round's requests with an
outcome; nothing here swallows it.

:class:`Outbox` carries streamed text and finished rows from the engine threads to the event loop:
at most one wake-up of the loop per engine step, and per stream a send at most every
``interval_s`` (the first at once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.engines import GenerationResult, RowEnd, drain
from runtime.live_request import LiveRequest
from runtime.metrics import ServeMetrics

if TYPE_CHECKING:
    from runtime.device_turns import DeviceTurns


class Cancelled(RuntimeError):
    """The round was cancelled (shutdown ran out of time)."""


@dataclass
class BatchRun:
    result: GenerationResult
    device_s: float  #: seconds this batch held the device (its own steps only)


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("round cancelled")


def run_shared(jobs: dict[str, tuple[Generator, float]], after_step: Callable[[], None] | None = None,
               cancel: threading.Event | None = None, turns: DeviceTurns | None = None, party: str = "engine") -> dict[str, BatchRun]:
    """Step several engine generators on one device with compute shares by weighted time-slicing.

    ``jobs`` maps a name to ``(generator, share)``; the job with the least ``used time / share``
    steps next, so over any stretch each gets its share of the device; ``after_step`` runs after
    every step (outside the timed part). With ``turns`` (another thread uses the device too: the
    split verifier) each step is taken as one of ``party``'s turns; a step's time excludes its wait.
    """
    used = dict.fromkeys(jobs, 0.0)
    results: dict[str, BatchRun] = {}
    live = dict(jobs)
    while live:
        name = min(live, key=lambda n: used[n] / max(live[n][1], 1e-9))
        gen = live[name][0]
        with turns.turn(party) if turns is not None else nullcontext():
            _check(cancel)  # after the wait for the turn: a round cancelled while it waited runs no step
            start = time.perf_counter()
            try:
                next(gen)
            except StopIteration as stop:
                used[name] += time.perf_counter() - start
                results[name] = BatchRun(stop.value, used[name])
                del live[name]
            else:
                used[name] += time.perf_counter() - start
        if after_step is not None:
            after_step()
    return results


def run_parallel(jobs: dict[str, Generator], after_step: Callable[[], None] | None = None,
                 cancel: threading.Event | None = None) -> dict[str, BatchRun]:
    """Run engine generators at the same time, one thread each (one device each)."""

    def step_done() -> None:
        _check(cancel)
        if after_step is not None:
            after_step()

    def timed(gen: Generator) -> BatchRun:
        result = drain(gen, step_done)
        return BatchRun(result, result.seconds)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(timed, gen) for name, gen in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


class Outbox:
    """Streamed text and finished requests, from engine threads to the event loop."""

    def __init__(self, loop, deliver: Callable[[list, list], None], interval_s: float, metrics: ServeMetrics):
        self.loop, self.deliver, self.interval_s, self.metrics = loop, deliver, interval_s, metrics
        self.lock = threading.Lock()  # two devices: two engine threads at once
        self.pending: dict[str, LiveRequest] = {}  # requests with news for the event loop
        self.last_sent: dict[str, float] = {}

    def tokens(self, r: LiveRequest, new: list[int]) -> None:
        now = time.monotonic()
        with self.lock:
            if r.completed_at is not None:  # ended at a stop sequence: the engine runs on, the request does not
                return
            if r.first_token_at is None:
                r.first_token_at = now
                self.metrics.ttft.observe(now - r.arrival)
            elif r.last_token_at is not None:
                gap = (now - r.last_token_at) / len(new)
                for _ in new:
                    self.metrics.itl.observe(gap)
            r.last_token_at = now
            r.text.feed(new)
            if r.text.stopped:
                self._complete(r, "stop", now)
            self.pending[r.id] = r

    def finish_row(self, r: LiveRequest, end: RowEnd | None) -> None:
        """The engine is done with the request's row (``end``: its own counters; None: the batch ended)."""
        with self.lock:
            if end is not None and end.iterations:
                r.sd_iterations, r.sd_accepted, r.sd_rejections = end.iterations, end.accepted, end.rejections
            if r.completed_at is None:
                self._complete(r, "stop" if end is not None and end.eos else "length", time.monotonic())
                self.pending[r.id] = r

    def _complete(self, r: LiveRequest, reason: str, now: float) -> None:
        r.completed_at, r.finish_reason = now, reason
        self.metrics.generated(r.text.tokens)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        texts: list[tuple[LiveRequest, str]] = []
        ends: list[LiveRequest] = []
        with self.lock:
            for r in list(self.pending.values()):
                done = r.completed_at is not None
                last = self.last_sent.get(r.id)
                if r.stream and (force or done or last is None or now - last >= self.interval_s):
                    piece = r.text.take(final=done)
                    if piece:
                        texts.append((r, piece))
                        self.last_sent[r.id] = now
                if done:
                    ends.append(r)
                    del self.pending[r.id]
                elif not r.stream or r.text.sent == len(r.text.text):
                    del self.pending[r.id]
        if texts or ends:
            self.loop.call_soon_threadsafe(self.deliver, texts, ends)


def row_sampling(members: list[LiveRequest]) -> dict[str, list]:
    """The engines' per-row sampling arguments: each request's own temperature, top_p and seed."""
    return {"temperature": [r.temperature for r in members], "top_p": [r.top_p for r in members], "seed": [r.seed for r in members]}


def batch_callbacks(members: list[LiveRequest], outbox: Outbox) -> dict[str, Any]:
    """The engine callbacks for one batch: rows are the members' positions."""
    return {"on_tokens": lambda row, new: outbox.tokens(members[row], new), "on_finish": lambda end: outbox.finish_row(members[end.row], end)}
