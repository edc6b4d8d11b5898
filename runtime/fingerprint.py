"""Where a profile was measured, and whether the running machine and pair are the same.

A ``table`` profile describes the machine and the model pair it was timed on. ``runtime.profile``
records that as the profile's ``measured_on`` section (and a quick calibration records its own);
:func:`warn_if_measured_elsewhere` compares it with the running machine and pair and warns with
every difference, so a simulator or an admission controller that is about to trust the profile's
times on other hardware says so. ``envs/`` only stores the section; the comparison lives here
because only the runtime knows the machine and the pair it runs.

    fp = machine_fingerprint(device="cpu", dtype="float32", pair=pair)
    warn_if_measured_elsewhere(load_profile("cpu_specsched-pair"), fp)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from envs.profile import Profile

if TYPE_CHECKING:
    from runtime.pair import ModelPair

#: the fields compared, in the order a warning lists them
FIELDS = ("cpu_model", "gpu_name", "cores", "threads", "torch", "dtype", "pair_recipe")


class ProfileProvenanceWarning(UserWarning):
    """A measured profile is used on a machine or pair other than the one it was measured on."""


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def pair_recipe(pair_dir: str | Path | None) -> str | None:
    """The recipe hash of a pair built by ``runtime.pair`` (None for other pairs or no folder)."""
    if pair_dir is None:
        return None
    try:
        return json.loads((Path(pair_dir) / "pair.json").read_text()).get("recipe_digest")
    except (OSError, ValueError):
        return None


def machine_fingerprint(device: str = "cpu", dtype: str = "float32", threads: int | None = None, pair: ModelPair | None = None) -> dict:
    """This machine as a profile's ``measured_on`` records it.

    ``threads`` defaults to torch's current CPU thread count; ``pair`` is a ``ModelPair`` or a pair
    folder (its recipe hash is recorded when it is one of the project's own pairs).
    """
    fp: dict = {"cpu_model": cpu_model(), "cores": os.cpu_count(), "threads": int(threads or torch.get_num_threads()), "torch": str(torch.__version__), "dtype": str(dtype)}
    if str(device).startswith("cuda"):
        fp["gpu_name"] = str(torch.cuda.get_device_name(torch.device(device)))
    folder = getattr(pair, "path", pair)
    recipe = pair_recipe(folder)
    if recipe is not None:
        fp["pair_recipe"] = recipe
    return fp


def fingerprint_key(fp: dict) -> str:
    """A short stable hash of a fingerprint's compared fields: a cache key for per-machine profiles."""
    fields = {k: str(fp[k]).split("+")[0] if k == "torch" else str(fp[k]) for k in FIELDS if fp.get(k) is not None}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def provenance_differences(recorded: dict, current: dict) -> dict[str, tuple]:
    """``{field: (recorded, current)}`` for every field both sides know and disagree on.

    A GPU recorded on one side only is a difference (CPU vs GPU); other fields one side does not
    record are not (old profiles lack some fields, foreign pairs have no recipe hash).
    """
    out = {}
    for key in FIELDS:
        a, b = recorded.get(key), current.get(key)
        if key == "gpu_name" and (a is None) != (b is None):
            out[key] = (a, b)
        elif key == "torch" and a is not None and b is not None and str(a).split("+")[0] != str(b).split("+")[0]:
            out[key] = (a, b)  # a local build tag (+cpu, +cu121) is not a different torch for timing purposes
        elif key != "torch" and a is not None and b is not None and str(a) != str(b):
            out[key] = (a, b)
    return out


def warn_if_measured_elsewhere(profile: Profile, current: dict, stacklevel: int = 2) -> dict[str, tuple]:
    """Warn (``ProfileProvenanceWarning``) when a measured profile describes another machine or pair.

    Analytic profiles (roofline, linear) describe no machine and are never warned about. Returns
    the differences (empty when the profile matches, or is analytic).
    """
    if profile.latency_source != "table":
        return {}
    recorded = profile.provenance()
    if not recorded:
        warnings.warn(f"profile {profile.name!r} is a measured table but does not record where it was measured (no measured_on); "
                      f"its times may not describe this machine -- run `python -m runtime.profile --quick` here", ProfileProvenanceWarning, stacklevel=stacklevel)
        return {}
    diff = provenance_differences(recorded, current)
    if diff:
        what = "; ".join(f"{k}: {a!r} in the profile, {b!r} here" for k, (a, b) in diff.items())
        source = "its calibration was" if profile.calibration is not None else "it was"
        warnings.warn(f"profile {profile.name!r} describes another machine or pair than this one ({source} measured elsewhere): {what}. "
                      f"Its times may be off here -- run `python -m runtime.profile --quick` to calibrate it, or plan with profile=auto "
                      f"(calibrated here on first use and cached: runtime.machine_profile)", ProfileProvenanceWarning, stacklevel=stacklevel)
    return diff
