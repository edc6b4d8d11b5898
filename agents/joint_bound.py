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

1. *who can be in the batches*: cut the outputs (AD) / SD iteration counts into buckets too. The
   batch ``A``'s longest output ``N_A`` lies in some output bucket ``m``; the *relaxed row*
   ``(j_A, m)`` admits every user with ``I_k <= L_{j_A}`` and ``O_k`` at most bucket ``m``'s top, and
   prices a batch of size ``b`` at ``C_A(b, lo_{j_A}, lo_m) <= C_A(b, S_A, N_A)``. ``A`` lies in that
   row, each member's budget ``slack_k - uplink_k >= beta_A >= C_A(a, S_A, N_A) / r_A`` covers the
   relaxed price at ``z_{i+1}``, and the row's ``a``-th largest eligible budget does too; so every
   member of ``A`` is in ``E_A(a)``, the users that some relaxed row of bucket ``j_A`` admits at a size
   ``>= a`` that the row holds (:func:`_reach`). SD alike, with rows over iterations, the
   optimistic cost ``C_S(s, lo_j, N = 0, lo_J)`` (context growth ignored: a lower bound) and
   share ``1 - z_i``, giving ``E_S(s)``; and each batch is at most the row bounds of
   ``agents.mode_solver`` allow for its bucket (:func:`_caps`);
2. *padding*: ``S_A >= lo_{j_A}`` and ``S_S >= lo_{j_S}``;
3. *outputs, once*: ``A`` and ``S`` are disjoint subsets of ``E_A | E_S``; with ``kv = min(kv_L,
   kv_SD)``, ``kv_L sum_A O + kv_SD sum_S O >= kv low(a + s, E_A | E_S) + (kv_L - kv) low(a, E_A) +
   (kv_SD - kv) low(s, E_S)``,
   ``low(n, E)`` being the sum of the ``n`` smallest outputs in ``E`` (none if ``|E| < n``); and
   also ``>= kv_L low(a, E_A) + kv_SD low(s, E_S)``.

4. *one row per batch*: ``E_A(a)`` is the union over the bucket's rows, but ``A`` lies in ONE
   row ``(j_A, l_A)`` -- the output bucket of its own ``N_A`` -- so every member is in
   ``E_A^{l_A}(a)``, the users that row alone admits at a size ``>= a`` (:func:`_reach`, per row),
   a subset of ``E_A(a)``; ``S`` alike in ``E_S^{l_S}(s)``. Step 3's inequalities with these sets in
   place of the unions hold for the plan's own ``(l_A, l_S)``. Why it matters: the union lets a
   short-output user with a tight deadline (admitted only by rows of small ``N``) share a batch
   with a long-output one (admitted only by rows of large ``N``); on K = 200 validation rounds this
   step took the bound from 96 to 94 and from 90 to 86 (BALANCE: 93 and 85). It runs only on the
   combinations step 3 passes (:meth:`JointBound._rows_pass`).

So the plan's ``(cell, j_A, l_A, j_S, l_S, a, s)`` passes the memory test with these lower bounds
in place of the true terms. :func:`joint_upper_bound` tests ``n = a + s`` from a known upper bound
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


def _reach(cost_rows: np.ndarray, elig: np.ndarray, budget: np.ndarray, shares: np.ndarray, per_row: bool = True) -> np.ndarray:
    """(cell, bucket, row, user): the largest batch size at which the user can still be in a batch
    of relaxed row ``(bucket, row)``, at the cell's share (0 or less: none); with ``per_row=False``
    the largest over the bucket's rows, (cell, bucket, user).

    ``cost_rows`` (J, L, K + 1): a lower bound on the cost (s) of any batch of size ``b`` whose
    maxima fall in relaxed row ``(j, l)``; ``elig`` (J, L, K): the users such a batch may hold. A
    row *holds* ``b`` at share ``z`` if its ``b``-th largest eligible budget covers ``cost(b) / z``
    (a real batch of size ``b`` in the row is ``b`` such users); user ``k`` fits size ``b`` if its
    own budget covers it. So every member of a real batch of size ``a`` in row ``(j, l)`` has
    ``min(largest b held, largest b k fits) >= a``.
    """
    n_rows_j, n_rows_l, k = elig.shape
    perm = np.argsort(-budget, kind="stable")
    el_p = elig[..., perm]
    rank = np.cumsum(el_p, axis=-1)
    bud_p = budget[perm]
    with np.errstate(divide="ignore", invalid="ignore"):
        share_req = np.where(el_p & (bud_p > 0), np.take_along_axis(cost_rows, rank, axis=-1) / np.where(bud_p > 0, bud_p, 1.0), np.inf)
    held = np.zeros((len(shares), n_rows_j, n_rows_l), dtype=np.int32)  # (cell, J, L) largest b held
    for c, share in enumerate(shares):
        if share > 0:
            held[c] = ((share_req <= share * (1 + EPS)) * rank).max(axis=-1)
    # the cheapest cost at b or any larger size: "some b' >= b costs at most x" is monotone in b,
    # so the largest b a budget covers is one sorted search per row
    cmin = np.minimum.accumulate(cost_rows[..., ::-1], axis=-1)[..., ::-1]
    covered = shares[:, None] * np.maximum(budget, 0.0)[None, :] * (1 + 1e-6) + 1e-12  # (cell, user) seconds
    usable = elig & (budget > 0)
    out = np.zeros((len(shares), n_rows_j, n_rows_l, k) if per_row else (len(shares), n_rows_j, k), dtype=np.int32)
    # a cell with no share holds nothing (held 0), so its reach is <= 0 without a test of its own
    for j in range(n_rows_j):
        for row in range(n_rows_l):
            fits = np.searchsorted(cmin[j, row], covered, side="right") - 1  # (cell, user)
            r = np.where(usable[j, row][None, :], np.minimum(held[:, j, row, None], fits), 0)
            if per_row:
                out[:, j, row] = r
            else:
                np.maximum(out[:, j], r, out=out[:, j])
    return out


class JointBound:
    """Per-round tables of :func:`joint_upper_bound` (cells x buckets x sizes), then tests of ``n``."""

    def __init__(self, cost: CostModel, rnd: Round, gamma: int, z_step: float = 0.02, buckets: int = 24, levels: int = 48, row_levels: int = 16):
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
        if levels < 1:
            raise ValueError(f"levels must be >= 1, got {levels}")
        if row_levels < 0:
            raise ValueError(f"row_levels must be >= 0 (0: no per-row step), got {row_levels}")
        nb = len(lo)
        n_cells = int(round(1.0 / z_step))
        z = np.linspace(0.0, 1.0, n_cells + 1)
        b = np.arange(k + 1)
        out_u = rnd.output_tokens[order]
        # relaxed rows (input bucket j, second-threshold bucket m): AD's second threshold is the
        # longest output, SD's the most iterations; costs at both buckets' smallest values. The
        # union filter of step 3 uses ``levels`` rows, step 4 ``row_levels`` (coarser: it pairs rows)
        in_bucket = inp[None, :] <= hi[:, None]  # (bucket, user)

        def relaxed(n_levels: int, per_row: bool) -> tuple[np.ndarray, np.ndarray]:
            o_lo, o_hi = _buckets(out_u, n_levels)
            j_lo, j_hi = _buckets(iters, n_levels)
            c_ad = np.asarray(cost.ad_time(b[None, None, :], lo[:, None, None], o_lo[None, :, None]), dtype=float)
            c_sd = np.asarray(cost.sd_time(b[None, None, :], lo[:, None, None], 0, j_lo[None, :, None], gamma), dtype=float)
            el_ad = in_bucket[:, None, :] & (out_u[None, None, :] <= o_hi[None, :, None])
            el_sd = in_bucket[:, None, :] & (iters[None, None, :] <= j_hi[None, :, None])
            return _reach(c_ad, el_ad, budget, z[1:], per_row), _reach(c_sd, el_sd, budget, 1.0 - z[:-1], per_row)

        reach_ad, reach_sd = relaxed(levels, per_row=False)  # (cell, bucket, user): any row
        self.rows_ad, self.rows_sd = relaxed(row_levels, per_row=True) if row_levels > 0 else (None, None)  # (cell, bucket, row, user)
        # E[cell, bucket, size, user]; size 0 holds nobody
        self.e_ad = reach_ad[:, :, None, :] >= np.maximum(b, 1)[None, None, :, None]
        self.e_sd = reach_sd[:, :, None, :] >= np.maximum(b, 1)[None, None, :, None]
        self.e_ad[:, :, 0] = False
        self.e_sd[:, :, 0] = False
        sizes = np.arange(k + 1)
        # one cell at a time keeps the cumulative counts small (K = 200: ~5 MB a cell)
        self.low_ad = np.stack([_smallest_sums(e, self.out, sizes[None, :]) for e in self.e_ad])
        self.low_sd = np.stack([_smallest_sums(e, self.out, sizes[None, :]) for e in self.e_sd])
        self.low_ad[:, :, 0] = self.low_sd[:, :, 0] = 0.0
        self.kv_l, self.kv_sd = float(cost.kv_l), float(cost.kv_sd)
        self.kv = min(self.kv_l, self.kv_sd)  #: every served user's outputs cost at least this per token (bytes)
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

    def possible(self, n: int, deadline: float = float("inf")) -> bool:
        """Whether some ``(cell, j_A, l_A, j_S, l_S, a, s = n - a)`` passes the memory test (module
        docstring); False proves that no plan serves exactly ``n`` users. Past ``deadline``
        (``time.perf_counter()`` seconds) nothing more is refuted: True."""
        if n <= 0:
            return True
        if n > self.k:
            return False
        a = np.arange(n + 1)
        s = n - a
        limit = np.where(s > 0, self.mem_sd_used, self.mem_ad_only)  # (n+1,)
        pad = self.pad_ad[:, None, a] + self.pad_sd[None, :, s]  # (jA, jS, n+1)
        kv = self.kv
        for c in range(self.n_cells):
            # step 3 with each batch's members drawn from the union of its bucket's rows: a cheap filter
            sep = pad + self.kv_l * self.low_ad[c][:, None, a] + self.kv_sd * self.low_sd[c][None, :, s]
            cap_ad = np.where(s > 0, self.cap_ad[c][:, None], self.cap_ad_only[c][:, None])  # (jA, n+1)
            capped = (a[None, None, :] <= cap_ad[:, None, :]) & (s[None, None, :] <= self.cap_sd[c][None, :, None])
            ja, js, ai = np.nonzero(capped & np.isfinite(sep) & (sep <= limit[None, None, :]))
            if len(ai) == 0:
                continue
            union = self.e_ad[c, ja, a[ai]] | self.e_sd[c, js, s[ai]]
            low = _smallest_sums(union, self.out, n)
            pad_c = pad[ja, js, ai]
            mem = pad_c + kv * low + (self.kv_l - kv) * self.low_ad[c, ja, a[ai]] + (self.kv_sd - kv) * self.low_sd[c, js, s[ai]]
            survivors = np.flatnonzero(np.isfinite(mem) & (mem <= limit[ai]))
            if len(survivors) and (self.rows_ad is None or self._rows_pass(c, ja[survivors], js[survivors], a[ai[survivors]], n, pad_c[survivors], limit[ai[survivors]], deadline)):
                return True
        return False

    def _rows_pass(self, c: int, ja: np.ndarray, js: np.ndarray, a: np.ndarray, n: int, pad: np.ndarray, limit: np.ndarray, deadline: float) -> bool:
        """Step 4 for the candidates ``(cell c, ja[t], js[t], a[t], n - a[t])`` that passed the
        filter: whether one passes with its AD batch in a single row ``l_A`` of bucket ``ja[t]`` and
        its SD batch in a single row ``l_S`` of ``js[t]`` (``pad``, ``limit``: bytes per candidate)."""
        s = n - a
        n_la, n_ls = self.rows_ad.shape[2], self.rows_sd.shape[2]
        chunk = max(1, 4_000_000 // (n_la * n_ls * self.k))
        kv = self.kv
        for lo in range(0, len(a), chunk):
            if time.perf_counter() > deadline:
                return True  # out of time: nothing refuted
            t = slice(lo, lo + chunk)
            aa, ss = a[t], s[t]
            # (T, L, K): users each row admits at the candidate's size; an empty batch admits nobody
            e_a = (self.rows_ad[c, ja[t]] >= np.maximum(aa, 1)[:, None, None]) & (aa > 0)[:, None, None]
            e_s = (self.rows_sd[c, js[t]] >= np.maximum(ss, 1)[:, None, None]) & (ss > 0)[:, None, None]
            # (T, L): each row's least output sum; inf where the row holds too few users (an empty batch: 0)
            low_a = np.where((aa > 0)[:, None], _smallest_sums(e_a, self.out, aa[:, None]), 0.0)
            low_s = np.where((ss > 0)[:, None], _smallest_sums(e_s, self.out, ss[:, None]), 0.0)
            low_u = _smallest_sums(e_a[:, :, None, :] | e_s[:, None, :, :], self.out, np.full((len(aa), 1, 1), n))  # (T, LA, LS)
            with np.errstate(invalid="ignore"):  # 0 x inf where kv_L or kv_SD is the smaller: the row is out anyway
                own = np.where(np.isfinite(low_a), (self.kv_l - kv) * low_a, np.inf)[:, :, None] + np.where(np.isfinite(low_s), (self.kv_sd - kv) * low_s, np.inf)[:, None, :]
            mem = pad[t, None, None] + kv * low_u + own
            if (np.isfinite(mem) & (mem <= limit[t, None, None])).any():
                return True
        return False


def joint_upper_bound(cost: CostModel, rnd: Round, gamma: int, upper: int | None = None, incumbent: int = 0, z_step: float = 0.025, buckets: int = 40, levels: int = 80, time_limit_s: float = float("inf"), row_levels: int = 16) -> int:
    """Proven upper bound on the number served with draft depth ``gamma`` (module docstring).

    ``upper``: a bound already proven (default K); every ``n`` from it down to ``incumbent + 1`` is
    tested and the first ``n`` that :meth:`JointBound.possible` allows is returned (``incumbent``
    when none is: the incumbent is then optimal). When ``time_limit_s`` (seconds, counted from the
    end of the table building) runs out, the ``n`` not yet tested is returned: every larger one
    was refuted, so it is still a bound.
    ``row_levels``: the rows per bucket of step 4 (0 skips it).
    Assumes monotone costs (the caller checks ``CostEnvelope.monotone``).
    """
    k = rnd.num_users
    upper = k if upper is None else min(int(upper), k)
    if cost.kv_memory != "per_user" or k == 0 or upper <= incumbent:
        return upper
    jb = JointBound(cost, rnd, gamma, z_step, buckets, levels, row_levels)
    start = time.perf_counter()  # the tables are built whatever the limit; the tests are cheap
    deadline = start + time_limit_s
    for n in range(upper, incumbent, -1):
        if time.perf_counter() > deadline or jb.possible(n, deadline):
            return n
    return incumbent
