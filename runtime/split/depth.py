"""The per-client draft-depth controller: SpecEdge's calibration rule, applied online and
refined by the measured acceptance and by how the verification time grows with the depth.

Pipeline without bubbles: while the server verifies the other cohort, this client drafts its next
block and the block travels, so the depth ``d`` should satisfy

    d * t_draft + t_network  ~=  t_verify(d)

(``t_draft``: the edge's time per draft token, s; ``t_network``: the round trip without the
server's time, s; ``t_verify(d)``: the server's time for one verification batch of depth ``d``, s).
This crossing is the model's rule, ``envs.split_cost.SplitCostModel.calibrated_depth`` (the depth
minimising ``|edge_iteration_s(d) - verify_s(d)|``, with the verify time priced at each depth);
the controller does not call it (it has no cost profile, only this client's measurements), so the
same rule is evaluated here on measured quantities. Below the crossing a deeper draft costs the client
nothing (it waits for the server anyway) except the verify time it adds; beyond it every extra
token also costs ``t_draft`` of the client's period. With the measured per-token acceptance
``alpha`` the controller picks the depth maximising expected tokens per period,

    E(d) / (t_verify(d) + max(d * t_draft + t_network, t_verify(d))),   E(d) = (1 - alpha^(d+1)) / (1 - alpha),

which is the rule's crossing when acceptance is high enough to fill the free depth and shallower
when acceptance is low and verification grows with depth (the tokens a deeper draft adds no
longer pay for the verify time it adds). Before any acceptance is known it answers the crossing
itself, ``round((v0 - t_network) / (t_draft - v1))``.

``t_verify(d) = v0 + v1 * d`` is fitted by exponentially weighted least squares on the observed
(depth, verify time) pairs once at least two distinct depths have been seen (``v1`` kept >= 0;
before that ``v1 = 0``: the measured mean at the one depth seen). A controller that sat at one
depth could not learn ``v1``, so it explores on a deterministic back-off schedule: on its
iterations 1, 2, 4, 8, 16, ... (exploration early, when the estimates are poorest, then rarer),
if the weighted spread of the depths seen (sum of squared deviations from their mean, depth^2)
is below ``min_spread``, it drafts one block ``probe_step`` deeper or shallower (alternately;
towards the range's inside at its ends) and then returns. Timings and acceptance are exponentially
weighted means; the depth moves by at most ``max_step`` per iteration (one outlier cannot swing it across the range) and
only when the target's predicted tokens/s beat the current depth's by ``hysteresis`` (relative;
the objective is flat near its top and noisy estimates would otherwise make it flap), clamped to
``[min_depth, max_depth]``.
"""

from __future__ import annotations

import math


class DepthController:
    def __init__(self, min_depth: int = 1, max_depth: int = 8, initial: int = 4, smoothing: float = 0.3, max_step: int = 2,
                 hysteresis: float = 0.02, probe_step: int = 2, min_spread: float = 2.0):
        if not 1 <= min_depth <= initial <= max_depth:
            raise ValueError(f"need 1 <= min_depth <= initial <= max_depth, got {min_depth}, {initial}, {max_depth}")
        if not 0 < smoothing <= 1 or max_step < 1:
            raise ValueError(f"smoothing must lie in (0, 1] (got {smoothing}) and max_step >= 1 (got {max_step})")
        if not 0 <= hysteresis < 1 or probe_step < 1 or min_spread < 0:
            raise ValueError(f"hysteresis must lie in [0, 1) (got {hysteresis}), probe_step >= 1 (got {probe_step}) "
                             f"and min_spread >= 0 (got {min_spread})")
        self.min_depth, self.max_depth, self.smoothing, self.max_step = min_depth, max_depth, smoothing, max_step
        self.hysteresis, self.probe_step, self.min_spread = hysteresis, probe_step, min_spread
        self._iterations = 0
        self.current = initial
        self.draft_s: float | None = None
        self.network_s: float | None = None
        self.verify_s: float | None = None  #: mean verify time over the depths seen, s (the fit's level)
        self.accepted = 0.0  #: decayed count of accepted drafts
        self.rejections = 0.0  #: decayed count of iterations that ended in a rejection
        # decayed least-squares sums of (depth, verify s): weight, d, d^2, v, d*v
        self._w = self._sd = self._sdd = self._sv = self._sdv = 0.0
        self._settled_depth = initial  #: the depth to return to after a probe
        self._probing = False
        self._probe_down = True  #: the next probe's direction (alternates)

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    @property
    def _keep(self) -> float:
        """Per-iteration decay of the acceptance counts and of the verify fit (a longer memory
        than the timing means: both are noisier than one timing)."""
        return 1 - self.smoothing / 4

    def observe(self, draft_s_per_token: float | None, network_s: float, verify_s: float, accepted: int | None = None, depth: int | None = None) -> int:
        """One iteration's timings (``draft_s_per_token`` None when nothing was drafted) and,
        optionally, its verdict (``accepted`` of ``depth`` drafts); returns the next depth.
        ``depth`` (the depth the timings belong to) defaults to the controller's current depth."""
        if draft_s_per_token is not None and draft_s_per_token > 0:
            self.draft_s = self._mean(self.draft_s, draft_s_per_token)
        self.network_s = self._mean(self.network_s, max(network_s, 0.0))
        d_seen = float(depth if depth else self.current)
        v = max(verify_s, 0.0)
        k = self._keep
        self._w, self._sd, self._sdd = k * self._w + 1, k * self._sd + d_seen, k * self._sdd + d_seen * d_seen
        self._sv, self._sdv = k * self._sv + v, k * self._sdv + d_seen * v
        self.verify_s = self._sv / self._w
        if accepted is not None and depth:
            self.accepted = k * self.accepted + accepted
            self.rejections = k * self.rejections + (accepted < depth)
        self._step()
        return self.current

    def _step(self) -> None:
        if self._probing:  # a probe lasts one iteration: back to where the controller stood
            self._probing, self.current = False, self._settled_depth
        target = self.ideal()
        if target is None:
            return
        rate = self._rate_fn()
        if rate is not None and rate(target) <= (1 + self.hysteresis) * rate(self.current):
            target = self.current  # not worth moving: the objective is flat here
        self.current += max(-self.max_step, min(self.max_step, target - self.current))
        self._settled_depth = self.current
        self._iterations += 1
        backoff = self._iterations & (self._iterations - 1) == 0  # iterations 1, 2, 4, 8, ...
        if backoff and self._spread() < self.min_spread:  # the verify slope is under-determined: look at another depth once
            down = self._probe_down if self.min_depth < self.current < self.max_depth else self.current == self.max_depth
            probe = self.current + (-self.probe_step if down else self.probe_step)
            self._probe_down = not down
            self.current, self._probing = min(self.max_depth, max(self.min_depth, probe)), True

    def _spread(self) -> float:
        """Weighted sum of squared deviations of the depths seen from their mean (depth^2)."""
        return self._sdd - self._sd * self._sd / self._w if self._w > 0 else 0.0

    def verify_fit(self) -> tuple[float, float] | None:
        """``(v0 s, v1 s per depth)`` of the fitted ``t_verify(d) = v0 + v1 * d`` (None before any
        observation); ``v1 = 0`` until two distinct depths have been seen, never negative."""
        if self._w <= 0:
            return None
        spread = self._spread()
        slope = 0.0
        if spread > 1e-9:
            slope = max(0.0, (self._sdv - self._sd * self._sv / self._w) / spread)
        return self.verify_s - slope * self._sd / self._w, slope

    @property
    def alpha(self) -> float | None:
        total = self.accepted + self.rejections
        return min(self.accepted / total, 0.99) if total > 0 else None

    def _rate_fn(self, extra_slope: float = 0.0):
        """Predicted tokens/s as a function of depth under the current estimates (None while
        the draft time, the network time, the verify fit or the acceptance is unknown)."""
        fit, alpha = self.verify_fit(), self.alpha
        if self.draft_s is None or self.network_s is None or fit is None or alpha is None:
            return None
        v0, v1 = fit
        v0, v1 = v0 - extra_slope * self._sd / self._w, v1 + extra_slope  # pivot about the mean depth seen

        def tokens_per_s(d: int) -> float:
            verify = max(v0 + v1 * d, 1e-9)
            tokens = (1 - alpha ** (d + 1)) / (1 - alpha)
            return tokens / (verify + max(d * self.draft_s + self.network_s, verify))

        return tokens_per_s

    def ideal(self) -> int | None:
        """The best depth under the current estimates (None before a draft time is known)."""
        fit = self.verify_fit()
        if self.draft_s is None or self.network_s is None or fit is None:
            return None
        rate = self._rate_fn()
        if rate is None:  # no acceptance yet: the calibration rule's crossing
            v0, v1 = fit
            d = (v0 - self.network_s) / (self.draft_s - v1) if self.draft_s > v1 else self.max_depth
            return int(min(self.max_depth, max(self.min_depth, math.floor(d + 0.5))))
        return max(range(self.min_depth, self.max_depth + 1), key=rate)
