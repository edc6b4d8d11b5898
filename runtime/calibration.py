"""Online calibration of the profile to the host's real speed, per mode.

The profile was measured on an idle machine; under CPU contention or on another device the real
step times differ. After every batch the server compares the device time the batch really used
with what the profile predicts for the same batch (its realised output lengths and SD iterations)
and keeps, per mode, a smoothed ratio ``real / predicted`` and its spread; the factor used is
``mean + margin_sd x spread``, bounded -- on a host whose speed swings (other jobs come and go) it
plans for a slower-than-average step rather than an average one. Planning and the queue's
deadline check use the profile's times multiplied by that factor
(:class:`CalibratedCostModel`), so a slower host produces rejections instead of late answers.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from envs.cost_model import CostModel

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import ArrayLike

MODES = ("ad", "sd")
SETTLED = 3  #: samples per mode after which the measured spread alone sets the margin (``first_rel_sd`` no longer applies)


class StepCalibration:
    """Per-mode factor ``real / predicted`` step time: an EMA of measured ratios plus ``margin_sd``
    EMA standard deviations, kept in bounds. Until a mode has ``SETTLED`` samples its spread is at
    least ``first_rel_sd`` x its mean: the first sample (often a short probe of one row, just after
    the host changed) may well be off for a full batch."""

    def __init__(self, weight: float = 0.3, bounds: tuple[float, float] = (0.5, 20.0), margin_sd: float = 1.0, first_rel_sd: float = 0.0):
        lo, hi = bounds
        if not 0 < weight <= 1:
            raise ValueError(f"calibration weight must be in (0, 1], got {weight}")
        if not 0 < lo <= 1 <= hi < math.inf:
            raise ValueError(f"calibration bounds must satisfy 0 < low <= 1 <= high, got {bounds}")
        if not 0 <= margin_sd < math.inf:
            raise ValueError(f"calibration margin_sd must be >= 0, got {margin_sd}")
        if not 0 <= first_rel_sd <= 1:
            raise ValueError(f"calibration first_rel_sd must be in [0, 1], got {first_rel_sd}")
        self.weight, self.lo, self.hi, self.margin_sd = float(weight), float(lo), float(hi), float(margin_sd)
        self.first_rel_sd = float(first_rel_sd)
        self.factor = dict.fromkeys(MODES, 1.0)  #: what planning multiplies the profile's times by
        self.mean = dict.fromkeys(MODES, 1.0)
        self.var = dict.fromkeys(MODES, 0.0)
        self.samples = dict.fromkeys(MODES, 0)
        #: bumped by every factor update: a factor that moves and comes back to the same float (e.g. held
        #: at a bound) is still a change for whoever memoised times in between (CalibratedCostModel.times_version)
        self.updates = 0
        self._lock = threading.Lock()  # two devices: two engine threads may report at once

    def update(self, mode: str, real_s: float, predicted_s: float) -> float | None:
        """Fold one batch's measurement in; returns the new factor (None if the sample is unusable)."""
        if mode not in self.factor:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not (real_s > 0 and predicted_s > 0 and math.isfinite(real_s) and math.isfinite(predicted_s)):
            return None
        ratio = min(max(real_s / predicted_s, self.lo), self.hi)  # one wild sample cannot swing the factor past the bounds
        with self._lock:
            if self.samples[mode] == 0:  # the first sample replaces the prior: the profile may be far from this host
                self.mean[mode], self.var[mode] = ratio, 0.0
            else:
                w, d = self.weight, ratio - self.mean[mode]
                self.mean[mode] += w * d
                self.var[mode] = (1 - w) * (self.var[mode] + w * d * d)  # exponentially weighted variance
            var = self.var[mode]
            if self.samples[mode] + 1 < SETTLED:  # one or two samples say little about the spread: assume first_rel_sd of the mean
                var = max(var, (self.first_rel_sd * self.mean[mode]) ** 2)
            f = self.mean[mode] + self.margin_sd * math.sqrt(var)
            self.factor[mode] = min(max(f, self.lo), self.hi)
            self.samples[mode] += 1
            self.updates += 1
            return self.factor[mode]


class CalibratedCostModel(CostModel):
    """A :class:`CostModel` whose batch times are the profile's times x the live calibration factor
    of their mode. Memory is not scaled (it does not depend on speed)."""

    def __init__(self, base: CostModel, calibration: StepCalibration):
        super().__init__(base.profile, base.kv_memory, base.choices)  # same profile, memory model and modelling choices; only the times are scaled
        self.calibration = calibration

    def ad_time(self, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike) -> np.ndarray:
        return super().ad_time(b, s_max, n_max) * self.calibration.factor["ad"]

    def sd_time(self, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike, j_max: ArrayLike, gamma: ArrayLike) -> np.ndarray:
        return super().sd_time(b, s_max, n_max, j_max, gamma) * self.calibration.factor["sd"]

    def ad_time1(self, b: int, s_max: int, n_max: int) -> float:
        return super().ad_time1(b, s_max, n_max) * self.calibration.factor["ad"]

    def sd_time1(self, b: int, s_max: int, n_max: int, j_max: int, gamma: int) -> float:
        return super().sd_time1(b, s_max, n_max, j_max, gamma) * self.calibration.factor["sd"]

    def times_version(self) -> object:
        """The live factors and the calibration's update count: the builders' memoised times are valid
        while these stay the same. The count too, because an update may land while a round is planned
        (the engine threads calibrate as batches end) and the factor may return to the same float
        before the next reset (one held at a bound): times memoised in between would pass for current."""
        factor = self.calibration.factor
        return (getattr(self.calibration, "updates", 0), *(factor[m] for m in MODES))
