"""Improve a feasible plan by exchange moves: one served user out, two rejected users in; or one
or two served users to the other mode, one rejected user in.

A plan that is maximal (no rejected user can be added) may still be one user short of the
optimum; the exact search finds such plans only after long dives. One sweep here tries every
move "drop served user j (or nobody), add rejected users i1 < i2 in modes (m1, m2)" -- for K = 70
some 10^4..10^5 candidate plans -- with the exact check on all of them at once
(``envs.feasibility.check_plans``), then the mode flips "move served users j1 (and j2) to the other
mode, add rejected user i in mode m", takes the first feasible plan and repeats. Every plan returned
passes the exact check, so it is a valid incumbent.
"""

from __future__ import annotations

import time

import numpy as np

from envs.cost_model import CostModel
from envs.feasibility import check_plans
from envs.plan import AD, SD
from envs.workload import Round


def _moves(modes: np.ndarray, max_plans: int) -> np.ndarray:
    """Candidate plans, one user more than ``modes`` each: ``(P, K)`` int8 (at most ``max_plans``)."""
    served = np.flatnonzero(modes)
    rejected = np.flatnonzero(modes == 0)
    if len(rejected) < 2:
        return np.zeros((0, len(modes)), dtype=np.int8)
    i1, i2 = np.triu_indices(len(rejected), 1)
    pairs = np.stack([rejected[i1], rejected[i2]], axis=1)  # (Q, 2)
    mode_pairs = np.array([(AD, AD), (AD, SD), (SD, AD), (SD, SD)], dtype=np.int8)
    drops = np.concatenate([[-1], served])  # -1: drop nobody (two users added outright)
    n = len(drops) * len(pairs) * len(mode_pairs)
    if n > max_plans:  # too many: a random subset, so each sweep still tries something new
        pick = np.sort(np.random.default_rng(len(served)).choice(n, size=max_plans, replace=False))
    else:
        pick = np.arange(n)
    d, rest = np.divmod(pick, len(pairs) * len(mode_pairs))
    p, m = np.divmod(rest, len(mode_pairs))
    out = np.repeat(modes[None, :], len(pick), axis=0)
    rows = np.arange(len(pick))
    drop = drops[d]
    out[rows[drop >= 0], drop[drop >= 0]] = 0
    out[rows, pairs[p, 0]] = mode_pairs[m, 0]
    out[rows, pairs[p, 1]] = mode_pairs[m, 1]
    return out


def _flip_moves(modes: np.ndarray, max_plans: int) -> np.ndarray:
    """Candidate plans that move one or two served users to the other mode and add one rejected
    user (in either mode): ``(P, K)`` int8, at most ``max_plans``."""
    served = np.flatnonzero(modes)
    rejected = np.flatnonzero(modes == 0)
    k = len(modes)
    if len(rejected) == 0 or len(served) == 0:
        return np.zeros((0, k), dtype=np.int8)
    i1, i2 = np.triu_indices(len(served), 1)
    flips = np.zeros((len(served) + len(i1), k), dtype=bool)  # which served users change mode
    flips[np.arange(len(served)), served] = True
    flips[len(served) + np.arange(len(i1)), served[i1]] = True
    flips[len(served) + np.arange(len(i1)), served[i2]] = True
    n = len(flips) * len(rejected) * 2
    pick = np.arange(n) if n <= max_plans else np.sort(np.random.default_rng(len(served)).choice(n, size=max_plans, replace=False))
    f, rest = np.divmod(pick, len(rejected) * 2)
    r, m = np.divmod(rest, 2)
    out = np.repeat(modes[None, :], len(pick), axis=0)
    out = np.where(flips[f], np.where(out == AD, SD, AD), out).astype(np.int8)  # AD <-> SD
    out[np.arange(len(pick)), rejected[r]] = np.where(m == 0, AD, SD)
    return out


def improve(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: int, time_limit_s: float, max_plans: int = 60_000, batch: int = 20_000) -> np.ndarray:
    """A feasible plan serving at least as many users as ``modes`` (which must be feasible).

    Sweeps of exchange moves (module docstring) while one succeeds and time is left.
    """
    modes = np.asarray(modes, dtype=np.int8).copy()
    if not check_plans(cost, rnd, modes, gamma).feasible:
        raise ValueError("improve needs a feasible plan to start from")
    stop = time.perf_counter() + time_limit_s
    while time.perf_counter() < stop:
        cands = np.concatenate([_moves(modes, max_plans), _flip_moves(modes, max_plans)])
        found = None
        for lo in range(0, len(cands), batch):
            chunk = cands[lo : lo + batch]
            ok = check_plans(cost, rnd, chunk, gamma).feasible
            if ok.any():
                found = chunk[int(np.argmax(ok))]
                break
            if time.perf_counter() >= stop:
                break
        if found is None:
            break
        modes = found
    return modes
