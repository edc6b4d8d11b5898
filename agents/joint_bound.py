"""A proven upper bound on a round's optimum that counts every user once (the *joint* bound).

The split bound (``agents.optimal.split_upper_bound``) adds the AD optimum at share ``z`` to the
SD optimum at ``1 - z`` -- but both per-mode optima like the same users (short outputs, loose
deadlines, short inputs), so at K = 200 some 40 % of the users it counts are counted twice. This
bound charges the two batches' KV memory *jointly*, so each user pays for one batch only.

Take an optimal plan: AD batch ``A`` (size ``a``, longest input ``S_A``), SD batch ``S`` (size
``s``, longest input ``S_S``), disjoint, minimal compute shares ``r_A + r_S <= 1`` and memory
(``kv_memory = "per_user"``)

    kv_L (a S_A + sum_A O_k) + kv_SD (s (S_S + gamma) + sum_S O_k) + s w_SD <= budget(s > 0)

(``w_SD`` the per-SD-user workspace bytes). Cut the z axis into cells and the round's inputs
into buckets ``(L_{j-1}, L_j]``; ``r_A`` lies in some cell ``[z_i, z_{i+1}]`` (so ``r_S <= 1 -
z_i``), ``S_A`` in some bucket ``j_A`` and ``S_S`` in some ``j_S``. Let ``lo_j`` be the smallest
user input in bucket ``j``. With batch costs that rise with size, input, output and iterations
(:attr:`agents.cost_envelope.CostEnvelope.monotone`; the caller checks it):

1. *who can be in the batches*: every member ``k`` of ``A`` has ``I_k <= S_A <= L_{j_A}`` and
   ``slack_k - uplink_k >= beta_A >= C_A(a, S_A, N_A) / r_A >= C_A(a, lo_{j_A}, O_k) / z_{i+1}``,
   so ``A`` lies in ``E_A = {k : I_k <= L_{j_A}, C_A(a, lo_{j_A}, O_k) <= z_{i+1} (slack_k -
   uplink_k)}``; SD alike with ``C_S(s, lo_{j_S}, N = 0, J_k)`` (context growth ignored, a lower
   bound) and share ``1 - z_i``, giving ``E_S``;
2. *padding*: ``S_A >= lo_{j_A}`` and ``S_S >= lo_{j_S}``;
3. *outputs, once*: ``A`` and ``S`` are disjoint subsets of ``E_A | E_S`` and ``kv_SD >= kv_L``, so
   ``kv_L sum_A O + kv_SD sum_S O >= kv_L low(a + s, E_A | E_S) + (kv_SD - kv_L) low(s, E_S)``,
   ``low(n, E)`` being the sum of the ``n`` smallest outputs in ``E`` (none if ``|E| < n``); and
   also ``>= kv_L low(a, E_A) + kv_SD low(s, E_S)``.

So the plan's ``(cell, j_A, j_S, a, s)`` passes the memory test with these lower bounds in
place of the true terms. :func:`joint_upper_bound` tests ``n = a + s`` from a known upper bound
downwards and returns the first ``n`` some combination passes: no plan serves more. Only
``per_user`` KV memory is handled (``padded`` returns the bound it was given).
"""

from __future__ import annotations

import time

import numpy as np

from agents.mode_solver import ModeTable, build_table
from envs.cost_model import CostModel, sd_iterations
from envs.feasibility import EPS
from envs.plan import AD, SD
from envs.workload import Round


def _buckets(inputs: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per input bucket: the smallest and largest user input in it (tokens)."""
    values = np.unique(inputs)
    cuts = np.unique(np.quantile(np.arange(len(values)), np.linspace(0, 1, min(count, len(values)) + 1)[1:]).astype(int))
    hi = values[cuts]
    lo = values[np.concatenate([[0], cuts[:-1] + 1])]
    return lo, hi


def _smallest_sums(mask: np.ndarray, out_sorted: np.ndarray, n) -> np.ndarray:
    """Over the last axis of ``mask`` (users in ascending output order): the sum of the ``n``
    smallest outputs it holds, inf where it holds fewer than ``n`` (``n`` broadcasts)."""
    cnt = np.cumsum(mask, axis=-1, dtype=np.int32)
    n = np.asarray(n)
    take = mask & (cnt <= n[..., None])
    total = (take * out_sorted).sum(axis=-1, dtype=np.float64)
    return np.where(cnt[..., -1] >= n, total, np.inf)


def _caps(tab: ModeTable, shares: np.ndarray, lo: np.ndarray, hi: np.ndarray, mem: float) -> np.ndarray:
    """(cell, bucket): the most users a batch of this mode with its longest input in the bucket
    can hold at the cell's share and the whole KV budget ``mem`` (bytes): the row bounds of
    ``agents.mode_solver`` (users within the row's thresholds whose slack minus uplink covers
    ``C(b, row) / share``; the ``b`` smallest outputs fit the memory), maximised over the rows
    whose input threshold lies in the bucket (a batch's own maxima give such a row)."""
    everyone = np.ones(tab.elig.shape[1], dtype=bool)
    rows, _, n0, share_req, mem_req = tab.requirements(everyone)
    b_mem = (mem_req <= mem / tab.mem_unit * (1 + EPS)).sum(axis=1)
    bucket = np.searchsorted(hi, tab.s_thr[rows])  # s_thr is a user input, so lo <= s_thr <= hi of its bucket
    caps = np.zeros((len(shares), len(lo)), dtype=np.int64)
    for c, share in enumerate(shares):
        if share <= 0:
            continue
        size = np.minimum(np.minimum(n0, (share_req <= share * (1 + EPS)).sum(axis=1)), b_mem)
        np.maximum.at(caps[c], bucket, size)
    return caps


class JointBound:
    """Per-round tables of :func:`joint_upper_bound` (cells x buckets x sizes), then tests of ``n``."""

    def __init__(self, cost: CostModel, rnd: Round, gamma: int, z_step: float = 0.05, buckets: int = 12):
        if not 0 < z_step <= 1:
            raise ValueError(f"z_step must be in (0, 1], got {z_step}")
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, got {buckets}")
        self.k = k = rnd.num_users
        order = np.argsort(rnd.output_tokens, kind="stable")
        self.out = rnd.output_tokens[order].astype(np.float64)
        inp = rnd.input_tokens[order]
        budget = (rnd.slack_s - rnd.uplink_s)[order]
        iters = sd_iterations(rnd.output_tokens, rnd.alpha, gamma)[order]
        self.lo, self.hi = lo, hi = _buckets(rnd.input_tokens, buckets)
        nb = len(lo)
        b = np.arange(k + 1)[:, None, None]
        # (size, bucket, user) cost lower bounds at the bucket's smallest input
        c_ad = np.asarray(cost.ad_time(b, lo[None, :, None], rnd.output_tokens[order][None, None, :]), dtype=float)
        c_sd = np.asarray(cost.sd_time(b, lo[None, :, None], 0, iters[None, None, :], gamma), dtype=float)
        in_bucket = inp[None, :] <= hi[:, None]  # (bucket, user)
        n_cells = int(round(1.0 / z_step))
        z = np.linspace(0.0, 1.0, n_cells + 1)
        pos = budget > 0
        # E[cell, bucket, size, user]; size 0 holds nobody
        self.e_ad = (c_ad[None] <= z[1:, None, None, None] * budget * (1 + EPS)) & pos & in_bucket[None, None]
        self.e_sd = (c_sd[None] <= (1.0 - z[:-1])[:, None, None, None] * budget * (1 + EPS)) & pos & in_bucket[None, None]
        self.e_ad = self.e_ad.transpose(0, 2, 1, 3).copy()  # (cell, bucket, size, user)
        self.e_sd = self.e_sd.transpose(0, 2, 1, 3).copy()
        self.e_ad[:, :, 0] = False
        self.e_sd[:, :, 0] = False
        sizes = np.arange(k + 1)
        # one cell at a time keeps the cumulative counts small (K = 200: ~5 MB a cell)
        self.low_ad = np.stack([_smallest_sums(e, self.out, sizes[None, :]) for e in self.e_ad])
        self.low_sd = np.stack([_smallest_sums(e, self.out, sizes[None, :]) for e in self.e_sd])
        self.low_ad[:, :, 0] = self.low_sd[:, :, 0] = 0.0
        self.kv_l, self.kv_sd = float(cost.kv_l), float(cost.kv_sd)
        self.pad_ad = self.kv_l * sizes[None, :] * lo[:, None].astype(float)  # (bucket, size) bytes
        self.pad_sd = sizes[None, :] * (self.kv_sd * (lo[:, None] + gamma) + float(cost.sd_user_bytes))
        self.mem_sd_used = float(cost.memory_budget(True)) * (1 + EPS)
        self.mem_ad_only = float(cost.memory_budget(False)) * (1 + EPS)
        self.n_cells, self.n_buckets = n_cells, nb
        # per-mode size caps per (cell, bucket) from agents.mode_solver's threshold rows
        ad_tab = build_table(cost, rnd, AD, gamma)
        self.cap_ad_only = _caps(ad_tab, z[1:], lo, hi, self.mem_ad_only)
        self.cap_ad = _caps(ad_tab, z[1:], lo, hi, self.mem_sd_used)  # beside an SD batch: the smaller budget
        self.cap_sd = _caps(build_table(cost, rnd, SD, gamma, optimistic=True), 1.0 - z[:-1], lo, hi, self.mem_sd_used)

    def possible(self, n: int) -> bool:
        """Whether some ``(cell, j_A, j_S, a, s = n - a)`` passes the memory test (module docstring);
        False proves that no plan serves exactly ``n`` users."""
        if n <= 0:
            return True
        if n > self.k:
            return False
        a = np.arange(n + 1)
        s = n - a
        limit = np.where(s > 0, self.mem_sd_used, self.mem_ad_only)  # (n+1,)
        pad = self.pad_ad[:, None, a] + self.pad_sd[None, :, s]  # (jA, jS, n+1)
        for c in range(self.n_cells):
            sep = pad + self.kv_l * self.low_ad[c][:, None, a] + self.kv_sd * self.low_sd[c][None, :, s]
            cap_ad = np.where(s > 0, self.cap_ad[c][:, None], self.cap_ad_only[c][:, None])  # (jA, n+1)
            capped = (a[None, None, :] <= cap_ad[:, None, :]) & (s[None, None, :] <= self.cap_sd[c][None, :, None])
            ja, js, ai = np.nonzero(capped & np.isfinite(sep) & (sep <= limit[None, None, :]))
            if len(ai) == 0:
                continue
            union = self.e_ad[c, ja, a[ai]] | self.e_sd[c, js, s[ai]]
            low = _smallest_sums(union, self.out, n)
            mem = pad[ja, js, ai] + self.kv_l * low + (self.kv_sd - self.kv_l) * self.low_sd[c, js, s[ai]]
            if (np.isfinite(mem) & (mem <= limit[ai])).any():
                return True
        return False


def joint_upper_bound(cost: CostModel, rnd: Round, gamma: int, upper: int | None = None, incumbent: int = 0, z_step: float = 0.02, buckets: int = 24, time_limit_s: float = float("inf")) -> int:
    """Proven upper bound on the number served with draft depth ``gamma`` (module docstring).

    ``upper``: a bound already proven (default K); every ``n`` from it down to ``incumbent + 1`` is
    tested and the first ``n`` that :meth:`JointBound.possible` allows is returned (``incumbent``
    when none is: the incumbent is then optimal). When ``time_limit_s`` (seconds) runs out, the
    ``n`` not yet tested is returned: every larger one was refuted, so it is still a bound.
    Assumes monotone costs (the caller checks ``CostEnvelope.monotone``).
    """
    start = time.perf_counter()
    k = rnd.num_users
    upper = k if upper is None else min(int(upper), k)
    if cost.kv_memory != "per_user" or k == 0 or upper <= incumbent:
        return upper
    jb = JointBound(cost, rnd, gamma, z_step, buckets)
    for n in range(upper, incumbent, -1):
        if time.perf_counter() - start > time_limit_s or jb.possible(n):
            return n
    return incumbent
