"""The post-step's mixed re-pack: an AD batch and an SD batch, both rebuilt from scratch (issue 15 §1).

``agents.plan_repair.improve`` re-packs ONE batch around the policy's own thresholds, and its best
plans at K = 200 are all-AD. BALANCE wins the remaining validation rounds with *mixed* plans, and
those have a simple shape:

* **AD**: the first ``m_A`` users, in ascending predicted output, among those with input
  ``<= S_A`` and slack ``>= f_A`` (short prompts, the tight slacks AD can still meet);
* **SD**: as many as fit, in ascending output, of the others with slack ``>= f_S``, SD
  iterations ``<= J_S`` and (``sd_input_cap=True``) input ``<= S_S`` (slack to spare, few iterations).

With the SD input cap, the family at BALANCE's own thresholds rebuilds BALANCE's plan -- the same AD
and SD users -- on every round where BALANCE mixes, among 200 validation rounds at K = 200
(``experiments.mixed_plan_study``); without it, on some of them only. Finding those thresholds is
the hard part: the plan's count peaks on a narrow ridge in all six at once (the same study).

:func:`mixed_repack` searches the five-parameter family ``(S_A, f_A, m_A, f_S, J_S)`` (or the six with ``S_S``): a small grid
of quantiles of the round's inputs, slacks and SD iterations (``m_A`` as shares of K), then
coordinate line searches -- every distinct value within ``window`` positions of the best point, one
parameter at a time, all lines priced in one vectorised call per pass. ``m_A`` is clipped to
the longest AD prefix that fits on its own (with the SLM's weights loaded); the SD batch is priced
beside the AD batch's exact share and KV (``agents.prefix_fill.longest_prefixes``), so every point's
score is its plan's, and the caller checks the winner with the exact check.

The ``improve_mixed6_all_pairs`` post-step searches the six-parameter family with up to
``SIX_PASSES`` passes: on BALANCE's mixed validation rounds one pass stops on the ridge a few users
short, and a few more passes climb it (``experiments.mixed_plan_study``, "Six-parameter variants").
The passes cost most of the search, so they run only when the start grid's best plan comes within
``SIX_SEARCH_MARGIN`` users of the best plan the post-step has found so far (``search_from``).

Cost: O(K) numpy per grid point, in a handful of calls; the search is local (the family's optimum
is not guaranteed), and it is only ever used to *add* a plan the caller compares with its own.
"""

from __future__ import annotations

import numpy as np

from agents.prefix_fill import TIE_WEIGHT, longest_prefixes
from envs.cost_model import CostModel, sd_iterations
from envs.feasibility import EPS, share_needed
from envs.plan import AD, SD
from envs.workload import Round

#: the start grid: quantiles of the round's inputs (S_A), slacks (f_A, f_S) and SD iterations (J_S),
#: and m_A as shares of K. With WINDOW and PASSES, the cheapest setting that served as many users on
#: the 40 validation rounds at K = 200 as the larger grids, windows and pass counts tried beside it
#: (two values per threshold, 5 or 9 counts; windows 4-12; 1-2 passes); a 3-count grid served fewer
AD_INPUT_QUANTILES = (0.5, 0.6)
AD_SLACK_QUANTILES = (0.25, 0.35)
AD_COUNT_SHARES = (0.15, 0.21, 0.27, 0.33, 0.39)
SD_SLACK_QUANTILES = (0.5, 0.6)
SD_ITERATION_QUANTILES = (0.8, 0.9)
#: the SD batch's input cap S_S (``sd_input_cap=True`` only): BALANCE's per-mode solver caps SD inputs
#: too, and with the cap the family rebuilds BALANCE's own mixed plans exactly (``experiments.mixed_plan_study``)
SD_INPUT_QUANTILES = (0.9, 1.0)
WINDOW = 6  #: line searches cover the distinct values this many positions either side of the point
PASSES = 1  #: rounds of line searches (stops early when a pass finds nothing better)
#: the six-parameter search of the ``improve_mixed6_all_pairs`` post-step (``agents.plan_repair``):
#: line searches SIX_WINDOW values either side, up to SIX_PASSES passes (each stops early when it
#: moves nothing), and only on rounds whose start grid serves at least the best plan found so far less
#: SIX_SEARCH_MARGIN users. Chosen on the 200 validation rounds at K = 200 (``python -m
#: experiments.mixed_plan_study``, "Six-parameter variants"): one pass served fewer (it stops on the
#: ridge); 6 passes served as many as 10-40 on the rounds BALANCE mixes; windows 6 and 8 and margins
#: 2-4 served the same at depth 2 (3 kept: one user more room for rounds whose grid starts further
#: behind, at ~1 ms more median CPU). It replaces the five-parameter search, and a local search from
#: another start can end lower: against ``improve_mixed_all_pairs`` it serves more on 10 of those
#: rounds and one user fewer on one (round 32: 91 vs 92; BALANCE 91)
SIX_WINDOW = 6
SIX_PASSES = 6
SIX_SEARCH_MARGIN = 3
#: the SD batch's draft depth in the ``improve_mixed`` post-step (``agents.plan_repair.improve_plan``):
#: one fixed depth (the policy's own is often 1 at K = 200, where SD pays little), chosen on the
#: validation rounds (``results/improve_tuning.md``, rows ``mixed1`` .. ``mixed4``)
MIXED_DEPTH = 2


class MixedFamily:
    """One round's users in ascending output (ties: input) and the scores of parameter rows."""

    def __init__(self, cost: CostModel, rnd: Round, gamma: int, sd_input_cap: bool = False):
        self.cost, self.rnd, self.gamma, self.sd_input_cap = cost, rnd, gamma, sd_input_cap
        self.order = order = np.lexsort((rnd.input_tokens, rnd.output_tokens))
        self.inp, self.out = rnd.input_tokens[order], rnd.output_tokens[order]
        self.up, self.slack = rnd.uplink_s[order], rnd.slack_s[order]
        self.iters = sd_iterations(self.out, rnd.alpha[order], gamma)
        self.budget = cost.memory_budget1(True) * (1 + EPS)  # both batches: the SLM's weights are loaded
        #: the distinct values each parameter's line search moves over
        self.values = (np.unique(self.inp), np.unique(self.slack), np.arange(0, rnd.num_users + 1), np.unique(self.slack), np.unique(self.iters))
        if sd_input_cap:  # a sixth parameter, S_S
            self.values += (np.unique(self.inp),)

    def _ad(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: the AD batch (bool (C, K) in sorted order), its least share and its KV bytes.

        Every AD prefix of each distinct (S_A, f_A) pair is priced at once (running aggregates along
        its eligible users, one cost-model call over all prefix lengths); ``m_A`` is then clipped to
        the longest prefix that fits alone and its share and KV are read off."""
        index: dict[tuple[float, float], int] = {}  # the distinct pairs in first-seen order (a dict: np.unique(axis=0) costs more here)
        inverse = np.fromiter((index.setdefault(p, len(index)) for p in map(tuple, params[:, :2].tolist())), dtype=np.int64, count=len(params))
        pairs = np.array(list(index), dtype=float).reshape(-1, 2)
        el = (self.inp <= pairs[:, :1]) & (self.slack >= pairs[:, 1:2])  # (U, K)
        b = np.cumsum(el, axis=1)
        s = np.maximum.accumulate(np.where(el, self.inp, 0), axis=1)
        n = np.maximum.accumulate(np.where(el, self.out, 0), axis=1)
        u = np.maximum.accumulate(np.where(el, self.up, 0.0), axis=1)
        sl = np.minimum.accumulate(np.where(el, self.slack, np.inf), axis=1)
        so = np.cumsum(np.where(el, self.out, 0), axis=1)
        share = share_needed(self.cost.ad_time(b, s, n), b, u, sl)
        mem = self.cost.ad_memory(b, s, n, so)
        # fitting is downward closed along a pair's prefixes: the fitting columns are a leading run
        fits = (share <= 1 + EPS) & (mem <= self.budget)
        fit = np.where(fits.all(axis=1), b[:, -1], np.take_along_axis(b, np.argmin(fits, axis=1)[:, None], axis=1)[:, 0] - 1)
        count = np.minimum(params[:, 2].astype(np.int64), fit[inverse])
        # the column where each row's AD batch reaches ``count`` users (its last member): its aggregates
        b_rows = b[inverse]  # the pairs' running counts, one row per parameter row
        col = np.argmax(b_rows >= np.maximum(count, 1)[:, None], axis=1)
        take = el[inverse] & (b_rows <= count[:, None])
        empty = count <= 0
        return take, np.where(empty, 0.0, share[inverse, col]), np.where(empty, 0.0, mem[inverse, col])

    def _sd_eligible(self, params: np.ndarray, take: np.ndarray) -> np.ndarray:
        eligible = ~take & (self.slack >= params[:, 3:4]) & (self.iters <= params[:, 4:5])
        return eligible & (self.inp <= params[:, 5:6]) if params.shape[1] > 5 else eligible

    def score(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row: users served by its plan less ``TIE_WEIGHT`` x its fullness (-1 if its AD batch
        does not fit), and how many SD users it takes."""
        take, share, mem = self._ad(params)  # an AD batch always fits alone (m_A is clipped): ok guards the empty round
        ok = (share <= 1 + EPS) & (mem <= self.budget)
        other = (np.where(ok, share, 0.0), np.where(ok, mem, 0.0))
        count, used = longest_prefixes(self.cost, self.rnd, self.order, self._sd_eligible(params, take), SD, self.gamma, other, True)
        return np.where(ok, take.sum(axis=1) + count - TIE_WEIGHT * np.minimum(used, 1.0), -1.0), count

    def modes(self, point: np.ndarray, sd_count: int) -> np.ndarray:
        """The plan of one parameter row (``sd_count`` from :meth:`score`): modes (K,) int8 in the round's user order."""
        params = point[None, :]
        take, _, _ = self._ad(params)
        modes = np.zeros(self.rnd.num_users, dtype=np.int8)
        modes[self.order[take[0]]] = AD
        modes[self.order[self._sd_eligible(params, take)[0]][:sd_count]] = SD
        return modes

    def start_grid(self) -> np.ndarray:
        k = self.rnd.num_users
        axes = (np.quantile(self.inp, AD_INPUT_QUANTILES), np.quantile(self.slack, AD_SLACK_QUANTILES), np.round(np.asarray(AD_COUNT_SHARES) * k),
                np.quantile(self.slack, SD_SLACK_QUANTILES), np.quantile(self.iters, SD_ITERATION_QUANTILES))
        if self.sd_input_cap:
            axes += (np.quantile(self.inp, SD_INPUT_QUANTILES),)
        return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, len(axes)).astype(float)


def mixed_repack(cost: CostModel, rnd: Round, gamma: int, window: int = WINDOW, passes: int = PASSES,
                 sd_input_cap: bool = False, search_from: int | None = None) -> tuple[np.ndarray, float]:
    """``(modes, key)``: the best plan of the mixed family found (SD at draft depth ``gamma``), and its
    key (users served less ``TIE_WEIGHT`` x fullness; ``ceil(key)`` users). The plan fits by the
    formulas the exact check uses; the caller should still check it (``envs.feasibility.check_plans``).
    ``sd_input_cap``: the six-parameter family (an input cap on the SD batch too, ``SD_INPUT_QUANTILES``);
    ``search_from``: the line searches run only when the start grid's best plan serves at least this
    many users (None: always) -- the grid's best is then returned as it is."""
    if rnd.num_users == 0:
        return np.zeros(0, dtype=np.int8), 0.0
    fam = MixedFamily(cost, rnd, gamma, sd_input_cap)
    grid = fam.start_grid()
    keys, counts = fam.score(grid)
    i = int(np.argmax(keys))
    key, point, sd_count = float(keys[i]), grid[i].copy(), int(counts[i])
    # points scored before score <= key (a move needs a strictly higher key), and a repeat within a
    # pass scores as its first: each pass scores only the points not seen yet, in their order
    seen = set(map(tuple, grid.tolist()))
    if search_from is not None and np.ceil(key) < search_from:
        passes = 0
    for _ in range(passes):
        rows = []
        for d, values in enumerate(fam.values):
            j = int(np.searchsorted(values, point[d]))
            line = values[max(0, j - window) : j + window + 1]
            r = np.repeat(point[None, :], len(line), axis=0)
            r[:, d] = line
            rows.append(r)
        cand = np.concatenate(rows)
        fresh = []
        for r, t in enumerate(map(tuple, cand.tolist())):
            if t not in seen:
                seen.add(t)
                fresh.append(r)
        if not fresh:
            break
        cand = cand[fresh]
        keys, counts = fam.score(cand)
        i = int(np.argmax(keys))
        if keys[i] <= key:
            break
        key, point, sd_count = float(keys[i]), cand[i].copy(), int(counts[i])
    if key < 0:
        return np.zeros(rnd.num_users, dtype=np.int8), 0.0
    return fam.modes(point, sd_count), key
