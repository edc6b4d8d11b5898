"""The round trip an edge user reports to the server: what its own verification round trips took.

A real edge client cannot tell propagation from the rest: it measures a verification's round trip
(send to the moment it takes up the verdict) and subtracts the server's queue wait and compute,
which the verdict reports (:attr:`runtime.split.edge_client.IterationLog.network_ms`). The server
plans an ED user with the round trip the user reports (``PlaceMsg.rtt_s``: the deadline check and
the depth calibration), and ``experiments.split_sim_vs_real`` simulates with the same number.

Here the WAN is emulated (:class:`~runtime.split.transport.DelayedLink`, a delay chosen per request),
so an iteration's network time is the emulated delay plus the *stack time*: gRPC on loopback, both
processes' threads, the delay line's wake-ups, and -- with proactive drafting -- the edge finishing
the draft step it is in when the verdict arrives (it looks for the verdict between steps). On the
project's CPU runs the stack took 2.3 to 3.9 ms per round trip beyond the emulated delay (per-run
means of the eight ``split_sim_vs_real`` runs before this module, two edge users each); the emulated
delay alone leaves that out of every plan. :class:`MeasuredRtt` keeps the recent per-iteration excess
of the measured network time over the emulated mean delay it ran under;
:class:`runtime.split_placement.EdgeUser` (``rtt_report="measured"``, the default) reports
``emulated mean delay + mean excess`` for its next request: the round trip a client on a real link
with this stack would measure. ``rtt_report="link"`` reports the emulated RTT alone (what every run
before 2026-12-03, stop 43, did).

**Choices.** The excess is averaged over the window and only the mean is clamped at 0: with jitter
an iteration's own excess may be negative (its delay drew below the mean), and clamping each one
would bias the estimate up. The estimate moves only with the user's own ED iterations (a user
placed in AD or SD keeps its last one), so a probe (``EdgeUser.probe_link``) seeds it; the report
is capped at :data:`MAX_RTT_S`, the server's bound on ``rtt_s``, so a pathological estimate cannot
get every later request refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

#: what an edge user reports as its round trip: measured (emulated delay + the stack, this module) or link (the emulated delay)
RTT_REPORTS = ("measured", "link")
#: the largest round trip a placement request may carry, s (the server refuses more: INVALID_ARGUMENT)
MAX_RTT_S = 10.0


class MeasuredRtt:
    """Recent stack time per verification round trip, seconds, beyond an emulated delay.

    ``window``: how many of the latest iterations the mean covers (a few requests' worth, so the
    estimate follows the load without jumping on one slow round trip)."""

    def __init__(self, window: int = 64):
        if window < 1:
            raise ValueError(f"window must be >= 1 iterations, got {window}")
        self._excess_s: deque[float] = deque(maxlen=window)

    def observe(self, network_ms: Iterable[float], emulated_s: float) -> None:
        """Record iterations' measured network times (ms) that ran under an emulated mean delay of
        ``emulated_s`` seconds (the link's RTT plus its mean jitter)."""
        for ms in network_ms:
            if ms == ms and ms >= 0:  # a NaN or negative time (a clock step) says nothing about the stack
                self._excess_s.append(ms / 1e3 - emulated_s)

    @property
    def stack_s(self) -> float:
        """Mean excess over the window, clamped at 0, s (0 before any iteration)."""
        return max(0.0, sum(self._excess_s) / len(self._excess_s)) if self._excess_s else 0.0

    @property
    def observed(self) -> int:
        """Iterations in the window."""
        return len(self._excess_s)

    def rtt_s(self, emulated_s: float) -> float:
        """The round trip a client would measure on a link emulated at ``emulated_s`` (mean delay, s),
        capped at :data:`MAX_RTT_S`."""
        return min(emulated_s + self.stack_s, MAX_RTT_S)
