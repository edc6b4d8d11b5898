"""What counts as an action of the round-admission environments.

``Discrete(2 + G)``: 0 = reject, 1 = AD, ``1 + g`` = SD at depth ``g``. An action that names none of
these -- out of range, non-integral (1.5), non-finite or non-numeric -- is *not* truncated or
clipped onto a real action: every path (the scalar env, the vector env, ``PlanBuilder``) treats it
as reject and the envs flag it (DESIGN.md §3). One module so the env and the builders beneath it
share one rule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def action_index(action: Any, num_actions: int) -> int:
    """The action as an index in ``[0, num_actions)``, or -1 if it names no action.

    Out-of-range, non-integral (1.5), non-finite and non-numeric actions name no action, so the
    environment treats them as reject and flags them (DESIGN.md §3) instead of truncating or
    clipping them onto a real action. An integral float (``np.float32(1.0)``) is that integer.
    """
    a = np.asarray(action)
    if a.size != 1:
        raise ValueError(f"action must be one integer in [0, {num_actions}), got an array of shape {a.shape}")
    v = a.reshape(()).item()
    if isinstance(v, bool | int):
        i = int(v)
    elif isinstance(v, float) and math.isfinite(v) and v.is_integer():
        i = int(v)
    else:
        return -1
    return i if 0 <= i < num_actions else -1


def action_indices(actions: Any, num_envs: int, num_actions: int) -> np.ndarray:
    """:func:`action_index` for one action per sub-env: (num_envs,) int64, -1 where invalid."""
    a = np.asarray(actions)
    if a.size != num_envs:
        raise ValueError(f"actions must hold one action per sub-env ({num_envs}), got shape {a.shape}")
    a = a.reshape(num_envs)
    if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
        idx = a.astype(np.int64)
    elif np.issubdtype(a.dtype, np.floating):
        # bounded before the cast: a huge float would wrap around to a valid int64
        integral = np.isfinite(a) & (np.floor(a) == a) & (np.abs(a) < num_actions)
        idx = np.where(integral, a, -1).astype(np.int64)
    else:
        idx = np.array([action_index(x, num_actions) for x in a], dtype=np.int64)
    return np.where((idx >= 0) & (idx < num_actions), idx, -1)
