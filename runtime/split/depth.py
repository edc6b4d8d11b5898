"""The per-client draft-depth controller: SpecEdge's calibration rule, applied online and
refined by the measured acceptance.

Pipeline without bubbles: while the server verifies the other cohort, this client drafts its next
block and the block travels, so the depth ``d`` should satisfy

    d * t_draft + t_network  ~=  t_verify

(``t_draft``: the edge's time per draft token, s; ``t_network``: the round trip without the
server's time, s; ``t_verify``: the server's time for one verification batch, s). Below that
crossing a deeper draft is free (the client waits for the server anyway); beyond it every extra
token costs ``t_draft`` of the client's period. With the measured per-token acceptance ``alpha``
the controller picks the depth maximising expected tokens per period,

    E(d) / (t_verify + max(d * t_draft + t_network, t_verify)),   E(d) = (1 - alpha^(d+1)) / (1 - alpha),

which is the rule's crossing when acceptance is moderate and a little deeper when it is high;
before any acceptance is known it answers the rule's ``round((t_verify - t_network) / t_draft)``.
All inputs are exponentially weighted means; the depth moves by at most ``max_step`` per
iteration (one outlier cannot swing it across the range), clamped to ``[min_depth, max_depth]``.
"""

from __future__ import annotations

import math


class DepthController:
    def __init__(self, min_depth: int = 1, max_depth: int = 8, initial: int = 4, smoothing: float = 0.3, max_step: int = 2):
        if not 1 <= min_depth <= initial <= max_depth:
            raise ValueError(f"need 1 <= min_depth <= initial <= max_depth, got {min_depth}, {initial}, {max_depth}")
        if not 0 < smoothing <= 1 or max_step < 1:
            raise ValueError(f"smoothing must lie in (0, 1] (got {smoothing}) and max_step >= 1 (got {max_step})")
        self.min_depth, self.max_depth, self.smoothing, self.max_step = min_depth, max_depth, smoothing, max_step
        self.current = initial
        self.draft_s: float | None = None
        self.network_s: float | None = None
        self.verify_s: float | None = None
        self.accepted = 0.0  #: decayed count of accepted drafts
        self.rejections = 0.0  #: decayed count of iterations that ended in a rejection

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def observe(self, draft_s_per_token: float | None, network_s: float, verify_s: float, accepted: int | None = None, depth: int | None = None) -> int:
        """One iteration's timings (``draft_s_per_token`` None when nothing was drafted) and,
        optionally, its verdict (``accepted`` of ``depth`` drafts); returns the next depth."""
        if draft_s_per_token is not None and draft_s_per_token > 0:
            self.draft_s = self._mean(self.draft_s, draft_s_per_token)
        self.network_s = self._mean(self.network_s, max(network_s, 0.0))
        self.verify_s = self._mean(self.verify_s, max(verify_s, 0.0))
        if accepted is not None and depth:
            keep = 1 - self.smoothing / 4  # acceptance is noisier than timings: a longer memory
            self.accepted = keep * self.accepted + accepted
            self.rejections = keep * self.rejections + (accepted < depth)
        target = self.ideal()
        if target is not None:
            self.current += max(-self.max_step, min(self.max_step, target - self.current))
        return self.current

    @property
    def alpha(self) -> float | None:
        total = self.accepted + self.rejections
        return min(self.accepted / total, 0.99) if total > 0 else None

    def ideal(self) -> int | None:
        """The best depth under the current means (None before a draft time is known)."""
        if self.draft_s is None or self.network_s is None or self.verify_s is None:
            return None
        alpha = self.alpha
        if alpha is None:
            d = (self.verify_s - self.network_s) / self.draft_s
            return int(min(self.max_depth, max(self.min_depth, math.floor(d + 0.5))))

        def tokens_per_s(d: int) -> float:
            tokens = (1 - alpha ** (d + 1)) / (1 - alpha)
            return tokens / (self.verify_s + max(d * self.draft_s + self.network_s, self.verify_s))

        return max(range(self.min_depth, self.max_depth + 1), key=tokens_per_s)
