"""Pass-time models ``tau(b, q, c)`` of one model on one device (seconds): the roofline, a
measured table, a linear fit, and a calibrated scaling of any of them. ``envs.profile`` builds
them from a profile's ``latency`` section; the conventions (``b`` batch rows, ``q`` new tokens per
row, ``c`` context including them) are that module's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from envs.calibration import ScaleCurve
from envs.hardware_specs import DeviceSpec, ModelSpec
from envs.profile_fields import ProfileError, axis_field, require_field


class LatencyModel:
    """``tau(b, q, c)`` for one model on one device; numpy-broadcasting over its arguments."""

    def tau(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def tau1(self, b: float, q: float, c: float) -> float:
        """``tau`` of one point as a Python float (subclasses give a numpy-free fast path)."""
        return float(self.tau(b, q, c))

    def decode_sum1(self, b: int, c_start: int, n: int) -> float:
        """:meth:`decode_sum` of one point as a Python float."""
        self._ensure_prefix(b, c_start + n)  # a no-op once the table is large enough
        row = self._prefix[b]
        return float(row[c_start + n] - row[c_start])

    # Sums of decode steps are asked for constantly (AD batch times); a lazily grown
    # prefix-sum table over integer contexts makes each one O(1) for every latency source.
    _prefix: np.ndarray | None = None

    def decode_sum(self, b: ArrayLike, c_start: ArrayLike, n: ArrayLike) -> np.ndarray:
        """``sum_{i=1..n} tau(b, 1, c_start + i)`` for integer arrays (``n >= 0``)."""
        b = np.asarray(b, dtype=np.int64)
        c_start = np.asarray(c_start, dtype=np.int64)
        n = np.asarray(n, dtype=np.int64)
        need_b = int(b.max(initial=1))
        need_c = int((c_start + n).max(initial=1))
        self._ensure_prefix(need_b, need_c)
        p = self._prefix
        return p[b, c_start + n] - p[b, c_start]

    def _ensure_prefix(self, b_max: int, c_max: int) -> None:
        p = self._prefix
        if p is not None and p.shape[0] > b_max and p.shape[1] > c_max:
            return
        rows = max(b_max + 1, 0 if p is None else p.shape[0], 16)
        cols = max(c_max + 1, 0 if p is None else p.shape[1], 2048)
        # grow geometrically so a slowly rising maximum does not rebuild the table each call
        if p is not None:
            rows = max(rows, p.shape[0] * 2 if b_max >= p.shape[0] else p.shape[0])
            cols = max(cols, p.shape[1] * 2 if c_max >= p.shape[1] else p.shape[1])
        bb = np.arange(rows, dtype=float)[:, None]
        cc = np.arange(cols, dtype=float)[None, :]
        step = np.where(cc >= 1, self.tau(np.maximum(bb, 1), 1, np.maximum(cc, 1)), 0.0)
        step[0, :] = 0.0
        self._prefix = np.cumsum(step, axis=1)


@dataclass
class RooflineLatency(LatencyModel):
    model: ModelSpec
    device: DeviceSpec
    flops_efficiency: float
    bandwidth_efficiency: float
    layer_overhead_s: float
    _consts: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def tau(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:
        compute = self.model.flops(b, q, c) / (self.flops_efficiency * self.device.flops_per_s)
        memory = self.model.bytes_moved(b, q, c) / (self.bandwidth_efficiency * self.device.bandwidth_bytes_per_s)
        return self.model.layers * self.layer_overhead_s + np.maximum(compute, memory)

    def tau1(self, b: float, q: float, c: float) -> float:
        # the same floating-point operations as tau(), in the same order, without numpy overhead
        k = self._consts
        if k is None:
            m = self.model
            d, dkv = m.hidden, m.kv_heads * m.head_dim
            per_token = m.layers * (4.0 * d * d + 4.0 * d * dkv + 6.0 * d * m.ffn_hidden) + 2.0 * d * m.vocab
            k = self._consts = (per_token, m.layers * 4.0 * d, self.flops_efficiency * self.device.flops_per_s, m.weight_bytes, m.kv_bytes_per_token,
                                self.bandwidth_efficiency * self.device.bandwidth_bytes_per_s, m.layers * self.layer_overhead_s)
        per_token, attn, f_den, w, kv, b_den, overhead = k
        compute = b * q * (per_token + attn * c) / f_den
        memory = (w + b * c * kv) / b_den
        return overhead + (compute if compute > memory else memory)


@dataclass
class LinearLatency(LatencyModel):
    model: ModelSpec
    intercept_s: float
    per_flop_s: float
    per_byte_s: float

    def tau(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:
        return self.intercept_s + self.per_flop_s * self.model.flops(b, q, c) + self.per_byte_s * self.model.bytes_moved(b, q, c)


@dataclass
class TableLatency(LatencyModel):
    """Trilinear interpolation of a measured grid; linear extrapolation outside it."""

    b_grid: np.ndarray
    q_grid: np.ndarray
    c_grid: np.ndarray
    tau_s: np.ndarray  #: shape (len(b), len(q), len(c))
    _axes: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._axes = (self.b_grid, self.q_grid, self.c_grid)

    @staticmethod
    def _bracket(grid: np.ndarray, x: np.ndarray):
        if len(grid) == 1:
            i = np.zeros_like(x, dtype=np.int64)
            return i, i, np.zeros_like(x, dtype=float)
        i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
        w = (x - grid[i]) / (grid[i + 1] - grid[i])
        return i, i + 1, w

    def tau(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:
        b, q, c = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (b, q, c)))
        ib0, ib1, wb = self._bracket(self.b_grid, b)
        iq0, iq1, wq = self._bracket(self.q_grid, q)
        ic0, ic1, wc = self._bracket(self.c_grid, c)
        t = self.tau_s
        out = 0.0
        for ib, fb in ((ib0, 1 - wb), (ib1, wb)):
            for iq, fq in ((iq0, 1 - wq), (iq1, wq)):
                for ic, fc in ((ic0, 1 - wc), (ic1, wc)):
                    out = out + fb * fq * fc * t[ib, iq, ic]
        # extrapolation can dip below the smallest measurement; a pass is never free
        return np.maximum(out, self.tau_s.min() * 0.5)


@dataclass
class CalibratedLatency(LatencyModel):
    """A latency model scaled by a measured curve over ``q`` (a profile's ``calibration``)."""

    base: LatencyModel
    curve: ScaleCurve

    def tau(self, b: ArrayLike, q: ArrayLike, c: ArrayLike) -> np.ndarray:
        return self.base.tau(b, q, c) * self.curve.at(q)

    def tau1(self, b: float, q: float, c: float) -> float:
        return self.base.tau1(b, q, c) * self.curve.at1(q)


def table_latency(key: str, lat: dict, where: str = "latency.") -> TableLatency:
    """The measured ``(b, q, c)`` grid ``lat[key]`` (``b``, ``q``, ``c``, ``tau_s``), validated."""
    sub = require_field(lat, key, where)
    w = f"{where}{key}."
    axes = [axis_field(sub, ax, w) for ax in ("b", "q", "c")]
    try:
        tau = np.asarray(require_field(sub, "tau_s", w), dtype=float)
    except (TypeError, ValueError):
        raise ProfileError(f"profile field '{w}tau_s' must be a (b, q, c) grid of seconds") from None
    shape = tuple(len(a) for a in axes)
    if tau.shape != shape:
        raise ProfileError(f"profile field '{w}tau_s' must have shape {shape} (b, q, c), got {tau.shape}")
    if np.any(~np.isfinite(tau)) or np.any(tau <= 0):
        raise ProfileError(f"profile field '{w}tau_s' must hold positive finite seconds")
    return TableLatency(axes[0], axes[1], axes[2], tau)
