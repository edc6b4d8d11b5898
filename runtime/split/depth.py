"""The per-client draft-depth controller: SpecEdge's calibration rule, applied online and
refined by the measured acceptance and by how the verification time grows with the depth.

Pipeline without bubbles: while the server verifies the other cohort, this client drafts its next
block and the block travels, so the depth ``d`` should satisfy

    d * t_draft + t_network  ~=  t_verify(d)

(``t_draft``: the edge's time per draft token, s; ``t_network``: the round trip without the
server's time, s; ``t_verify(d)``: the server's time for one verification batch of depth ``d``, s).
That crossing is the model's calibration rule (``envs.split_cost.SplitCostModel.calibrated_depth``;
the runtime cannot import ``envs/``, and the controller has only this client's measurements, so the
rule is evaluated here on them). Below the crossing a deeper draft costs the client only the
verify time it adds; beyond it every extra token also costs ``t_draft`` of the client's period.
With the per-token acceptance ``alpha`` the controller picks the depth maximising expected tokens
per period,

    E(d) / (t_verify(d) + max(d * t_draft + t_network, t_verify(d))),   E(d) = (1 - alpha^(d+1)) / (1 - alpha).

**Acceptance** is a Beta-shrunk estimate: decayed counts of accepted drafts and of rejecting
iterations (the truncated-geometric likelihood's sufficient statistics) plus ``prior_weight``
pseudo-rejections and ``prior_weight * prior_alpha / (1 - prior_alpha)`` pseudo-acceptances, so
the first few verdicts cannot whipsaw the depth; ``prior_alpha`` comes from the profile's
predicted acceptance when the edge process has one (:func:`runtime.edge_profile.calibrated_start`).

**Verification time** ``t_verify(d) = v0 + v1 * d`` is fitted by decayed least squares on the
observed (depth, verify s) pairs, the slope shrunk towards 0 (flat verification, as on a
memory-bound accelerator) like a ridge of weight ``min_spread`` depth^2: ``v1 = cov / (spread +
min_spread)``, kept >= 0, and used only once the depths seen have ``spread`` (weighted sum of
squared deviations from their mean) >= ``min_spread``; before that the verify time is the mean
seen, at every depth. A batch that prefilled a prompt is no sample (the edge passes ``verify_s``
None for it: the server reports how many rows began a request): one such batch costs a prefill on
top of its verification, and fed to the fit, a few of them at depths below the client's mean
flattened the slope to 0 and kept the controller too deep (``results/depth_settle``, sampling at
5 ms RTT). A controller sitting at one depth cannot learn ``v1``, so it probes: on
its iterations 1, 2, 4, 8, ... (a back-off: early, when the estimates are poorest, then rarer)
while the spread is short, it drafts one block ``probe_step`` away and returns to its depth next
iteration. Which way (``probe``): ``inside`` (the default) towards the inside of the range;
``cheaper`` towards the side the current estimates predict more tokens/s for (``inside`` while
they cannot, i.e. before the first draft time and verdict). Why the switch: a probe costs
tokens, and an ``inside`` probe from depth 5-6 goes down to 1-2 when the best depth is 8; with
proactive drafting the first iteration already yields a draft time, the controller's first step
lands there, and over short requests that probe lowered the mean depth (``experiments.split_bench``'s
docstring; ``results/split_bench/ab_probe_cheaper``). Probes happen only while the depths seen have
little spread, when the fit's slope is still 0: a ``cheaper`` probe's choice assumes flat
verification, the very thing the probe is there to test, so it mostly goes up.

**Choice.** The predicted tokens/s of every depth; the depths within ``tolerance`` (relative) of
the best form a band (the objective is flat near its top, and with verification growing in depth
its argmax moves with every acceptance estimate), and the band's middle depth is the target. The
depth moves by at most ``max_step`` per iteration (one outlier cannot swing it across the range),
clamped to ``[min_depth, max_depth]``. Before any acceptance is known it answers the crossing.

**Hold** (``hold``, off by default). With ``hold > 0`` the controller keeps its depth while that
depth's predicted tokens/s is within ``hold`` (relative) of the best depth's, and moves (to the
band's middle, as above) only when it falls further behind. Why: under sampling the acceptance
differs from text to text and the decayed estimate follows it, so on a flat objective the band's
middle wanders by a depth or two at no gain (``results/depth_settle``); holding turns those moves
into none while a depth the estimates rate clearly worse is still left. ``runtime.edge
--depth-hold`` and ``--depth-memory`` set ``hold`` and ``memory`` (``experiments.depth_settle``
measures them against a live sweep); the defaults keep the published runs' behaviour.

The defaults (``memory`` 0.98, ``tolerance`` 0.03, ``probe_step`` 4, ``min_spread`` 4, prior 0.7
of weight 1) were chosen on the scenarios of ``tests/test_split_depth_controller.py`` and
``tests/test_split_runtime.py``; an attempt without the shrinkage, the band and the prior
(commit 30f1788) fitted the slope too, but acceptance noise moved it by 2 on flat sweeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable

PROBES = ("inside", "cheaper")  #: which way a probe goes (DepthController's ``probe``)


class DepthController:
    def __init__(self, min_depth: int = 1, max_depth: int = 8, initial: int = 4, smoothing: float = 0.3, max_step: int = 2,
                 prior_alpha: float = 0.7, prior_weight: float = 1.0, memory: float = 0.98, tolerance: float = 0.03,
                 probe_step: int = 4, min_spread: float = 4.0, probe: str = "inside", hold: float = 0.0):
        if not 1 <= min_depth <= initial <= max_depth:
            raise ValueError(f"need 1 <= min_depth <= initial <= max_depth, got {min_depth}, {initial}, {max_depth}")
        if not 0 < smoothing <= 1 or max_step < 1:
            raise ValueError(f"smoothing must lie in (0, 1] (got {smoothing}) and max_step >= 1 (got {max_step})")
        if not 0 < prior_alpha < 1 or prior_weight < 0 or not 0 < memory <= 1:
            raise ValueError(f"prior_alpha must lie in (0, 1) (got {prior_alpha}), prior_weight >= 0 (got {prior_weight}), "
                             f"memory in (0, 1] (got {memory})")
        if probe not in PROBES:
            raise ValueError(f"probe must be one of {PROBES}, got {probe!r}")
        if not 0 <= tolerance < 1 or probe_step < 1 or min_spread < 0:
            raise ValueError(f"tolerance must lie in [0, 1) (got {tolerance}), probe_step >= 1 (got {probe_step}), min_spread >= 0 (got {min_spread})")
        if not 0 <= hold < 1:
            raise ValueError(f"hold must lie in [0, 1), got {hold}")
        self.min_depth, self.max_depth, self.smoothing, self.max_step = min_depth, max_depth, smoothing, max_step
        self.prior_alpha, self.prior_weight, self.memory, self.tolerance = prior_alpha, prior_weight, memory, tolerance
        self.probe_step, self.min_spread, self.probe, self.hold = probe_step, min_spread, probe, hold
        self.current = initial
        self.draft_s: float | None = None  #: mean draft time per token, s
        self.network_s: float | None = None  #: mean round trip without the server's time, s
        self.verify_s: float | None = None  #: mean verify time over the depths seen, s (the fit's level)
        self.accepted = 0.0  #: decayed count of accepted drafts
        self.rejections = 0.0  #: decayed count of iterations that ended in a rejection
        self._w = self._sd = self._sdd = self._sv = self._sdv = 0.0  # decayed LS sums over (depth, verify s)
        self._iterations = 0
        self._home: int | None = None  #: the depth to return to after a probe (None: not probing)

    def _mean(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def observe(self, draft_s_per_token: float | None, network_s: float, verify_s: float | None, accepted: int | None = None,
                depth: int | None = None) -> int:
        """One iteration's timings (``draft_s_per_token`` None when nothing was drafted;
        ``verify_s`` None when the server's time is not a verification sample, e.g. it carried
        the prompt's prefill) and, optionally, its verdict (``accepted`` of ``depth`` drafts);
        returns the next depth. ``depth`` (the depth the timings belong to) defaults to the
        controller's current depth."""
        if draft_s_per_token is not None and draft_s_per_token > 0:
            self.draft_s = self._mean(self.draft_s, draft_s_per_token)
        self.network_s = self._mean(self.network_s, max(network_s, 0.0))
        d, k = float(self.current if depth is None else depth), self.memory  # depth 0 (no drafts) is a point of the fit too
        if verify_s is not None:
            v = max(verify_s, 0.0)
            self._w, self._sd, self._sdd = k * self._w + 1, k * self._sd + d, k * self._sdd + d * d
            self._sv, self._sdv = k * self._sv + v, k * self._sdv + d * v
            self.verify_s = self._sv / self._w
        if accepted is not None and depth:
            self.accepted = k * self.accepted + accepted
            self.rejections = k * self.rejections + (accepted < depth)
        self._step()
        return self.current

    def _step(self) -> None:
        if self._home is not None:  # a probe lasts one iteration
            self.current, self._home = self._home, None
        target = self.ideal()
        if target is not None:
            self.current += max(-self.max_step, min(self.max_step, target - self.current))
        self._iterations += 1
        if self._iterations & (self._iterations - 1) == 0 and self._spread() < self.min_spread:
            probe = self._probe_depth()
            if probe != self.current:
                self._home, self.current = self.current, probe

    def _probe_depth(self) -> int:
        """The depth of a probe from the current one (``probe``: see the module docstring)."""
        up = min(self.max_depth, self.current + self.probe_step)
        down = max(self.min_depth, self.current - self.probe_step)
        rate = self.rate() if self.probe == "cheaper" else None
        if rate is not None:
            sides = [d for d in (up, down) if d != self.current]
            return max(sides, key=rate) if sides else self.current  # ties: up, where a deeper draft loses least
        inside_is_down = self.current - self.min_depth >= self.max_depth - self.current
        return down if inside_is_down else up

    def _spread(self) -> float:
        """Weighted sum of squared deviations of the depths seen from their mean, depth^2."""
        return self._sdd - self._sd * self._sd / self._w if self._w > 0 else 0.0

    def verify_fit(self) -> tuple[float, float] | None:
        """``(v0 s, v1 s per depth)`` of ``t_verify(d) = v0 + v1 * d`` (None before any observation);
        ``v1 = 0`` while the depths seen have less than ``min_spread`` spread, never negative."""
        if self._w <= 0:
            return None
        spread, slope = self._spread(), 0.0
        if spread >= max(self.min_spread, 1e-9):
            slope = max(0.0, (self._sdv - self._sd * self._sv / self._w) / (spread + self.min_spread))
        return self.verify_s - slope * self._sd / self._w, slope

    @property
    def alpha(self) -> float | None:
        """The shrunk acceptance estimate (None before any verdict)."""
        if self.accepted + self.rejections <= 0:
            return None
        prior_acc = self.prior_weight * self.prior_alpha / (1 - self.prior_alpha)
        return min((self.accepted + prior_acc) / (self.accepted + prior_acc + self.rejections + self.prior_weight), 0.99)

    def crossing(self) -> int | None:
        """The calibration rule's depth: ``d * t_draft + t_network = t_verify(d)``, rounded and clamped."""
        fit = self.verify_fit()
        if self.draft_s is None or self.network_s is None or fit is None:
            return None
        v0, v1 = fit
        d = (v0 - self.network_s) / (self.draft_s - v1) if self.draft_s > v1 else float(self.max_depth)
        return int(min(self.max_depth, max(self.min_depth, math.floor(d + 0.5))))

    def rate(self) -> Callable[[int], float] | None:
        """Predicted tokens/s as a function of depth (None while an estimate is missing)."""
        fit, alpha = self.verify_fit(), self.alpha
        if self.draft_s is None or self.network_s is None or fit is None or alpha is None:
            return None
        (v0, v1), draft_s, network_s = fit, self.draft_s, self.network_s

        def tokens_per_s(d: int) -> float:
            verify = max(v0 + v1 * d, 1e-9)
            return (1 - alpha ** (d + 1)) / (1 - alpha) / (verify + max(d * draft_s + network_s, verify))

        return tokens_per_s

    def ideal(self) -> int | None:
        """The best depth under the current estimates (None before a draft time is known); with
        ``hold``, the current depth while it is near-best (module docstring)."""
        rule = self.crossing()
        rate = self.rate()
        if rule is None or rate is None:
            return rule
        rates = {d: rate(d) for d in range(self.min_depth, self.max_depth + 1)}
        top = max(rates.values())
        if self.hold > 0 and rates[self.current] >= (1 - self.hold) * top:  # current stays in range: so do initial, targets and probes
            return self.current
        near = [d for d, r in rates.items() if r >= (1 - self.tolerance) * top]
        return near[len(near) // 2]  # the middle of the near-best band
