"""Turn any assignment into a feasible plan nearby: drop users until it fits, then add greedily.

Used on the MILP relaxation's plans (which may overrun the compute budget) to find incumbents.
Every step is decided with the exact check (``envs.feasibility.check_plans``, many candidate
plans at once), so the result is always feasible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from agents.ad_prefix_search import best_ad_prefix
from agents.mixed_repack import MIXED_DEPTH, SIX_PASSES, SIX_SEARCH_MARGIN, SIX_WINDOW, mixed_repack
from agents.prefix_fill import TIE_WEIGHT, longest_prefixes
from envs.cost_model import CostModel, sd_iterations
from envs.feasibility import check_plans, share_needed, shares_for
from envs.plan import AD, SD, Plan
from envs.workload import Round

if TYPE_CHECKING:
    from envs.feasibility import FeasibilityReport


def _excess(rep) -> np.ndarray:
    """How far candidate plans are from fitting: compute share over 1 plus relative memory over."""
    share = np.nan_to_num(rep.ad_share_min + rep.sd_share_min, posinf=1e9)
    budget = np.maximum(rep.memory_budget_bytes, 1.0)
    mem = (rep.ad_memory_bytes + rep.sd_memory_bytes) / budget
    return np.maximum(share - 1.0, 0.0) + np.maximum(mem - 1.0, 0.0)


def repair(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: int) -> np.ndarray:
    """A feasible plan obtained from ``modes`` by removals, then greedy additions (modes array)."""
    modes = np.asarray(modes, dtype=np.int8).copy()
    while modes.any() and not check_plans(cost, rnd, modes, gamma).feasible:
        members = np.flatnonzero(modes)
        cand = np.repeat(modes[None, :], len(members), axis=0)
        cand[np.arange(len(members)), members] = 0
        rep = check_plans(cost, rnd, cand, gamma)
        # drop the user whose removal brings the plan closest to fitting
        modes = cand[int(np.argmin(np.where(rep.feasible, -1.0, _excess(rep))))]
    while True:
        free = np.flatnonzero(modes == 0)
        if len(free) == 0:
            break
        cand = np.repeat(modes[None, :], 2 * len(free), axis=0)
        rows = np.arange(2 * len(free))
        cand[rows, np.tile(free, 2)] = np.repeat(np.array([AD, SD], dtype=np.int8), len(free))
        rep = check_plans(cost, rnd, cand, gamma)
        if not rep.feasible.any():
            break
        # add the user that leaves the most compute share free
        used = np.where(rep.feasible, rep.ad_share_min + rep.sd_share_min, np.inf)
        modes = cand[int(np.argmin(used))]
    return modes


# --- a cheap exact post-step for any scheduler's plan (issue 15 §1) ----------------------------
#
# ``repair`` above prices every candidate with ``check_plans`` (O(K) plans of K users per step):
# fine for a MILP incumbent, far too slow to follow a policy that decides a K = 200 round in ~10 ms.
# ``improve`` scores its candidates with the feasibility formulas vectorised over the prefixes of
# one sorted list (O(K) numpy per candidate) and checks only the winner with the exact check, so
# every plan it returns is feasible.

S_VARIANTS = 4  #: padding caps tried per batch from its own largest distinct inputs
#: padding caps (quantiles of the round's inputs) and slack floors (of its slacks) tried besides the
#: batch's own; chosen with the refinement on 20 validation rounds at K = 200 under the speed target
#: (CPU per round, loaded host): 8 x 8 and two passes 0.9984x BALANCE at 2.7 ms; 11 x 11 and one
#: pass 0.9978x at 2.9 ms; 6 x 6 and one pass 0.9967x at 1.9 ms
INPUT_QUANTILES = tuple(np.linspace(0.5, 1.0, 8).tolist())
SLACK_QUANTILES = tuple(np.linspace(0.0, 0.5, 8).tolist())
REFINE_STARTS = 1  #: grid points refined (the best first)
REFINE_PASSES = 2  #: rounds of line searches (the cap line and the floor line at once) around the best grid point
REFINE_WINDOW = 0.2  #: the line searches cover the caps / floors of this share of the users around the point
#: and every (cap, floor) pair among the REFINE_CROSS users either side of the point (a square, not
#: just its two lines: the best plan often moves both at once). Chosen on 40 validation rounds at
#: K = 200 (the shipped policy's raw plans; ``python -m experiments.improve_tuning``): without it
#: 0.9978x BALANCE at 2.9 ms per round; 8 -> 0.9992x; 12 -> 0.9995x at 5.5 ms, as good as every
#: (cap, floor) pair on those rounds (the rounds still short need SD users)
REFINE_CROSS = 12
#: the refinement square of the ``improve_mixed`` post-step (the mixed re-pack beside it). Chosen on 40
#: validation rounds at K = 100 and 200 with the shipped policy (``python -m experiments.improve_tuning
#: ... --mixed-crosses 0,8``): at K = 200 the mixed re-pack at depth 2 with square 8 serves as many as
#: with 12 (1.000x BALANCE, 2 rounds below and 2 above; the AD-only re-pack at 12: 0.9992x, 3 below)
#: and is the cheaper of the two (the whole decision, CPU, in ``results/improve_tuning.md``: 106x
#: faster than BALANCE vs 99.8x, on a loaded host); square 0 serves fewer (0.9986x, 7 below); at
#: K = 100 every variant serves the same
MIXED_REFINE_CROSS = 8
# ``improve_mixed_all_pairs`` is ``improve_mixed`` (square ``MIXED_REFINE_CROSS``) plus the AD-only
# re-pack over every pair, taken only when it serves more: it never serves fewer than ``improve_mixed``
# on any round. On the 40 validation rounds at K = 200 with the shipped policy (``python -m
# experiments.improve_tuning ... --all-pairs-crosses 0,4,8``) squares 0, 4 and 8 beside the all-pairs
# search all serve 1.0003x BALANCE (1 round below, 2 above; ``improve_mixed``: 1.000x, 2 below) and 0
# is ~3 ms cheaper (the whole decision 114x faster than BALANCE vs 105x with 8 in the published table's
# run; 125x vs 116x, and 108x vs 99x, in earlier runs on this host), but a smaller square can serve fewer than
# ``improve_mixed`` where a one-batch re-pack needs it (a K = 80 round of ``tests/test_general.py``),
# so the square stays ``MIXED_REFINE_CROSS`` and the dominance holds.

#: on rounds larger than this the ``improve_mixed_all_pairs`` post-step runs as ``improve_mixed``: the
#: search over every pair grows towards K^3 (``agents.ad_prefix_search``, "Cost"); had it run at
#: K = 500 it would have taken 24-35 ms a validation round on this host, a third of the 0.1 s a K = 500
#: decision is allowed, and no reported figure needs it there (BALANCE is timed, not compared, at 500)
ALL_PAIRS_MAX_USERS = 300


class PostStepOptions(NamedTuple):
    """What a named post-step runs: :func:`improve_plan`'s keyword arguments."""

    mixed: bool
    all_pairs_ad: bool
    mixed_six: bool


#: the post-steps a policy may name (policy.json "post_step"), oldest first; ``improve_mixed6_all_pairs``
#: is ``improve_mixed_all_pairs`` with the six-parameter mixed re-pack in place of the five-parameter one
POST_STEP_OPTIONS = {
    "improve": PostStepOptions(False, False, False),
    "improve_mixed": PostStepOptions(True, False, False),
    "improve_mixed_all_pairs": PostStepOptions(True, True, False),
    "improve_mixed6_all_pairs": PostStepOptions(True, True, True),
}


def _window(sorted_values: np.ndarray, at: float, half: int) -> np.ndarray:
    """The distinct values among the ``half`` sorted values either side of ``at``."""
    i = int(np.searchsorted(sorted_values, at))
    return np.unique(sorted_values[max(0, i - half) : i + half + 1])


def _batch_use(cost: CostModel, rnd: Round, members: np.ndarray, mode: int, gamma: int) -> tuple[float, float]:
    """(minimal compute share, KV bytes) of the batch of ``members`` in ``mode`` (0, 0 if empty)."""
    if len(members) == 0:
        return 0.0, 0.0
    b, s, n = len(members), int(rnd.input_tokens[members].max()), int(rnd.output_tokens[members].max())
    u, sl, so = float(rnd.uplink_s[members].max()), float(rnd.slack_s[members].min()), int(rnd.output_tokens[members].sum())
    if mode == AD:
        return float(share_needed(cost.ad_time(b, s, n), b, u, sl)), float(cost.ad_memory(b, s, n, so))
    j = int(sd_iterations(rnd.output_tokens[members], rnd.alpha[members], gamma).max())
    return float(share_needed(cost.sd_time(b, s, n, j, gamma), b, u, sl)), float(cost.sd_memory(b, s, n, so, gamma))


def _if_more(cost: CostModel, rnd: Round, modes: np.ndarray, served: int, most: int, gamma: int):
    """``(modes, report, gamma)`` when the candidate ``modes`` serves more than ``most`` users (``served``,
    its own count or its key's) and passes the exact check at draft depth ``gamma``; else None."""
    if served <= most:
        return None
    rep = check_plans(cost, rnd, modes[None], gamma)
    return (modes, rep, gamma) if rep.feasible[0] else None


def six_mixed_plan(cost: CostModel, rnd: Round, gamma: int, most: int, window: int = SIX_WINDOW, passes: int = SIX_PASSES,
                   margin: int | None = SIX_SEARCH_MARGIN) -> tuple[np.ndarray, FeasibilityReport, int] | None:
    """The ``improve_mixed6_all_pairs`` post-step's last stage after plans serving ``most`` users: the
    six-parameter mixed re-pack (SD at ``gamma``), its line searches run only when its start grid
    serves at least ``most - margin`` (None: always). ``(modes, report, gamma)`` when its plan serves
    more than ``most`` and passes the exact check, else None."""
    two, key = mixed_repack(cost, rnd, gamma, window=window, passes=passes, sd_input_cap=True,
                            search_from=None if margin is None else most - margin)
    return _if_more(cost, rnd, two, int(np.ceil(key)), most, gamma)


def improve(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: int, max_gamma: int, cross: int = REFINE_CROSS,
            mixed_depth: int | None = None, passes: int = REFINE_PASSES, all_pairs_ad: bool = False, mixed_six: bool = False) -> np.ndarray:
    """A feasible plan serving at least as many users as the feasible plan ``modes`` (SD at ``gamma``):
    :func:`_improve`'s modes (``cross``: the refinement's square, ``REFINE_CROSS``; 0 = lines only;
    ``mixed_depth``: also the mixed re-pack, SD at that depth; ``passes``: refinement passes;
    ``all_pairs_ad``: besides, the AD-only re-pack over every (cap, floor) pair; ``mixed_six``: the
    mixed re-pack in its six-parameter family with gated line searches, run last)."""
    return _improve(cost, rnd, modes, gamma, max_gamma, cross, mixed_depth, passes, all_pairs_ad, mixed_six)[0]


def _improve(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: int, max_gamma: int, cross: int = REFINE_CROSS,
             mixed_depth: int | None = None, passes: int = REFINE_PASSES, all_pairs_ad: bool = False, mixed_six: bool = False):
    """``(modes, report, depth)``: a feasible plan serving at least as many users as the feasible plan
    ``modes`` (SD at ``gamma``), its exact check (None when ``modes`` is returned unchanged), and the
    SD depth that check used (``gamma`` clipped to ``1..max_gamma``, or the mixed re-pack's; None when unchanged).

    **Re-pack**: one batch (AD or SD) is emptied -- the other kept -- and refilled, in ascending
    predicted output, with the users inside a cap on input (the padding) and a floor on slack (the
    batch's budget), as many as fit (uplinks are priced exactly, as every prefix's slowest). The caps
    are the batch's ``S_VARIANTS`` largest inputs and ``INPUT_QUANTILES`` of the round's; the floors
    the batch's least slack and ``SLACK_QUANTILES`` of the round's. With the batch's own cap and
    floor its users are all eligible, and -- when uplinks do not bind -- any ``m`` eligible users
    with the smallest outputs need no more memory, padding or time than ``m`` of its own; the result
    is in any case never worse than ``modes``, which wins ties. **AD only** is the same over every
    admitted user with AD alone (no SLM weights: what wins when memory binds). The best grid point
    (most users; among those the emptier plan, ``TIE_WEIGHT``) is refined by line searches over
    every distinct cap and floor within ``REFINE_WINDOW`` of it, and the winner is returned after
    one exact check (``envs.feasibility.check_plans``) if it serves more than ``modes``. This is
    BALANCE's per-threshold step (the eligible users in ascending contribution, as many as fit) on a
    small grid of thresholds around the scheduler's own (plus, per refinement pass, every pair of the
    ``cross`` distinct caps and floors either side of the point); O(K log K) plus O(K) numpy per threshold
    pair, in a handful of vectorised calls.

    **Mixed** (``mixed_depth`` set; the ``improve_mixed`` post-step uses ``MIXED_DEPTH``): besides, an
    AD batch and an SD batch both rebuilt from scratch (:func:`agents.mixed_repack.mixed_repack`, SD at
    ``mixed_depth``, clipped to ``max_gamma``); its plan is taken when it serves more than both
    ``modes`` and the re-pack's winner.

    **Every pair** (``all_pairs_ad``; the ``improve_mixed_all_pairs`` post-step): besides, the AD-only
    re-pack over every (input cap, slack floor) pair of the round
    (:func:`agents.ad_prefix_search.best_ad_prefix`, pruned by exact bounds against the best count
    found above -- a high one prunes the most); its plan is taken when it serves more than all above.

    **Six-parameter mixed** (``mixed_six`` with ``mixed_depth``; the ``improve_mixed6_all_pairs``
    post-step): the mixed re-pack searches the six-parameter family instead (an input cap on the SD
    batch too) with up to ``SIX_PASSES`` passes of line searches ``SIX_WINDOW`` values wide, and runs
    after the every-pair search: its line searches run only when its start grid's best plan is within
    ``SIX_SEARCH_MARGIN`` users of the best found so far (``mixed_repack(search_from=...)``). Its plan
    is taken when it serves more than every plan above.
    """
    if mixed_six and mixed_depth is None:
        raise ValueError("mixed_six is a variant of the mixed re-pack: it needs mixed_depth")
    modes = np.asarray(modes, dtype=np.int8)
    k = len(modes)
    if k == 0:
        return modes.copy(), None, None
    g = int(min(max(gamma, 1), max_gamma))
    by_output = np.lexsort((rnd.input_tokens, rnd.output_tokens))
    inp_sorted, slack_sorted = rnd.input_tokens[by_output], rnd.slack_s[by_output]
    best_count = int((modes != 0).sum())
    # (mode re-packed, its batch's members, the users kept as they are)
    jobs = [(AD, np.flatnonzero(modes == AD), np.where(modes == SD, SD, 0).astype(np.int8)), (SD, np.flatnonzero(modes == SD), np.where(modes == AD, AD, 0).astype(np.int8))]
    if (modes == SD).any():  # with all_pairs_ad too: its grid point is the incumbent that lets the bounds prune
        jobs.append((AD, np.flatnonzero(modes), np.zeros(k, dtype=np.int8)))
    kept_mask = np.stack([keep[by_output] != 0 for _, _, keep in jobs])  # (jobs, K)
    n_kept = kept_mask.sum(axis=1)
    uses = [_batch_use(cost, rnd, np.flatnonzero(keep), SD if mode == AD else AD, g) for mode, _, keep in jobs]
    other = np.array(uses)  # (jobs, 2): the kept batch's share and bytes
    sd_used = np.array([mode == SD or (mode == AD and n > 0) for (mode, _, _), n in zip(jobs, n_kept, strict=True)])
    job_mode = np.array([mode for mode, _, _ in jobs])

    def score(job: np.ndarray, caps: np.ndarray, floors: np.ndarray) -> np.ndarray:
        """Users served by re-packing under each row (job, input cap, slack floor), less half the
        plan's fullness: the most users, then the most room left (ties go to the plan with more
        slack, which loses fewer users when outputs / acceptance differ from predictions). One
        vectorised pass per mode."""
        keys = np.empty(len(job))
        eligible = ~kept_mask[job] & (inp_sorted <= caps[:, None]) & (slack_sorted >= floors[:, None])
        for mode in (AD, SD):
            sel = job_mode[job] == mode
            if sel.any():
                j = job[sel]
                counts, used = longest_prefixes(cost, rnd, by_output, eligible[sel], mode, g, (other[j, 0], other[j, 1]), sd_used[j])
                keys[sel] = n_kept[j] + counts - TIE_WEIGHT * np.minimum(used, 1.0)
        return keys

    rows_job, rows_cap, rows_floor = [], [], []
    input_caps, slack_floors = np.quantile(rnd.input_tokens, INPUT_QUANTILES), np.quantile(rnd.slack_s, SLACK_QUANTILES)
    for job, (_, members, _) in enumerate(jobs):
        if len(members) == 0:
            continue
        caps = np.unique(np.concatenate([np.unique(rnd.input_tokens[members])[::-1][:S_VARIANTS], input_caps]))
        floors = np.unique(np.append(slack_floors, rnd.slack_s[members].min()))
        rows_job.append(np.full(len(caps) * len(floors), job))
        rows_cap.append(np.repeat(caps, len(floors)))
        rows_floor.append(np.tile(floors, len(caps)))
    count, best_point = best_count, None  # no batch to re-pack (an empty plan): only the mixed re-pack can add users
    if rows_job:
        job_r, cap_r, floor_r = (np.concatenate(x) for x in (rows_job, rows_cap, rows_floor))
        keys = score(job_r, cap_r.astype(float), floor_r)
        # refine the best grid points: the line of every distinct input cap and the line of every slack
        # floor through the point, within REFINE_WINDOW (a share of the round's users); the best wins
        inputs, slacks = np.sort(rnd.input_tokens), np.sort(rnd.slack_s)
        half = max(1, int(REFINE_WINDOW * k / 2))
        best_point = None
        for c in np.argsort(-keys, kind="stable")[:REFINE_STARTS].tolist():
            key, job, cap, floor = float(keys[c]), int(job_r[c]), float(cap_r[c]), float(floor_r[c])
            # (cap, floor) pairs scored by earlier passes score <= key: a pass scores only the new ones
            # (a point taken needs a strictly higher key), and stops when a pass moves nothing -- the
            # next would score the same rows -- so the result is that of scoring every pass in full
            seen: set[tuple[float, float]] = set()
            for _ in range(passes):
                line_caps, line_floors = _window(inputs, cap, half).astype(float), _window(slacks, floor, half)
                caps = np.concatenate([line_caps, np.full(len(line_floors), cap)])
                floors = np.concatenate([np.full(len(line_caps), floor), line_floors])
                if cross > 0:
                    cc, ff = _window(inputs, cap, cross).astype(float), _window(slacks, floor, cross)
                    caps = np.concatenate([caps, np.repeat(cc, len(ff))])
                    floors = np.concatenate([floors, np.tile(ff, len(cc))])
                pairs = list(zip(caps.tolist(), floors.tolist(), strict=True))
                new = np.fromiter((p not in seen for p in pairs), dtype=bool, count=len(pairs))
                seen.update(pairs)
                caps, floors = caps[new], floors[new]
                if len(caps) == 0:
                    break
                line = score(np.full(len(caps), job), caps, floors)
                i = int(np.argmax(line))
                if line[i] <= key:
                    break
                key, cap, floor = float(line[i]), float(caps[i]), float(floors[i])
            if best_point is None or key > best_point[0]:
                best_point = (key, job, cap, floor)
        count = int(np.ceil(best_point[0]))  # key = count - TIE_WEIGHT * fullness, fullness in [0, 1]
    found = None  # (modes, report, depth) of a from-scratch plan serving more than the re-pack's winner

    def most() -> int:
        """The most users any plan found so far serves."""
        return max(count, best_count, 0 if found is None else int((found[0] != 0).sum()))

    g_mixed = None if mixed_depth is None else int(min(max(mixed_depth, 1), max_gamma))
    if g_mixed is not None and not mixed_six:
        two, two_key = mixed_repack(cost, rnd, g_mixed)
        found = _if_more(cost, rnd, two, int(np.ceil(two_key)), most(), g_mixed) or found
    if all_pairs_ad:
        ad_only = best_ad_prefix(cost, rnd, more_than=most())
        if ad_only is not None:
            found = _if_more(cost, rnd, ad_only, int((ad_only != 0).sum()), most(), g) or found
    if g_mixed is not None and mixed_six:
        # last, so that its line searches can be skipped on rounds where its grid is far behind
        found = six_mixed_plan(cost, rnd, g_mixed, most()) or found
    if found is not None:
        return found
    if best_point is None or count <= best_count:
        return modes.copy(), None, None
    key, job, cap, floor = best_point
    mode, _, keep = jobs[job]
    eligible = (keep[by_output] == 0) & (inp_sorted <= cap) & (slack_sorted >= floor)
    out = keep.astype(np.int8).copy()
    out[by_output[eligible][: count - int((keep != 0).sum())]] = mode
    # the candidate was scored with the same formulas; one exact check guards against any drift
    rep = check_plans(cost, rnd, out[None], g)
    return (out, rep, g) if rep.feasible[0] else (modes.copy(), None, None)


def improve_plan(cost: CostModel, rnd: Round, plan: Plan, max_gamma: int, mixed: bool = False, all_pairs_ad: bool = False,
                 mixed_six: bool = False) -> Plan:
    """:func:`improve` on a :class:`~envs.plan.Plan`: the same plan if nothing serves more, else the
    improved modes with valid shares ``(z, lam)`` (``envs.feasibility.shares_for``); ``mixed``: with
    the mixed re-pack at ``MIXED_DEPTH`` and the refinement square ``MIXED_REFINE_CROSS`` (the plan
    then carries that depth when the mixed plan wins); ``all_pairs_ad`` (with ``mixed``): besides, the
    AD-only re-pack over every (cap, floor) pair -- on rounds of at most ``ALL_PAIRS_MAX_USERS`` users;
    larger ones get ``mixed`` alone; ``mixed_six`` (with ``mixed``): the mixed re-pack in its
    six-parameter family (:func:`_improve`). ``POST_STEP_OPTIONS`` names the combinations policies use."""
    if (all_pairs_ad or mixed_six) and not mixed:
        raise ValueError("all_pairs_ad and mixed_six extend the mixed post-step: they need mixed=True")
    old = np.asarray(plan.modes, dtype=np.int8)
    all_pairs_ad = all_pairs_ad and len(old) <= ALL_PAIRS_MAX_USERS
    cross, depth = (MIXED_REFINE_CROSS, MIXED_DEPTH) if mixed else (REFINE_CROSS, None)
    modes, rep, gamma = _improve(cost, rnd, old, plan.gamma, max_gamma, cross=cross, mixed_depth=depth, all_pairs_ad=all_pairs_ad,
                                 mixed_six=mixed_six)
    if rep is None or (modes != 0).sum() <= (old != 0).sum():
        return plan
    z, lam = shares_for(rep.ad_share_min, rep.sd_share_min, rep.ad_memory_bytes, rep.sd_memory_bytes, (modes == AD).sum(), (modes == SD).sum())
    # the depth the new modes were checked at: the plan's own only if it was in 1..max_gamma
    return Plan(modes, gamma=gamma, z=float(np.ravel(z)[0]), lam=float(np.ravel(lam)[0]))
