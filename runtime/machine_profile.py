"""The planning profile for *this* machine: measured on first use, cached per machine fingerprint.

A shipped ``table`` profile describes the machine it was timed on; another machine of the same
kind (same CPU model name, same core count) can still run 15-30 % slower or faster. So the
simulator (``experiments.sim_vs_real``) and the live server (``runtime.serve``) ask for
``profile=auto`` by default and get a profile measured here:

- the *base* is the shipped table measured with the same torch thread count
  (:func:`default_base`: ``cpu1_specsched-pair`` for one thread, else ``cpu_specsched-pair``);
- the cache holds that base plus a quick calibration (``runtime.profile.quick_calibration``: a
  scale curve per model, measured here) and the engine overhead re-measured against it
  (``runtime.profile.quick_engine``: the base's engine section is a residual against its own
  uncalibrated table, which no longer adds up once the table is scaled) at
  ``<cache>/profiles/<fingerprint key>-<pair recipe>-<base>[-edge-here].yaml`` -- the fingerprint key hashes
  CPU / GPU, cores, threads, torch, dtype and the pair's recipe (``runtime.fingerprint``), so a home
  folder shared by two machines keeps one entry each;
- on a miss (no file, or the base file or the quick calibration's points changed since: both are
  recorded in the entry's ``derived_from``) the
  quick calibration runs (well under two minutes on the project's pair, with progress bars) and the
  entry is written atomically (temporary file + rename: a killed run leaves no half-written file).

``profile=NAME|PATH`` forces that profile as it is (a shipped or measured file is never
recalibrated behind the user's back; a measured one from elsewhere still warns, see
``runtime.fingerprint``). ``auto`` with the auto-measurement off (``auto_profile=false`` /
``--no-auto-profile``) plans with the base as it is.

    planning = resolve_profile("auto", pair=pair_folder, threads=1)
    print(planning.describe())        # which file, why, calibration factors
    load_profile(planning.path)       # the same file the server is given (profile=PATH)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from envs.profile import PROFILE_DIR, Profile, load_profile
from runtime.fingerprint import fingerprint_key, machine_fingerprint

if TYPE_CHECKING:
    from runtime.pair import ModelPair

log = logging.getLogger("specsched.profile")

AUTO = "auto"  #: the profile name that asks for a profile measured on this machine
SOURCES = ("forced", "cached", "measured", "base")  #: how a planning profile was chosen (see PlanningProfile.source)


def default_cache_dir() -> Path:
    """``$SPECSCHED_CACHE/profiles`` (default ``~/.cache/specsched/profiles``), the pair cache's sibling."""
    from runtime.pair import CACHE

    return CACHE / "profiles"


def default_base(threads: int) -> str:
    """The shipped table measured with ``threads`` torch threads (1: ``cpu1_...``, more: the two-thread one)."""
    return "cpu1_specsched-pair" if int(threads) == 1 else "cpu_specsched-pair"


def add_planning_profile_args(ap: argparse.ArgumentParser, auto_means: str) -> None:
    """The options an experiment picks its planning profile with: ``--profile`` (``auto`` or a NAME /
    .yaml PATH), ``--auto-profile/--no-auto-profile`` and ``--remeasure-profile``; ``auto_means``
    says what ``auto`` resolves to (for the help). Check them with :func:`check_planning_profile_args`."""
    ap.add_argument("--profile", default=AUTO, help=f"the profile the server and the simulator plan with: auto ({auto_means}) or a NAME / .yaml PATH used as it is")
    ap.add_argument("--auto-profile", action=argparse.BooleanOptionalAction, default=True,
                    help="with --profile auto: measure (once, cached) a calibration of the shipped table on this machine; off: the shipped table as it is")
    ap.add_argument("--remeasure-profile", action="store_true",
                    help="with --profile auto: measure this machine's calibration again even if cached (e.g. the cached one was measured on a busy machine)")


def check_planning_profile_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``ap.error`` on contradicting options of :func:`add_planning_profile_args`."""
    if args.profile != AUTO and (not args.auto_profile or args.remeasure_profile):
        ap.error("--no-auto-profile and --remeasure-profile only apply to --profile auto (a named profile is always used as it is)")
    if args.remeasure_profile and not args.auto_profile:
        ap.error("--remeasure-profile contradicts --no-auto-profile")


def default_split_base(threads: int) -> str:
    """The shipped split profile of the project's pair for ``threads`` torch threads (its server and edge tables)."""
    return f"split_{default_base(threads)}"


def profile_file(name_or_path: str | Path) -> Path:
    """The file a profile name (``envs/profiles/NAME.yaml``) or ``.yaml`` path refers to (checked to exist)."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        load_profile(name_or_path)  # raises ProfileError naming the profile and the available ones
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cache_entry(cache_dir: Path, fingerprint: dict, base: Path, edge_here: bool = False) -> Path:
    """Where the calibrated copy of ``base`` for the machine ``fingerprint`` lives (``edge_here``: the
    copy whose edge section is calibrated here too, see :func:`resolve_profile`)."""
    suffix = "-edge-here" if edge_here else ""
    return Path(cache_dir) / f"{fingerprint_key(fingerprint)}-{fingerprint.get('pair_recipe') or 'pair'}-{base.stem}{suffix}.yaml"


@dataclass(frozen=True)
class PlanningProfile:
    """The profile a run plans with, and why.

    ``source``: ``forced`` (asked for by name or path), ``cached`` (this machine's calibration
    from the cache), ``measured`` (calibrated just now and cached), ``base`` (``auto`` with the
    auto-measurement off: the shipped base as it is).
    """

    path: Path
    source: str
    base: Path
    fingerprint: dict
    profile: Profile = field(compare=False, repr=False)
    measure_s: float | None = None  #: how long the quick calibration took (``measured`` only)

    @property
    def key(self) -> str:
        return fingerprint_key(self.fingerprint)

    def calibration_factors(self) -> dict[str, dict[int, float]]:
        """``{model: {q: scale}}`` of the profile's calibration (empty without one)."""
        cal = self.profile.calibration
        if cal is None:
            return {}
        return {key: {int(q): float(s) for q, s in zip(curve.q, curve.scale, strict=True)} for key, curve in (("llm", cal.llm), ("slm", cal.slm)) if curve is not None}

    def summary(self) -> dict:
        """Flat fields for a report: path, source, machine key, where table and calibration were measured, factors."""
        on = self.profile.measured_on
        cal = self.profile.calibration
        factors = self.calibration_factors()
        return {
            "profile": str(self.path), "source": self.source, "base": str(self.base), "machine key": self.key, "this machine": _on(self.fingerprint),
            "table measured on": _on(on) if on else "not recorded",
            "calibration measured on": _on(cal.measured_on) if cal is not None and cal.measured_on else "none",
            "calibration": "; ".join(f"{k} " + ", ".join(f"x{s:.3g} at q {q}" for q, s in v.items()) for k, v in factors.items()) or "none",
            "engine overhead": _engine_line(self.profile.engine),
        }

    def describe(self) -> str:
        """One line for a log: which file, why, and its calibration factors."""
        why = {"forced": "as asked", "cached": "this machine's cached calibration", "measured": f"calibrated here just now ({self.measure_s or 0:.0f} s) and cached",
               "base": "auto-measurement off: the shipped base as it is"}[self.source]
        s = self.summary()
        return f"planning profile {self.path} ({why}; machine {self.key}); table measured on {s['table measured on']}; calibration: {s['calibration']}"


def _engine_line(engine) -> str:
    """The engine section per batch size, in ms (``none`` without one)."""
    if engine is None:
        return "none"

    def ms(values) -> str:
        return "/".join(f"{v * 1e3:.2f}" for v in values)

    return (f"per AD step {ms(engine.ad_step_s)} ms, per SD iteration {ms(engine.sd_iteration_s)} ms + gamma x {ms(engine.sd_draft_step_s)} ms "
            f"at b {'/'.join(str(int(b)) for b in engine.b)}")


def _on(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def quick_method(edge_here: bool = False) -> str:
    """The quick calibration's points: an entry measured at other points (an older version) is re-measured."""
    from runtime import profile as p

    return (f"b {list(p.QUICK_B)}, steps q {list(p.QUICK_Q)} over c {list(p.QUICK_C)}, padded prefills q = c {list(p.QUICK_PREFILL)} at b {list(p.QUICK_PREFILL_B)}; "
            f"engine at b {list(p.QUICK_ENGINE_B)} x {p.QUICK_ENGINE_TRIALS}, prompts {list(p.QUICK_ENGINE_PROMPTS)}, outputs {list(p.QUICK_ENGINE_OUTPUTS)}"
            + ("; edge section: this machine's draft curve" if edge_here else ""))


def _load_entry(path: Path, base_sha: str, key: str, method: str) -> Profile | None:
    """A usable cache entry, or None when missing, unreadable, made from another base, by another
    version of the quick calibration (``method``), or on another machine."""
    try:
        data = yaml.safe_load(path.read_text())
        prof = Profile.from_dict(data, name=path.stem)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        if path.exists():
            log.warning("ignoring the unreadable profile cache entry %s (%s); measuring again", path, exc)
        return None
    derived = data.get("derived_from") or {}
    if derived.get("base_sha256") != base_sha or derived.get("method") != method:
        log.info("profile cache entry %s was made from another version of its base or of the quick calibration; measuring again", path)
        return None
    if prof.calibration is None or fingerprint_key(prof.calibration.measured_on) != key:
        return None
    return prof


def measure_quick(pair: ModelPair, base: dict, fingerprint: dict, progress: bool) -> dict:
    """The sections the quick profile writes over ``base``, measured on ``pair``: ``calibration``
    (``runtime.profile.quick_calibration``) and ``engine`` (``runtime.profile.quick_engine``, against it)."""
    from runtime.profile import QUICK_PREFILL_B, quick_calibration, quick_engine

    calibration = quick_calibration(pair, base, measured_on=fingerprint, progress=progress, prefill_b=QUICK_PREFILL_B)
    return {"calibration": calibration, "engine": quick_engine(pair, {**base, "calibration": calibration}, progress=progress)}


def _check_edge_here(base: Path) -> None:
    """``edge_here`` scales the edge by the draft's quick-calibration curve, which is measured against
    the base's *server* draft table (``latency.slm``): right only when the edge's table is that same
    table (the shipped CPU split profiles: one CPU measured for both roles). Raise ValueError otherwise."""
    data = yaml.safe_load(base.read_text())
    edge = data.get("edge") or {}
    if not edge:
        raise ValueError(f"edge_here needs a split profile (an edge section) as the base, got {base}")
    if (edge.get("latency") or {}).get("slm") != (data.get("latency") or {}).get("slm"):
        raise ValueError(f"edge_here needs a base whose edge.latency.slm table is its latency.slm table (the curve is measured against "
                         f"the latter), got {base}: calibrate such an edge on its own device (runtime.profile --role edge)")


def resolve_profile(requested: str | Path, *, pair: ModelPair | None, device: str = "cpu", dtype: str = "float32", threads: int | None = None, auto: bool = True,
                    base: str | Path | None = None, refresh: bool = False, cache_dir: Path | None = None,
                    measure: Callable[..., dict] = measure_quick, progress: bool = True, edge_here: bool = False) -> PlanningProfile:
    """The profile to plan with (see the module docstring).

    ``pair``: a loaded ``ModelPair`` or a pair folder (loaded only when a measurement is needed);
    ``threads``: the torch thread count the run uses (default: torch's current), measured with;
    ``base``: the table ``auto`` calibrates (default :func:`default_base` of ``threads``);
    ``refresh``: measure again even when the cache has an entry (e.g. the first use was on a busy machine);
    ``measure(pair, base_dict, fingerprint, progress) -> {"calibration": section, "engine": section (optional)}``
    is replaceable for tests;
    ``edge_here``: the base is a split profile (an ``edge`` section) whose edges draft on *this*
    machine (one box standing in for the testbed, e.g. ``experiments.split_sim_vs_real``): the
    edge section gets its own ``calibration``, the draft's curve measured here. Without it an
    edge section is left as it is -- on a testbed the edge is another device, measured there
    (``runtime.profile --role edge``).
    Raises ``ProfileError`` for an unknown profile and ``ValueError`` when the base does not describe the pair.
    """
    import torch

    threads = int(threads or torch.get_num_threads())
    fp = machine_fingerprint(device, dtype, threads, pair)
    if str(requested) != AUTO:
        path = profile_file(requested)
        return PlanningProfile(path, "forced", path, fp, load_profile(path))
    base = profile_file(base if base is not None else default_base(threads))
    if edge_here:
        _check_edge_here(base)
    if not auto:
        return PlanningProfile(base, "base", base, fp, load_profile(base))
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry, base_sha, method = cache_entry(cache_dir, fp, base, edge_here), _sha256(base), quick_method(edge_here)
    hit = None if refresh else _load_entry(entry, base_sha, fingerprint_key(fp), method)
    if hit is not None and (not edge_here or hit.edge is not None and hit.edge.calibration is not None):
        return PlanningProfile(entry, "cached", base, fp, hit)
    cache_dir.mkdir(parents=True, exist_ok=True)  # fails now, before minutes of measuring, if it cannot exist
    data = yaml.safe_load(base.read_text())
    if isinstance(pair, str | Path):
        from runtime.pair import load_pair

        pair = load_pair(pair, device=device, dtype=dtype)
    log.warning("no profile measured on this machine (%s) in %s: calibrating %s here (quick profile, < 2 min)", fingerprint_key(fp), cache_dir, base.name)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # measured with the thread count the run uses
    start = time.perf_counter()
    try:
        sections = measure(pair, data, fp, progress)
    finally:
        torch.set_num_threads(before)
    took = time.perf_counter() - start
    unknown = set(sections) - {"calibration", "engine"}
    if "calibration" not in sections or unknown:
        raise ValueError(f"the quick profile's measure() must return a 'calibration' and optionally an 'engine' section, got {sorted(sections)}")
    data.update(sections)
    if edge_here:
        if sections["calibration"].get("slm") is None:
            raise ValueError("edge_here: the quick profile's calibration must have an 'slm' curve (the edges' draft)")
        # the edges draft on this machine, so the draft's curve measured here is theirs too (a copy: shared
        # objects would be written as YAML anchors)
        data["edge"] = {**data["edge"], "calibration": {"measured_on": dict(fp), "slm": copy.deepcopy(sections["calibration"]["slm"]),
                                                        "notes": "runtime.machine_profile edge_here: the draft's quick-calibration curve of the machine the edges draft on"}}
    data["name"] = entry.stem
    data["derived_from"] = {"base": str(base), "base_sha256": base_sha, "method": method, "note": "runtime.machine_profile: the base table with a quick calibration (and engine overhead, when measured) measured on this machine"}
    prof = Profile.from_dict(data, name=entry.stem)  # validate before writing
    from runtime.profile_inputs import write_profile

    write_profile(data, entry)
    return PlanningProfile(entry, "measured", base, fp, prof, measure_s=took)
