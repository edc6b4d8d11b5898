"""Dominance between users of one round: symmetry breaking for the exact search.

User ``j`` *dominates* user ``i`` in mode m when ``j`` is at least as demanding as ``i`` in every
aggregate a batch of mode m depends on: input, output, SD iterations (SD only), tightest slack
``T_k - t_d,k`` (smaller is more demanding) and uplink time. Then in any feasible plan that
serves ``j`` in mode m and rejects ``i``, swapping them (``i`` into m, ``j`` rejected) is feasible
too and serves as many users: the batch keeps its size, none of its maxima rises, its tightest
slack does not fall and its KV memory does not grow (``O_i <= O_j``) -- *provided the batch costs
rise with every aggregate*, which :attr:`agents.cost_envelope.CostEnvelope.monotone` checks on
the round's own values (the only values a batch's maxima can take).

So with the users in a search order ``order`` and only pairs where the dominator comes first,
there is always a plan at least as large in which **every served dominator's dominated users are
served too**: repeat the swap while some pair violates it; each swap moves a served slot to a
later position in ``order``, so the sum of the served positions rises and the process stops.
An exact search may therefore forbid rejecting a user whose dominator (earlier in ``order``) is
served in the matching mode, and prune partial plans where such a user can no longer fit,
without losing any plan size.
"""

from __future__ import annotations

import numpy as np

from agents.cost_envelope import CostEnvelope
from envs.plan import AD, SD
from envs.workload import Round


def dominance(env: CostEnvelope, rnd: Round, order: np.ndarray) -> dict[int, np.ndarray]:
    """Per mode, ``dom[p, q]``: the user at search position ``p`` dominates the one at ``q > p``.

    Empty (all False) matrices when the round's costs are not monotone, since the swap argument
    of the module docstring needs them to be.
    """
    k = len(order)
    out = {AD: np.zeros((k, k), dtype=bool), SD: np.zeros((k, k), dtype=bool)}
    if not env.monotone or k == 0:
        return out
    v = env.user_values
    # every attribute oriented so that larger = more demanding
    common = [v["input"][order], v["output"][order], -np.asarray(rnd.slack_s, dtype=float)[order], np.asarray(rnd.uplink_s, dtype=float)[order]]
    later = np.triu(np.ones((k, k), dtype=bool), 1)
    geq = later.copy()
    for a in common:
        geq &= a[:, None] >= a[None, :]
    out[AD] = geq
    it = v["iterations"][order]
    out[SD] = geq & (it[:, None] >= it[None, :])
    return out


def forced(paths: np.ndarray, dom: dict[int, np.ndarray], level: int) -> np.ndarray:
    """``(n, K - level)`` bool: users at positions ``level..`` that partial plans ``paths``
    (``(n, level)`` modes in search order) must serve, because a served dominator demands it."""
    f = np.zeros((paths.shape[0], dom[AD].shape[0] - level), dtype=bool)
    if level == 0:
        return f
    for m in (AD, SD):
        d = dom[m][:level, level:]
        if d.any():
            f |= ((paths == m).astype(np.float32) @ d.astype(np.float32)) > 0
    return f
