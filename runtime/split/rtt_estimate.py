"""The round trip an edge user reports to the server: what its own verification round trips took.

A real edge client cannot tell propagation from the stack: it measures a verification's round trip
(send to verdict) and subtracts the server's queue wait and compute, which the verdict reports
(:attr:`runtime.split.edge_client.IterationLog.network_ms`). The server plans an ED user with the
round trip the user reports (``PlaceMsg.rtt_s``: the deadline check and the depth calibration), and
``experiments.split_sim_vs_real`` simulates with the same number.

Here the WAN is emulated (:class:`~runtime.split.transport.DelayedLink`, a delay chosen per request),
so an iteration's network time is the emulated delay plus the *stack*: gRPC on loopback, both
processes' threads, the delay line's wake-ups. On the project's CPU runs the stack took 2.3 to 3.9 ms
per round trip beyond the emulated delay (the means of eight ``split_sim_vs_real`` runs), more with
more edges sharing the edge process's core; the emulated delay alone leaves that out of every plan.
:class:`MeasuredRtt` keeps the recent per-iteration excess of the measured network time over the
emulated delay it ran under; :class:`runtime.split_placement.EdgeUser` (``rtt_report="measured"``,
the default) reports ``emulated delay + mean excess`` for its next request: the round trip a client
on a real link with this stack would measure. ``rtt_report="link"`` reports the emulated delay
alone (what every run before 2026-12-03, stop 43, did).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

#: what an edge user reports as its round trip: measured (emulated delay + the stack, this module) or link (the emulated delay)
RTT_REPORTS = ("measured", "link")


class MeasuredRtt:
    """Recent stack time per verification round trip, seconds, beyond an emulated delay.

    ``window``: how many of the latest iterations the mean covers (a few requests' worth, so the
    estimate follows the load without jumping on one slow round trip)."""

    def __init__(self, window: int = 64):
        if window < 1:
            raise ValueError(f"window must be >= 1 iterations, got {window}")
        self._excess_s: deque[float] = deque(maxlen=window)

    def observe(self, network_ms: Iterable[float], emulated_s: float) -> None:
        """Record iterations' measured network times (ms) that ran under an emulated delay of
        ``emulated_s`` seconds (the link's RTT plus its mean jitter)."""
        for ms in network_ms:
            if ms == ms and ms >= 0:  # a NaN or negative time (a clock step) says nothing about the stack
                self._excess_s.append(max(0.0, ms / 1e3 - emulated_s))

    @property
    def stack_s(self) -> float:
        """Mean excess over the window, s (0 before any iteration)."""
        return sum(self._excess_s) / len(self._excess_s) if self._excess_s else 0.0

    @property
    def observed(self) -> int:
        """Iterations in the window."""
        return len(self._excess_s)

    def rtt_s(self, emulated_s: float) -> float:
        """The round trip a client would measure on a link emulated at ``emulated_s`` (mean delay, s)."""
        return emulated_s + self.stack_s
