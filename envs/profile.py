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

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml
from numpy.typing import ArrayLike

from envs.calibration import Calibration, provenance_from_dict
from envs.hardware_specs import DeviceSpec, ModelSpec
from envs.latency import (
    CalibratedLatency,
    LatencyModel,
    LinearLatency,
    RooflineLatency,
    table_latency,
)
from envs.profile_fields import (
    ProfileError,
    axis_field,
    positive_field,
    refuse_unknown,
    require_field,
)

#: the shipped profiles: package data of ``envs`` (so a plain ``pip install .`` has them), not a
#: Hydra config group -- app configs name a profile by a string (``profile=NAME`` or ``profile=PATH``)
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
LATENCY_SOURCES = ("roofline", "table", "linear")


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
        b = axis_field(d, "b", w)
        arrays = []
        for key in ("ad_step_s", "sd_iteration_s", "sd_draft_step_s"):
            try:
                a = np.asarray(require_field(d, key, w), dtype=float)
            except (TypeError, ValueError):
                a = np.full(0, np.nan)
            if a.shape != b.shape or np.any(~np.isfinite(a)) or np.any(a < 0):
                raise ProfileError(f"profile field 'engine.{key}' must be {len(b)} finite seconds >= 0 (one per engine.b)")
            arrays.append(a)
        return cls(b, *arrays)

    def ad(self, b: ArrayLike) -> np.ndarray:
        """Seconds of engine host work per AD decode step at batch size ``b``."""
        return np.interp(b, self.b, self.ad_step_s)

    def sd(self, b: ArrayLike, gamma: ArrayLike) -> np.ndarray:
        """Seconds of engine host work per SD iteration at batch size ``b`` and depth ``gamma``."""
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
        refuse_unknown(d, ("rtt_ms", "bandwidth_bytes_per_s", "bytes_per_draft_token", "bytes_per_reply_token", "request_overhead_bytes"), w)
        return cls(
            rtt_ms=positive_field(d, "rtt_ms", w, allow_zero=True),
            bandwidth_bytes_per_s=positive_field(d, "bandwidth_bytes_per_s", w),
            bytes_per_draft_token=positive_field(d, "bytes_per_draft_token", w, allow_zero=True),
            bytes_per_reply_token=positive_field(d, "bytes_per_reply_token", w, allow_zero=True),
            request_overhead_bytes=positive_field({"v": d.get("request_overhead_bytes", 0.0)}, "v", f"{w}request_overhead_bytes", allow_zero=True),
        )


@dataclass(frozen=True)
class EdgeSpec:
    """The edge device of SpecEdge's split and the draft model's pass time on it (``edge:`` section).

    ``edge.device`` has the fields of ``device``; ``edge.latency`` is ``roofline`` (efficiencies and
    ``layer_overhead_s`` as in ``latency``) or ``table`` (a measured grid ``slm: {b, q, c, tau_s}``).
    The draft model is the profile's ``slm``; ``tau_draft(b, q, c)`` is its pass time on the edge.
    An optional ``edge.calibration`` (the top-level ``calibration``'s form, an ``slm`` curve only)
    scales it: the edge's own calibration, separate from the server's because the edge is another
    device (``runtime.machine_profile`` writes one when the edge drafts on the machine it measures).
    """

    device: DeviceSpec
    latency_source: str
    tau_draft: LatencyModel = field(compare=False)
    calibration: Calibration | None = field(default=None, compare=False)

    @classmethod
    def from_dict(cls, d: dict, slm: ModelSpec) -> EdgeSpec:
        if not isinstance(d, dict):
            raise ProfileError("profile field 'edge' must be a mapping with device and latency")
        refuse_unknown(d, ("device", "latency", "measured_on", "notes", "calibration"), "edge.")
        device = DeviceSpec.from_dict(require_field(d, "device", "edge."), "edge.device.")
        lat = require_field(d, "latency", "edge.")
        source = require_field(lat, "source", "edge.latency.")
        if source == "roofline":
            w = "edge.latency."
            eff = {k: positive_field(lat, k, w) for k in ("flops_efficiency", "bandwidth_efficiency")}
            for key, value in eff.items():
                if value > 1:
                    raise ProfileError(f"profile field 'edge.latency.{key}' must be in (0, 1], got {value}")
            over = positive_field({"v": lat.get("layer_overhead_s", 0.0)}, "v", "edge.latency.layer_overhead_s", allow_zero=True)
            tau = RooflineLatency(model=slm, device=device, layer_overhead_s=over, **eff)
        elif source == "table":
            tau = table_latency("slm", lat, "edge.latency.")
        else:
            raise ProfileError(f"profile field 'edge.latency.source' must be one of ['roofline', 'table'], got {source!r}")
        calibration = None
        if d.get("calibration") is not None:
            try:
                calibration = Calibration.from_dict(d["calibration"], "edge.calibration")
            except ValueError as exc:
                raise ProfileError(str(exc)) from None
            if calibration.llm is not None or calibration.slm is None:
                raise ProfileError("profile field 'edge.calibration' must give an 'slm' scale curve only (the edge runs the draft alone)")
            tau = CalibratedLatency(tau, calibration.slm)
        return cls(device, source, tau, calibration)


#: a profile's top-level sections (``fit`` and ``derived_from``: provenance that runtime.profile and
#: envs.split_profile write; read by people, not by the model)
PROFILE_SECTIONS = ("name", "notes", "device", "llm", "slm", "latency", "engine", "measured_on", "calibration", "edge", "network", "fit", "derived_from")


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
        refuse_unknown(d, PROFILE_SECTIONS, "")
        device = DeviceSpec.from_dict(require_field(d, "device", ""))
        llm = ModelSpec.from_dict(require_field(d, "llm", ""), "llm")
        slm = ModelSpec.from_dict(require_field(d, "slm", ""), "slm")
        lat = require_field(d, "latency", "")
        source = require_field(lat, "source", "latency.")
        if source not in LATENCY_SOURCES:
            raise ProfileError(f"profile field 'latency.source' must be one of {list(LATENCY_SOURCES)}, got {source!r}")
        if source == "roofline":
            w = "latency."
            common = dict(
                device=device,
                flops_efficiency=positive_field(lat, "flops_efficiency", w),
                bandwidth_efficiency=positive_field(lat, "bandwidth_efficiency", w),
            )
            for key in ("flops_efficiency", "bandwidth_efficiency"):
                if common[key] > 1:
                    raise ProfileError(f"profile field 'latency.{key}' must be in (0, 1], got {common[key]}")
            over = lat.get("layer_overhead_s", 0.0)
            over_l = positive_field({"v": lat.get("llm_layer_overhead_s", over)}, "v", "latency.llm_layer_overhead_s", allow_zero=True)
            over_s = positive_field({"v": lat.get("slm_layer_overhead_s", over)}, "v", "latency.slm_layer_overhead_s", allow_zero=True)
            tau_l = RooflineLatency(model=llm, layer_overhead_s=over_l, **common)
            tau_s = RooflineLatency(model=slm, layer_overhead_s=over_s, **common)
        elif source == "linear":
            def lin(key: str, spec: ModelSpec) -> LinearLatency:
                sub = require_field(lat, key, "latency.")
                w = f"latency.{key}."
                return LinearLatency(
                    model=spec,
                    intercept_s=positive_field(sub, "intercept_s", w, allow_zero=True),
                    per_flop_s=positive_field(sub, "per_flop_s", w, allow_zero=True),
                    per_byte_s=positive_field(sub, "per_byte_s", w, allow_zero=True),
                )
            tau_l, tau_s = lin("llm", llm), lin("slm", slm)
        else:
            tau_l, tau_s = table_latency("llm", lat), table_latency("slm", lat)
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
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            raise ProfileError(f"profile {str(path)!r} is not valid YAML: {exc}") from None
    profile = Profile.from_dict(data, name=path.stem)
    _LOADED[path] = (mtime_ns, profile)
    return profile
