"""Batched round resets of the EdgeSchedule-v1 vector env (issue #13: the vector env's hot spot).

Sub-envs of a vector env end their rounds together (every round has ``K`` users), so one ``step``
typically resets many of them. Resetting them one at a time cost most of the vector env's time:
per round a ``sample_round``, an ``ed_users`` and a ``round_features`` call, each a few dozen small
numpy operations. Here each sub-env still draws its round from its **own** generator
(:func:`envs.workload.draw_round`, the same draws in the same order as ``sample_round``), and then
everything that is arithmetic runs once on the users of all resetting rounds concatenated:
:func:`envs.workload.round_from_draws`, :func:`envs.split_plan.ed_users_arrays` and
:func:`envs.v1_user_features.user_feature_table` are element-wise per user (row-wise per user over
depths), so every user gets the values it got alone. ``tests/test_v1_reset_batch.py`` checks that
bit for bit against ``sample_round``, the per-round load and the scalar env.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from envs.config import EnvConfig
from envs.split_cost import SplitCostModel
from envs.split_plan import EdUsers, ed_users_arrays
from envs.v1_user_features import USER_FEATURES, user_feature_table
from envs.workload import Round, draw_round, round_from_draws

_FIELDS = tuple(f.name for f in fields(Round))


class V1Rounds:
    """Per-round arrays in presentation order, stacked for N rounds (the v1 vector env's; :func:`load_rounds` fills them)."""

    def __init__(self, n: int, k: int, g: int, k_max: int):
        self.order = np.zeros((n, k), dtype=np.int64)
        self.inp = np.zeros((n, k), dtype=np.int64)
        self.out = np.zeros((n, k), dtype=np.int64)
        self.alpha, self.up, self.slack, self.deadline, self.prefill = (np.zeros((n, k)) for _ in range(5))
        self.ed_j = np.ones((n, k, g), dtype=np.int64)
        self.ed_x = np.zeros((n, k, g))
        self.ed_ok = np.zeros((n, k, g), dtype=bool)
        # users 0..k-1 then k_max + 1 rows of zeros: the current user at t = k and the look-ahead past
        # the round's end read zeros, so the look-ahead is one slice (no per-element gather and mask)
        self.feats = np.zeros((n, k + k_max + 1, USER_FEATURES), dtype=np.float32)
        self.rounds: list[Round | None] = [None] * n
        self.users: list[EdUsers | None] = [None] * n

    def user(self, t: np.ndarray) -> tuple[np.ndarray, ...]:
        """``SplitPlanBuilder.prepare``'s arguments: user ``t[i]`` of every round ``i`` (the last user past the end)."""
        rows = np.arange(len(t))
        tt = np.minimum(t, self.inp.shape[1] - 1)
        return (self.inp[rows, tt], self.out[rows, tt], self.alpha[rows, tt], self.up[rows, tt], self.slack[rows, tt], self.deadline[rows, tt],
                self.ed_j[rows, tt], self.ed_x[rows, tt], self.ed_ok[rows, tt], self.prefill[rows, tt])


def sample_rounds(rngs: Sequence[np.random.Generator], cfg: EnvConfig) -> tuple[list[Round], Round]:
    """``[sample_round(rng, cfg) for rng in rngs]`` (the same values), and the rounds' users
    concatenated as one :class:`Round` (round ``j``'s users are rows ``j K .. (j + 1) K - 1``; the
    returned rounds are views of it)."""
    draws = [draw_round(rng, cfg) for rng in rngs]
    columns = [None if col[0] is None else np.concatenate(col) for col in zip(*draws, strict=True)]
    big = round_from_draws(cfg, *columns)
    k = cfg.num_users
    arrays = [getattr(big, name) for name in _FIELDS]
    return [Round(*(a[j * k : (j + 1) * k] for a in arrays)) for j in range(len(rngs))], big


def _round_parts(rounds: Sequence[Round], rtt_default: float) -> dict[str, list[np.ndarray]]:
    """Per field, the rounds' arrays as given (a round without ``has_edge`` / ``rtt_s``: no edge /
    ``rtt_default``, as float64)."""
    parts = {}
    for name in _FIELDS:
        if name == "has_edge":
            parts[name] = [np.zeros(r.num_users, dtype=bool) if r.has_edge is None else np.asarray(r.has_edge) for r in rounds]
        elif name == "rtt_s":
            parts[name] = [np.full(r.num_users, rtt_default) if r.rtt_s is None else np.asarray(r.rtt_s) for r in rounds]
        else:
            parts[name] = [np.asarray(getattr(r, name)) for r in rounds]
    return parts


def concat_rounds(rounds: Sequence[Round], rtt_default: float = 0.0) -> Round | None:
    """``rounds``' users concatenated (a round without ``has_edge`` / ``rtt_s`` counts as no edge /
    ``rtt_default`` there), every array in the rounds' own dtype -- or None when the rounds' dtypes
    differ for some field. Concatenating would then cast (float32 next to float64 becomes float64),
    and a feature such as ``rtt / 0.1`` computed in float32 differs from the float64 one by a float32
    step: such rounds are loaded one at a time, each in its own dtypes, as the scalar env reads them."""
    parts = _round_parts(rounds, rtt_default)
    if any(len({a.dtype for a in arrays}) > 1 for arrays in parts.values()):
        return None
    return Round(**{name: np.concatenate(arrays) for name, arrays in parts.items()})


def load_rounds(data: V1Rounds, idx: np.ndarray, rounds: Sequence[Round], cfg: EnvConfig, split: SplitCostModel | None,
                big: Round | None = None) -> None:
    """Write ``rounds[j]`` into sub-env ``idx[j]``'s rows of ``data`` (presentation order, features,
    ED constants), as the vector env once loaded them one round at a time. ``big``: the rounds' users concatenated
    (:func:`sample_rounds`), built here when not given."""
    m, k = len(idx), cfg.num_users
    if m == 0:
        return
    g_max = cfg.max_gamma
    # the features of a round without edge information are 0 (rtt 0 / 0.1 clips to 0); its ED rows are rtt-free (no user has an edge)
    if big is None:
        big = concat_rounds(rounds)
        if big is None:  # given rounds of different dtypes: one at a time (concat_rounds)
            for j in range(m):
                load_rounds(data, idx[j : j + 1], rounds[j : j + 1], cfg, split)
            return
    arrival = cfg.user_order == "arrival"
    order = np.broadcast_to(np.arange(k), (m, k)) if arrival else np.stack([r.order(cfg.user_order) for r in rounds])
    base = (np.arange(m) * k)[:, None]
    gidx = None if arrival else (order + base).reshape(-1)  # presentation order in the concatenation

    def present(a: np.ndarray) -> np.ndarray:
        return a if gidx is None else a[gidx]

    inp, out, alpha, up, deadline = (present(a) for a in (big.input_tokens, big.output_tokens, big.alpha, big.uplink_s, big.deadline_s))
    slack = present(big.deadline_s - big.downlink_s)  # Round.slack_s, element-wise: gathered after as before
    has_any = any(r.has_edge is not None for r in rounds)
    rtt_any = any(r.rtt_s is not None for r in rounds)
    feats = user_feature_table(inp, out, deadline, alpha, slack, up, present(big.has_edge) if has_any else None,
                               present(big.rtt_s) if rtt_any else None, cfg)
    data.order[idx] = order
    data.inp[idx], data.out[idx], data.alpha[idx] = inp.reshape(m, k), out.reshape(m, k), alpha.reshape(m, k)
    data.up[idx], data.slack[idx], data.deadline[idx] = up.reshape(m, k), slack.reshape(m, k), deadline.reshape(m, k)
    data.feats[idx, :k] = feats.reshape(m, k, -1)
    for j, i in enumerate(idx.tolist()):
        data.rounds[i] = rounds[j]
        data.users[i] = None
    # ED constants for the rounds with at least one edge user (the others: J = 1, X = 0, not allowed, no prefill)
    edge = np.zeros(m, dtype=bool) if split is None or not has_any else big.has_edge.astype(bool).reshape(m, k).any(axis=1)
    none = idx[~edge]
    data.ed_j[none], data.ed_x[none], data.ed_ok[none], data.prefill[none] = 1, 0.0, False, 0.0
    if not edge.any():
        return
    pos = np.flatnonzero(edge)
    me = len(pos)
    rows = (base[pos] + np.arange(k)).reshape(-1)  # the edge rounds' users, in the rounds' original order
    rtt = big.rtt_s[rows] if all(rounds[p].rtt_s is not None for p in pos.tolist()) else \
        np.concatenate([np.full(k, split.net.rtt_s) if rounds[p].rtt_s is None else np.asarray(rounds[p].rtt_s, dtype=float) for p in pos.tolist()])
    users = ed_users_arrays(split, big.input_tokens[rows], big.output_tokens[rows], big.alpha[rows], big.has_edge[rows].astype(bool), rtt, g_max)
    for e, p in enumerate(pos.tolist()):
        s = slice(e * k, (e + 1) * k)
        data.users[int(idx[p])] = EdUsers(users.tokens[s], users.iterations[s], users.edge_s[s], users.allowed[s], users.prefill_s[s])
    local = order[pos] + (np.arange(me) * k)[:, None]  # presentation order within the edge rounds' block
    at = idx[pos]
    data.ed_j[at] = users.iterations[local]
    data.ed_x[at] = users.edge_s[local]
    data.ed_ok[at] = users.allowed[local]
    data.prefill[at] = users.prefill_s[local]
