"""Hardware/model cost profiles: what one forward pass costs and how much memory things take.

A profile is a YAML file under ``envs/profiles/`` that names a device, a large model (LLM) and a
small model (SLM), and says where pass times ``tau_M(b, q, c)`` come from:

* ``roofline`` -- computed from the specs: ``tau = layers * layer_overhead_s
  + max(FLOPs / (flops_efficiency * peak_flops_per_s), bytes / (bandwidth_efficiency * bandwidth))``;
* ``table`` -- a measured grid over ``(b, q, c)`` (written by ``runtime.profile``), interpolated
  linearly and extrapolated linearly at the edges;
* ``linear`` -- a fitted model ``tau = intercept_s + per_flop_s * FLOPs + per_byte_s * bytes``.

A measured profile also says where it was measured (``measured_on``: CPU model or GPU name, cores,
threads, torch version, dtype, the pair's recipe hash) and may carry a ``calibration`` section
(``envs.calibration``) measured later on another machine, which scales ``tau`` for every user of
the profile. Comparing ``measured_on`` with the running machine is the runtime's job
(``runtime.fingerprint``): this module only stores it.

Optional ``edge`` and ``network`` sections describe SpecEdge's split (the draft model on an edge
device, the target on this profile's device, a network between them): see :class:`EdgeSpec`,
:class:`NetworkSpec` and ``envs.split_cost``.

Conventions used everywhere: ``b`` is the batch size (sequences), ``q`` the new tokens per
sequence in the pass, ``c`` the context length attended to *including* the ``q`` new tokens.
All times are seconds, all sizes bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from envs.calibration import Calibration, ScaleCurve, provenance_from_dict

#: the shipped profiles: package data of ``envs`` (so a plain ``pip install .`` has them), not a
#: Hydra config group -- app configs name a profile by a string (``profile=NAME`` or ``profile=PATH``)
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
LATENCY_SOURCES = ("roofline", "table", "linear")


class ProfileError(ValueError):
    """A profile file or dict is malformed; the message names the field and the allowed values."""


def _require(d: dict, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise ProfileError(f"profile field '{where}{key}' is missing")
    return d[key]


def _positive(d: dict, key: str, where: str, *, integer: bool = False, allow_zero: bool = False) -> float:
    value = _require(d, key, where)
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise ProfileError(f"profile field '{where}{key}' must be a number, got {value!r}") from None
    ok = num >= 0 if allow_zero else num > 0
    if not ok or not math.isfinite(num):
        bound = ">= 0" if allow_zero else "> 0"
        raise ProfileError(f"profile field '{where}{key}' must be {bound}, got {value!r}")
    if integer:
        if num != int(num):
            raise ProfileError(f"profile field '{where}{key}' must be an integer, got {value!r}")
        return int(num)
    return num


def _axis(d: dict, key: str, where: str) -> np.ndarray:
    """A grid axis: a non-empty, strictly increasing list of positive finite numbers."""
    value = _require(d, key, where)
    msg = f"profile field '{where}{key}' must be a non-empty, strictly increasing list of positive finite numbers, got {value!r}"
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ProfileError(msg) from None
    # NaN compares false with everything, so it must be refused explicitly, not by the order test
    if arr.ndim != 1 or len(arr) == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0) or np.any(np.diff(arr) <= 0):
        raise ProfileError(msg)
    return arr


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or CPU) as the cost model sees it."""

    name: str
    memory_bytes: float  #: total device memory Q
    bandwidth_bytes_per_s: float  #: peak memory bandwidth
    flops_per_s: float  #: peak dense matmul throughput at the models' dtype
    reserve_bytes: float  #: activations, runtime context, fragmentation: taken off Q first

    @classmethod
    def from_dict(cls, d: dict, where: str = "device.") -> DeviceSpec:
        w = where
        return cls(
            name=str(_require(d, "name", w)),
            memory_bytes=_positive(d, "memory_bytes", w),
            bandwidth_bytes_per_s=_positive(d, "bandwidth_bytes_per_s", w),
            flops_per_s=_positive(d, "flops_per_s", w),
            reserve_bytes=_positive(d, "reserve_bytes", w, allow_zero=True),
        )


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-style decoder (GQA, SwiGLU) described by its config numbers."""

    name: str
    params: float  #: parameter count
    layers: int
    hidden: int  #: d
    ffn_hidden: int  #: d_ff
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int

    @classmethod
    def from_dict(cls, d: dict, where: str) -> ModelSpec:
        w = f"{where}."
        spec = cls(
            name=str(_require(d, "name", w)),
            params=_positive(d, "params", w),
            layers=_positive(d, "layers", w, integer=True),
            hidden=_positive(d, "hidden", w, integer=True),
            ffn_hidden=_positive(d, "ffn_hidden", w, integer=True),
            heads=_positive(d, "heads", w, integer=True),
            kv_heads=_positive(d, "kv_heads", w, integer=True),
            head_dim=_positive(d, "head_dim", w, integer=True),
            vocab=_positive(d, "vocab", w, integer=True),
            dtype_bytes=_positive(d, "dtype_bytes", w, integer=True),
        )
        if spec.kv_heads > spec.heads:
            raise ProfileError(f"profile field '{w}kv_heads' must be <= heads ({spec.heads}), got {spec.kv_heads}")
        return spec

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer: ``2 * layers * kv_heads * head_dim * dtype_bytes``."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def flops(self, b, q, c):
        """FLOPs of one pass (Transformer blocks + LM head on every new token)."""
        d, dkv = self.hidden, self.kv_heads * self.head_dim
        per_token = self.layers * (4.0 * d * d + 4.0 * d * dkv + 6.0 * d * self.ffn_hidden) + 2.0 * d * self.vocab
        attention = self.layers * 4.0 * d * np.asarray(c, dtype=float)
        return np.asarray(b, dtype=float) * np.asarray(q, dtype=float) * (per_token + attention)

    def bytes_moved(self, b, q, c):
        """Bytes one pass streams: all weights once, plus every sequence's KV read and written."""
        b = np.asarray(b, dtype=float)
        return self.weight_bytes + b * np.asarray(c, dtype=float) * self.kv_bytes_per_token


class LatencyModel:
    """``tau(b, q, c)`` for one model on one device; numpy-broadcasting over its arguments."""

    def tau(self, b, q, c):  # pragma: no cover - interface
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

    def decode_sum(self, b, c_start, n):
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

    def tau(self, b, q, c):
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

    def tau(self, b, q, c):
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

    def tau(self, b, q, c):
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

    def tau(self, b, q, c):
        return self.base.tau(b, q, c) * self.curve.at(q)

    def tau1(self, b: float, q: float, c: float) -> float:
        return self.base.tau1(b, q, c) * self.curve.at1(q)


@dataclass(frozen=True)
class EngineOverhead:
    """Host work of the decoding engines beyond the forward passes, per batch size ``b``.

    A measured profile's ``tau`` times bare forward passes; an engine step also samples, builds
    attention masks, tests acceptance, crops caches and streams tokens. ``runtime.profile
    --engine`` measures that remainder (engine wall time minus the table's prediction) and the cost
    model adds it: ``ad_step_s(b)`` per AD decode step, ``sd_iteration_s(b) + gamma *
    sd_draft_step_s(b)`` per SD iteration. Linear in ``b`` between grid points, flat beyond.
    """

    b: np.ndarray
    ad_step_s: np.ndarray
    sd_iteration_s: np.ndarray
    sd_draft_step_s: np.ndarray

    @classmethod
    def from_dict(cls, d: dict) -> EngineOverhead:
        w = "engine."
        if not isinstance(d, dict):
            raise ProfileError("profile field 'engine' must be a mapping with b, ad_step_s, sd_iteration_s, sd_draft_step_s")
        b = _axis(d, "b", w)
        arrays = []
        for key in ("ad_step_s", "sd_iteration_s", "sd_draft_step_s"):
            try:
                a = np.asarray(_require(d, key, w), dtype=float)
            except (TypeError, ValueError):
                a = np.full(0, np.nan)
            if a.shape != b.shape or np.any(~np.isfinite(a)) or np.any(a < 0):
                raise ProfileError(f"profile field 'engine.{key}' must be {len(b)} finite seconds >= 0 (one per engine.b)")
            arrays.append(a)
        return cls(b, *arrays)

    def ad(self, b):
        return np.interp(b, self.b, self.ad_step_s)

    def sd(self, b, gamma):
        return np.interp(b, self.b, self.sd_iteration_s) + np.asarray(gamma, dtype=float) * np.interp(b, self.b, self.sd_draft_step_s)


@dataclass(frozen=True)
class NetworkSpec:
    """The link between an edge device and the server in SpecEdge's split (``network:`` section).

    Per verification request the edge sends ``request_overhead_bytes + bytes_per_draft_token * n``
    for ``n`` tree/chain nodes (token id, position, parent, KV slot) and gets back
    ``request_overhead_bytes + bytes_per_reply_token * n`` (the target's sampled token per node).
    ``rtt_ms`` is the default round trip; a user may carry its own (``Round.rtt_s``).
    """

    rtt_ms: float
    bandwidth_bytes_per_s: float  #: each direction
    bytes_per_draft_token: float
    bytes_per_reply_token: float
    request_overhead_bytes: float = 0.0  #: framing and header bytes per message, each direction

    @property
    def rtt_s(self) -> float:
        return self.rtt_ms / 1e3

    @classmethod
    def from_dict(cls, d: dict) -> NetworkSpec:
        w = "network."
        if not isinstance(d, dict):
            raise ProfileError("profile field 'network' must be a mapping with rtt_ms, bandwidth_bytes_per_s, bytes_per_draft_token, bytes_per_reply_token")
        return cls(
            rtt_ms=_positive(d, "rtt_ms", w, allow_zero=True),
            bandwidth_bytes_per_s=_positive(d, "bandwidth_bytes_per_s", w),
            bytes_per_draft_token=_positive(d, "bytes_per_draft_token", w, allow_zero=True),
            bytes_per_reply_token=_positive(d, "bytes_per_reply_token", w, allow_zero=True),
            request_overhead_bytes=_positive({"v": d.get("request_overhead_bytes", 0.0)}, "v", f"{w}request_overhead_bytes", allow_zero=True),
        )


@dataclass(frozen=True)
class EdgeSpec:
    """The edge device of SpecEdge's split and the draft model's pass time on it (``edge:`` section).

    ``edge.device`` has the fields of ``device``; ``edge.latency`` is ``roofline`` (efficiencies and
    ``layer_overhead_s`` as in ``latency``) or ``table`` (a measured grid ``slm: {b, q, c, tau_s}``).
    The draft model is the profile's ``slm``; ``tau_draft(b, q, c)`` is its pass time on the edge.
    """

    device: DeviceSpec
    latency_source: str
    tau_draft: LatencyModel = field(compare=False)

    @classmethod
    def from_dict(cls, d: dict, slm: ModelSpec) -> EdgeSpec:
        if not isinstance(d, dict):
            raise ProfileError("profile field 'edge' must be a mapping with device and latency")
        device = DeviceSpec.from_dict(_require(d, "device", "edge."), "edge.device.")
        lat = _require(d, "latency", "edge.")
        source = _require(lat, "source", "edge.latency.")
        if source == "roofline":
            w = "edge.latency."
            eff = {k: _positive(lat, k, w) for k in ("flops_efficiency", "bandwidth_efficiency")}
            for key, value in eff.items():
                if value > 1:
                    raise ProfileError(f"profile field 'edge.latency.{key}' must be in (0, 1], got {value}")
            over = _positive({"v": lat.get("layer_overhead_s", 0.0)}, "v", "edge.latency.layer_overhead_s", allow_zero=True)
            tau = RooflineLatency(model=slm, device=device, layer_overhead_s=over, **eff)
        elif source == "table":
            tau = _table("slm", lat, "edge.latency.")
        else:
            raise ProfileError(f"profile field 'edge.latency.source' must be one of ['roofline', 'table'], got {source!r}")
        return cls(device, source, tau)


@dataclass(frozen=True)
class Profile:
    """Everything the cost model needs about the hardware and the model pair."""

    name: str
    device: DeviceSpec
    llm: ModelSpec
    slm: ModelSpec
    latency_source: str
    tau_llm: LatencyModel = field(compare=False)
    tau_slm: LatencyModel = field(compare=False)
    notes: str = ""
    engine: EngineOverhead | None = field(default=None, compare=False)  #: measured engine overhead; None = bare passes
    #: where the latency numbers were measured (``runtime.profile`` writes it; analytic profiles: empty)
    measured_on: dict = field(default_factory=dict, compare=False)
    #: scale curves measured later on another (the running) machine; already applied to tau_llm / tau_slm
    calibration: Calibration | None = field(default=None, compare=False)
    #: SpecEdge's split (optional): the edge device drafting with the slm, and the link to the server
    edge: EdgeSpec | None = None
    network: NetworkSpec | None = None

    def provenance(self) -> dict:
        """The machine the profile's times describe: the calibration's if it has one, else the table's."""
        if self.calibration is not None and self.calibration.measured_on:
            return dict(self.calibration.measured_on)
        return dict(self.measured_on)

    @property
    def kv_llm_bytes(self) -> float:
        return self.llm.kv_bytes_per_token

    @property
    def kv_slm_bytes(self) -> float:
        return self.slm.kv_bytes_per_token

    @classmethod
    def from_dict(cls, d: dict, name: str = "") -> Profile:
        if not isinstance(d, dict):
            raise ProfileError("a profile must be a mapping with fields device, llm, slm, latency")
        device = DeviceSpec.from_dict(_require(d, "device", ""))
        llm = ModelSpec.from_dict(_require(d, "llm", ""), "llm")
        slm = ModelSpec.from_dict(_require(d, "slm", ""), "slm")
        lat = _require(d, "latency", "")
        source = _require(lat, "source", "latency.")
        if source not in LATENCY_SOURCES:
            raise ProfileError(f"profile field 'latency.source' must be one of {list(LATENCY_SOURCES)}, got {source!r}")
        if source == "roofline":
            w = "latency."
            common = dict(
                device=device,
                flops_efficiency=_positive(lat, "flops_efficiency", w),
                bandwidth_efficiency=_positive(lat, "bandwidth_efficiency", w),
            )
            for key in ("flops_efficiency", "bandwidth_efficiency"):
                if common[key] > 1:
                    raise ProfileError(f"profile field 'latency.{key}' must be in (0, 1], got {common[key]}")
            over = lat.get("layer_overhead_s", 0.0)
            over_l = _positive({"v": lat.get("llm_layer_overhead_s", over)}, "v", "latency.llm_layer_overhead_s", allow_zero=True)
            over_s = _positive({"v": lat.get("slm_layer_overhead_s", over)}, "v", "latency.slm_layer_overhead_s", allow_zero=True)
            tau_l = RooflineLatency(model=llm, layer_overhead_s=over_l, **common)
            tau_s = RooflineLatency(model=slm, layer_overhead_s=over_s, **common)
        elif source == "linear":
            def lin(key: str, spec: ModelSpec) -> LinearLatency:
                sub = _require(lat, key, "latency.")
                w = f"latency.{key}."
                return LinearLatency(
                    model=spec,
                    intercept_s=_positive(sub, "intercept_s", w, allow_zero=True),
                    per_flop_s=_positive(sub, "per_flop_s", w, allow_zero=True),
                    per_byte_s=_positive(sub, "per_byte_s", w, allow_zero=True),
                )
            tau_l, tau_s = lin("llm", llm), lin("slm", slm)
        else:
            tau_l, tau_s = _table("llm", lat), _table("slm", lat)
        try:
            measured_on = provenance_from_dict(d.get("measured_on") or {}, "measured_on")
            calibration = Calibration.from_dict(d["calibration"]) if d.get("calibration") is not None else None
        except ValueError as exc:
            raise ProfileError(str(exc)) from None
        if calibration is not None:
            tau_l = CalibratedLatency(tau_l, calibration.llm) if calibration.llm is not None else tau_l
            tau_s = CalibratedLatency(tau_s, calibration.slm) if calibration.slm is not None else tau_s
        return cls(
            name=name or str(d.get("name", "")),
            device=device,
            llm=llm,
            slm=slm,
            latency_source=source,
            tau_llm=tau_l,
            tau_slm=tau_s,
            notes=str(d.get("notes", "")),
            engine=EngineOverhead.from_dict(d["engine"]) if d.get("engine") is not None else None,
            measured_on=measured_on,
            calibration=calibration,
            edge=EdgeSpec.from_dict(d["edge"], slm) if d.get("edge") is not None else None,
            network=NetworkSpec.from_dict(d["network"]) if d.get("network") is not None else None,
        )

    def with_memory(self, memory_bytes: float) -> Profile:
        """The same profile with a different device memory ``Q`` (for memory sweeps)."""
        if not memory_bytes > 0:
            raise ProfileError(f"memory_bytes must be > 0, got {memory_bytes}")
        dev = DeviceSpec(**{**self.device.__dict__, "memory_bytes": float(memory_bytes)})
        return replace(self, device=dev)


def _table(key: str, lat: dict, where: str = "latency.") -> TableLatency:
    sub = _require(lat, key, where)
    w = f"{where}{key}."
    axes = [_axis(sub, ax, w) for ax in ("b", "q", "c")]
    try:
        tau = np.asarray(_require(sub, "tau_s", w), dtype=float)
    except (TypeError, ValueError):
        raise ProfileError(f"profile field '{w}tau_s' must be a (b, q, c) grid of seconds") from None
    shape = tuple(len(a) for a in axes)
    if tau.shape != shape:
        raise ProfileError(f"profile field '{w}tau_s' must have shape {shape} (b, q, c), got {tau.shape}")
    if np.any(~np.isfinite(tau)) or np.any(tau <= 0):
        raise ProfileError(f"profile field '{w}tau_s' must hold positive finite seconds")
    return TableLatency(axes[0], axes[1], axes[2], tau)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_path(name_or_path: str | Path) -> Path:
    """The file a profile name (``envs/profiles/NAME.yaml``) or path (``*.yaml`` / ``*.yml``) names.

    This is what an app config's ``profile: NAME_OR_PATH`` means; raises :class:`ProfileError`
    with the available names if there is no such file.
    """
    path = Path(name_or_path)
    # names may contain dots ("tinyllama-1.1b"), so only a .yaml/.yml suffix marks a path
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ProfileError(f"profile {str(name_or_path)!r} not found; available: {available_profiles()}")
    return path


#: loaded profiles: resolved path -> (modification time in ns, profile); an edited file is re-read
_LOADED: dict[Path, tuple[int, Profile]] = {}


def load_profile(name_or_path: str | Path) -> Profile:
    """Load and validate a profile by name (a file in ``envs/profiles/`` without ``.yaml``) or path.

    Loaded once per file: later calls return the same (frozen) :class:`Profile` until the file's
    modification time changes.
    """
    path = profile_path(name_or_path).resolve()
    mtime_ns = path.stat().st_mtime_ns
    hit = _LOADED.get(path)
    if hit is not None and hit[0] == mtime_ns:
        return hit[1]
    with path.open() as fh:
        data = yaml.safe_load(fh)
    profile = Profile.from_dict(data, name=path.stem)
    _LOADED[path] = (mtime_ns, profile)
    return profile
