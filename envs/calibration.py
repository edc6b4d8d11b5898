"""A profile's calibration: how much slower (or faster) this machine runs than the profile says.

``runtime.profile --quick`` times a few forward passes of both models on the running machine and
divides each by what the profile predicts for the same ``(b, q, c)``. The ratios become one scale
curve per model over ``q`` (new tokens per pass), which separates the passes by what they are used
for: ``q = 1`` are AD decode steps and draft steps, ``q = gamma + 1`` are SD verifications, long
``q`` are prefills. A profile's ``calibration`` section::

    calibration:
      measured_on: {cpu_model: ..., cores: 2, threads: 1, torch: 2.13.0, dtype: float32, pair_recipe: ...}
      notes: ...
      llm: {q: [1, 5, 32], scale: [1.31, 1.24, 1.18]}
      slm: {q: [1, 5, 32], scale: [1.40, 1.30, 1.21]}

The profile multiplies its ``tau`` by the curve (``envs.latency.CalibratedLatency``), so every user
of the profile -- the cost model included -- sees calibrated times. Between the ``q`` points the
scale is interpolated linearly, beyond them it is held. This module only parses and evaluates;
measuring is the runtime's job.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

#: what a provenance (``measured_on``) value may be
_SCALARS = (str, int, float, bool, type(None))


def provenance_from_dict(d: object, where: str) -> dict:
    """Validate a ``measured_on`` mapping (field -> text or number); raise ValueError naming it."""
    if not isinstance(d, dict):
        raise ValueError(f"profile field '{where}' must be a mapping of field -> value, got {type(d).__name__}")
    for key, value in d.items():
        if not isinstance(key, str) or not isinstance(value, _SCALARS):
            raise ValueError(f"profile field '{where}.{key}' must be text, a number or null, got {value!r}")
    return dict(d)


@dataclass(frozen=True)
class ScaleCurve:
    """A positive scale factor as a function of ``q``, piecewise linear, held beyond the ends."""

    q: tuple[float, ...]
    scale: tuple[float, ...]

    @classmethod
    def from_dict(cls, d: object, where: str) -> ScaleCurve:
        if not isinstance(d, dict) or "q" not in d or "scale" not in d:
            raise ValueError(f"profile field '{where}' must be a mapping with lists 'q' and 'scale'")
        try:
            q = [float(v) for v in d["q"]]
            scale = [float(v) for v in d["scale"]]
        except (TypeError, ValueError):
            raise ValueError(f"profile field '{where}' must hold lists of numbers in 'q' and 'scale'") from None
        if not q or not all(math.isfinite(v) and v > 0 for v in q) or any(b <= a for a, b in zip(q, q[1:], strict=False)):
            raise ValueError(f"profile field '{where}.q' must be a non-empty, strictly increasing list of positive finite numbers, got {d['q']!r}")
        if len(scale) != len(q) or not all(math.isfinite(v) and v > 0 for v in scale):
            raise ValueError(f"profile field '{where}.scale' must be {len(q)} positive finite factors (one per q), got {d['scale']!r}")
        return cls(tuple(q), tuple(scale))

    def at(self, q: ArrayLike) -> np.ndarray:
        """The scale at ``q`` (numpy arrays broadcast)."""
        qp, sp = np.asarray(self.q), np.asarray(self.scale)
        q = np.asarray(q, dtype=float)
        if len(qp) == 1:
            return np.full(q.shape, sp[0])
        # the same operations, in the same order, as at1(): scalar and array paths agree bit for bit
        i = np.clip(np.searchsorted(qp, q, side="right") - 1, 0, len(qp) - 2)
        w = np.clip((q - qp[i]) / (qp[i + 1] - qp[i]), 0.0, 1.0)
        return sp[i] + (sp[i + 1] - sp[i]) * w

    def at1(self, q: float) -> float:
        """:meth:`at` of one point as a Python float."""
        qp, sp = self.q, self.scale
        if len(qp) == 1:
            return sp[0]
        i = min(max(bisect_right(qp, q) - 1, 0), len(qp) - 2)
        w = (q - qp[i]) / (qp[i + 1] - qp[i])
        w = 0.0 if w < 0.0 else 1.0 if w > 1.0 else w
        return sp[i] + (sp[i + 1] - sp[i]) * w


@dataclass(frozen=True)
class Calibration:
    """Per-model scale curves measured on one machine (absent model: scale 1)."""

    llm: ScaleCurve | None
    slm: ScaleCurve | None
    measured_on: dict = field(default_factory=dict, compare=False)
    notes: str = ""

    @classmethod
    def from_dict(cls, d: object, where: str = "calibration") -> Calibration:
        """Parse a ``calibration`` section (at ``where`` in the profile); raise ValueError naming the field."""
        w = where
        if not isinstance(d, dict):
            raise ValueError(f"profile field '{w}' must be a mapping with 'llm' and/or 'slm' scale curves")
        curves = {key: ScaleCurve.from_dict(d[key], f"{w}.{key}") if d.get(key) is not None else None for key in ("llm", "slm")}
        if curves["llm"] is None and curves["slm"] is None:
            raise ValueError(f"profile field '{w}' must give a scale curve for 'llm', 'slm' or both")
        measured_on = provenance_from_dict(d.get("measured_on") or {}, f"{w}.measured_on")
        return cls(curves["llm"], curves["slm"], measured_on, str(d.get("notes", "")))
