"""What the queue's deadline check needs beyond the profile: how early to decide a rejection so the
answer reaches the client in time, when the client sent the request, and each request's price.

A rejection decided at time ``t`` reaches the client later: the handler task must run, the 429 or
the stream's last event be written, and the kernel and the client must read it. On a busy event
loop (a burst of hundreds of requests on a small host) that answer delay is hundreds of ms, and a
rejection decided "just in time" on the server's clock arrives after the deadline on the client's.

:class:`AnswerMargin` learns that delay online from the server's own observations -- for every
rejection, the time from the decision to the moment its last byte was handed to the transport --
and from the event loop's wake-up lag, and keeps an upper estimate: an exponentially weighted mean
plus ``k_sd`` standard deviations, bounded to ``[0, max_s]`` so one stalled write cannot make the
server reject everything. The queue's deadline check adds it (and one sweep interval) to a
request's earliest finish; the value is exported as ``specsched_answer_margin_seconds``.

:func:`client_sent_lead_s` reads the client's send time (``X-Request-Start: t=<µs since the
epoch>``, the convention of Heroku's router and New Relic), so a request's deadline counts from
when its client sent it, not from when a busy server got round to reading it.

:func:`price_alone` sets each queued request's time alone on the device, per mode, for a whole
burst in one vectorised call.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from envs.cost_model import CostModel, sd_iterations1
from runtime.live_request import LiveRequest

SENT_HEADER = b"x-request-start"  #: ASGI header names are lower-case bytes
MAX_SENT_LEAD_S = 10.0  #: a send stamp further in the past than this is treated as clock skew and ignored
MAX_SENT_AHEAD_S = 1.0  #: a stamp this far in the future is skew too; a smaller lead counts as "sent now"


def client_sent_lead_s(value: bytes | str | None, now_unix_s: float) -> float:
    """Seconds between the client's send stamp and ``now_unix_s`` (both wall clock), in
    ``[0, MAX_SENT_LEAD_S]``; 0 when there is no stamp, it cannot be parsed or it is off by more
    than the bounds (another host's clock). Accepts ``t=<µs>`` and ``<µs>`` (integer or decimal)."""
    if value is None:
        return 0.0
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if text.startswith("t="):
        text = text[2:]
    try:
        sent_unix_s = float(text) / 1e6
    except ValueError:
        return 0.0
    lead = now_unix_s - sent_unix_s
    if not math.isfinite(lead) or lead > MAX_SENT_LEAD_S or lead < -MAX_SENT_AHEAD_S:
        return 0.0
    return max(lead, 0.0)


def sent_header_value(now_unix_s: float) -> str:
    """The header value a client sends: ``t=<µs since the epoch>``."""
    return f"t={int(now_unix_s * 1e6)}"


class AnswerMargin:
    """Upper estimate of the delay between deciding a request's outcome and its answer leaving the
    server (seconds): EMA mean + ``k_sd`` EMA standard deviations of the observed delays, and never
    below the event loop's smoothed wake-up lag; bounded to ``[0, max_s]``."""

    def __init__(self, weight: float = 0.1, k_sd: float = 2.0, max_s: float = 2.0):
        if not 0 < weight <= 1:
            raise ValueError(f"answer margin weight must be in (0, 1], got {weight}")
        if not 0 <= k_sd < math.inf:
            raise ValueError(f"answer margin k_sd must be >= 0, got {k_sd}")
        if not 0 < max_s < math.inf:
            raise ValueError(f"answer margin max_s must be > 0, got {max_s}")
        self.weight, self.k_sd, self.max_s = float(weight), float(k_sd), float(max_s)
        self.mean = 0.0
        self.var = 0.0
        self.samples = 0
        self.loop_lag_s = 0.0  #: EMA of how late the queue's sweeper wakes up
        self._lock = threading.Lock()

    def observe(self, delay_s: float) -> None:
        """One answer's delay (decision to last byte handed to the transport); bad values are ignored."""
        if not (math.isfinite(delay_s) and delay_s >= 0):
            return
        x = min(delay_s, self.max_s)
        with self._lock:
            if self.samples == 0:
                self.mean, self.var = x, 0.0
            else:
                w, d = self.weight, x - self.mean
                self.mean += w * d
                self.var = (1 - w) * (self.var + w * d * d)
            self.samples += 1

    def observe_lag(self, lag_s: float) -> None:
        """How late a timer of the event loop fired (seconds); smoothed, weight 0.3."""
        if math.isfinite(lag_s):
            self.loop_lag_s = 0.7 * self.loop_lag_s + 0.3 * min(max(lag_s, 0.0), self.max_s)

    @property
    def value(self) -> float:
        """The margin to add to a request's earliest finish, in ``[0, max_s]`` seconds."""
        upper = self.mean + self.k_sd * math.sqrt(self.var)
        return min(max(upper, self.loop_lag_s, 0.0), self.max_s)


def price_alone(cost: CostModel, reqs: list[LiveRequest], alpha: float, gamma: int) -> None:
    """Set ``alone_s`` -- the profile's seconds for the request alone on the device, (AD, SD at
    depth ``gamma`` and acceptance ``alpha``) -- of each request where not set yet: one vectorised
    call for all of them (a measured profile's point-by-point times cost ~0.1 ms per request, 640 of
    them ~1 ms in one call); one or two by the scalar path, which is cheaper for so few."""
    todo = [r for r in reqs if r.alone_s is None]
    if not todo:
        return
    if len(todo) <= 2:
        for r in todo:
            s1, n1 = len(r.prompt_ids), r.max_tokens
            r.alone_s = (cost.ad_time1(1, s1, n1), cost.sd_time1(1, s1, n1, sd_iterations1(n1, alpha, gamma), gamma))
        return
    s = np.array([len(r.prompt_ids) for r in todo], dtype=np.int64)
    n = np.array([r.max_tokens for r in todo], dtype=np.int64)
    j = np.array([sd_iterations1(int(k), alpha, gamma) for k in n], dtype=np.int64)
    ones = np.ones(len(todo), dtype=np.int64)
    ad = np.broadcast_to(cost.ad_time(ones, s, n), s.shape).tolist()
    sd = np.broadcast_to(cost.sd_time(ones, s, n, j, gamma), s.shape).tolist()
    for r, a, b in zip(todo, ad, sd, strict=True):
        r.alone_s = (float(a), float(b))
