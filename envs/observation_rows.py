"""The per-step rows of a scalar environment's observation that depend on the step alone.

Both scalar environments (``EdgeSchedule-v0`` and ``-v1``) observe, at step ``t``, the current
user's features, a head (batch features, masks: written per step) and the next ``K_max`` users'
features. The user parts depend on ``t`` only, so a reset builds them for every ``t`` at once and a
step copies one row instead of assembling the observation (separate from the envs because both use
it and neither should import the other's internals). Also the batch features both heads share
(:func:`batch_features`), recomputed only when their mode admits a user.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from envs.plan_builder import ScalarPlan
    from envs.split_builder import SplitScalarPlan


def observation_rows(feats: np.ndarray, k_max: int, obs_size: int, tail: int) -> np.ndarray:
    """(K + 1, obs_size) float32 for ``feats`` (K, F), the round's users in presentation order: row
    ``t`` holds step ``t``'s current user in columns ``:F`` (zeros at ``t = K``) and, from column
    ``tail`` on, the next ``k_max`` users' (zero-padded past the round's end). Columns ``F:tail``
    (the head and the mask) are zero: the env writes them into its copy of the row every step."""
    k, f = feats.shape
    rows = np.zeros((k + 1, obs_size), dtype=np.float32)
    rows[:k, :f] = feats
    width = k_max * f
    pad = np.zeros((k + 1 + k_max) * f, dtype=np.float32)
    pad[: k * f] = feats.reshape(-1)
    # row t's look-ahead is pad[(t + 1) * F : (t + 1) * F + width]: a strided view, copied once
    size = pad.itemsize
    rows[:, tail : tail + width] = np.ndarray((k + 1, width), dtype=np.float32, buffer=pad, offset=f * size, strides=(f * size, size))
    return rows


def batch_features(plan: ScalarPlan | SplitScalarPlan, m: int, num_users: int, scales: tuple[float, float, float], budget_bytes: float) -> list[float]:
    """Batch ``m``'s six observation features, clipped to [0, 1]: its size over K, longest input and
    output over ``scales``' input / output ranges, compute share, KV bytes over ``budget_bytes``, and
    its least slack over ``scales``' deadline range (the range itself while the batch is empty).
    ``plan`` is either scalar plan (``envs.plan_builder.ScalarPlan`` or ``envs.split_builder.SplitScalarPlan``)."""
    i_hi, o_hi, t_hi = scales
    sl = plan.slack_min[m]
    a, b, c, d = plan.b[m] / num_users, plan.s_max[m] / i_hi, plan.n_max[m] / o_hi, plan.share[m]
    e, f = plan.mem[m] / budget_bytes, (sl if sl != math.inf else t_hi) / t_hi
    # each clipped to [0, 1], written out (a comprehension's frame showed in the step's profile)
    return [0.0 if a < 0.0 else (1.0 if a > 1.0 else a), 0.0 if b < 0.0 else (1.0 if b > 1.0 else b), 0.0 if c < 0.0 else (1.0 if c > 1.0 else c),
            0.0 if d < 0.0 else (1.0 if d > 1.0 else d), 0.0 if e < 0.0 else (1.0 if e > 1.0 else e), 0.0 if f < 0.0 else (1.0 if f > 1.0 else f)]
