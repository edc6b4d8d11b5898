"""``runtime.profile --role edge``: measure the draft model on this (edge) device into the
profile's ``edge`` section (``envs.profile.EdgeSpec``: the device, and a ``table`` of the draft's
pass times ``slm: {b, q, c, tau_s}``). The profile at ``--out`` must already exist (measured with
``--role server`` on the server, or shipped): only its ``edge`` section is replaced, everything
else is kept, and the result is validated before it is written atomically.

``--role server`` is the profiler's ordinary measurement (both models on the server's device, the
``llm``/``slm``/``latency`` sections); it keeps an ``edge`` or ``network`` section that ``--out``
already has.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import yaml
from tqdm import tqdm

from runtime.pass_timing import device_spec, time_pass

if TYPE_CHECKING:
    from runtime.pair import ModelPair

#: sections a server-role measurement keeps from an existing profile
SPLIT_SECTIONS = ("edge", "network")


def edge_section(pair: ModelPair, device: str, dtype: str, b_grid: Sequence[int], q_grid: Sequence[int], c_grid: Sequence[int], repeats: int, measured_on: dict, progress: bool = True) -> dict:
    """The ``edge`` section: this device and the draft model's measured pass times on it."""
    tau = np.zeros((len(b_grid), len(q_grid), len(c_grid)))  # (b, q, c) seconds
    points = [(i, j, k) for i in range(len(b_grid)) for j in range(len(q_grid)) for k in range(len(c_grid))]
    for i, j, k in tqdm(points, desc="profiling the draft on the edge", disable=not progress):
        q = q_grid[j]
        tau[i, j, k] = time_pass(pair.draft, b_grid[i], q, max(c_grid[k], q), repeats)
    return {"device": device_spec(device, dtype), "measured_on": dict(measured_on),  # the matmul peak in the models' dtype, as the server role
            "notes": f"runtime.profile --role edge on {time.strftime('%Y-%m-%d')}, device {device}, dtype {dtype}, {torch.get_num_threads()} torch thread(s), {repeats} repeats (median)",
            "latency": {"source": "table", "slm": {"b": list(map(int, b_grid)), "q": list(map(int, q_grid)), "c": list(map(int, c_grid)), "tau_s": tau.tolist()}}}


def merge_edge_section(out: Path, section: dict) -> dict:
    """The profile at ``out`` with its ``edge`` section replaced, validated (``ProfileError`` if not)."""
    from envs.profile import Profile

    profile = yaml.safe_load(out.read_text())
    profile["edge"] = section
    Profile.from_dict(profile, name=str(profile.get("name", out.stem)))
    return profile


def kept_split_sections(out: Path) -> dict:
    """The ``edge``/``network`` sections of an existing profile at ``out`` (for a server-role rewrite)."""
    if not out.is_file():
        return {}
    old = yaml.safe_load(out.read_text()) or {}
    return {k: old[k] for k in SPLIT_SECTIONS if old.get(k) is not None}
