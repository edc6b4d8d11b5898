"""Mode ED (SpecEdge split) in the round model: per-user constants, the ED batch, the exact check.

An ED user drafts on its own edge GPU with a chain of its **own** depth ``g_k``; the server holds
only the target's KV for it (no draft weights, no draft KV) and verifies all ED users in one
batched pass per iteration. Notation as in ``envs.cost_model`` (``S`` longest input, ``N`` longest
output, ``kv_L`` the target's KV bytes per token) and ``envs.split_cost`` (``tau_E`` the draft on the
edge). Per ED user ``k`` at depth ``g`` (its own sequence, context ``c_k = I_k + O_k / 2``):

* ``E_k(g) = (1 - a_k^(g+1)) / (1 - a_k)``, iterations ``J_k(g) = ceil(O_k / E_k(g))``;
* edge iteration ``X_k(g) = split_cost.edge_iteration_s(a_k, chain(g), c_k, rtt_k, reused=False)``:
  drafting ``sum_{i<g} tau_E(1, 1, c_k + i + 1)``, plus the proactive interrupt delay, plus the
  network (its own RTT). **Choice:** no proactive saving is priced: the batch waits for its slowest
  edge every iteration, so a reused block shortens an iteration only when *every* ED user reuses
  (probability ``prod_k P_k``, negligible beyond one or two users) -- conservative, and a per-user
  constant, which keeps the check O(1) per user. The wait bounding the delay is
  ``network + tau_L(1, g + 1, c_k + g + 1)`` (the lower bound: one client's verify);
* edge prefill ``P_k = tau_E(1, I_k, I_k)``; allowed iff the user has an edge and the draft's
  weights plus its KV ``(I_k + O_k + g + 1) kv_S`` fit the edge device (after its reserve).

The ED batch (``b`` users; ``q = max g_k + 1`` query tokens per user, padded; ``J = max J_k``):

* server work ``C_E = tau_L(b, S, S) + J tau_L(b, q, c + q)``, ``c = S + N / 2`` (as SD's mean context);
* latency of its users ``U_E + C_E / zeta_E + P_E + J X_E <= T_k`` with ``U_E`` the slowest uplink,
  ``P_E = max P_k``, ``X_E = max X_k`` (the server waits for the cohort's slowest edge each
  iteration). **No downlink**: the tokens reach the user inside the verdicts (priced in ``X``);
* so the least share is ``zeta_E = C_E / beta_E`` with ``beta_E = min T_k - U_E - P_E - J X_E``;
* memory ``per_user``: ``(b (S + q) + sum O_k) kv_L``; ``padded``: ``b (S + N + q) kv_L``.

**How ED shares the GPU with AD and SD (choice).** The ED verify batch is a third batch with its
own compute share, like AD's and SD's: its passes run at ``zeta_E`` of the GPU; while it waits on
the edges its share idles (the paper's fixed sharing; a work-conserving server would lend it out).
The exact check keeps its L1/L2 form: memory ``M_A + M_S + M_E <= Q - reserve - W_L - [SD used] W_S``
(ED adds no weights); compute ``C_A/beta_A + C_S/beta_S + C_E/beta_E <= 1`` (each empty mode 0).
Every aggregate is a max, min or sum over the batch and every term is monotone in them, so removing
a user never breaks feasibility (downward closed), and adding one is O(1) given the previous
aggregates (``envs.split_builder``). Sums are taken in the order ``(A + S) + E`` everywhere so the
incremental builders and this check agree to the bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from envs.feasibility import EPS, check_plans
from envs.plan import AD, ED, REJECT, SD
from envs.split_cost import SplitCostModel
from envs.workload import Round

if TYPE_CHECKING:  # the CostModel's module is being renamed (envs.feasibility -> envs.cost_model)
    from envs.cost_model import CostModel


@dataclass
class EdUsers:
    """Per-user ED constants of one round for depths ``1..G``: arrays (K, G), ``prefill_s`` (K,)."""

    tokens: np.ndarray  #: E_k(g)
    iterations: np.ndarray  #: J_k(g)
    edge_s: np.ndarray  #: X_k(g), seconds
    allowed: np.ndarray  #: has an edge and fits it
    prefill_s: np.ndarray  #: P_k, seconds


@lru_cache(maxsize=64)
def _depth_grid(g_max: int, overhead_bytes: float, draft_bytes: float, reply_bytes: float, bandwidth_bytes_per_s: float):
    """The user-independent (1, G) rows of :func:`ed_users` (read-only; cached by value: a reset
    prices them once, and a changed network section gives new rows)."""
    g = np.arange(1, g_max + 1, dtype=float)[None, :]
    g1 = g + 1.0
    network = (2.0 * overhead_bytes + g1 * (draft_bytes + reply_bytes)) / bandwidth_bytes_per_s  # message bytes / bandwidth
    depth_idx = np.arange(g_max)
    for a in (g, g1, network, depth_idx):
        a.setflags(write=False)
    return g, g1, network, depth_idx


def ed_users(split: SplitCostModel, rnd: Round, max_gamma: int, realised: bool = False) -> EdUsers:
    """The ED constants of ``rnd``'s users (predictions, or the realised outputs and acceptance)."""
    if not isinstance(max_gamma, int | np.integer) or isinstance(max_gamma, bool) or max_gamma < 1:
        raise ValueError(f"max_gamma must be an integer >= 1, got {max_gamma!r}")
    k = rnd.num_users
    has = np.zeros(k, dtype=bool) if rnd.has_edge is None else np.asarray(rnd.has_edge, dtype=bool)
    rtt = np.full(k, split.net.rtt_s) if rnd.rtt_s is None else np.asarray(rnd.rtt_s, dtype=float)
    return ed_users_arrays(split, rnd.input_tokens, rnd.realized_output_tokens if realised else rnd.output_tokens,
                           rnd.realized_alpha if realised else rnd.alpha, has, rtt, int(max_gamma))


def ed_users_arrays(split: SplitCostModel, input_tokens: np.ndarray, output_tokens: np.ndarray, alpha: np.ndarray, has_edge: np.ndarray,
                    rtt_s: np.ndarray, max_gamma: int) -> EdUsers:
    """:func:`ed_users` of users given as (K,) arrays. Every row is its user's alone (element-wise
    operations, row-wise sums), so the users of several rounds concatenated get their rounds' rows:
    a vector env prices all its resetting rounds in one call (``envs.split_reset_batch``)."""
    k, g_max = len(input_tokens), int(max_gamma)
    inp = input_tokens.astype(float)
    out = output_tokens.astype(float)
    alpha = np.asarray(alpha, dtype=float)
    has = np.asarray(has_edge, dtype=bool)
    rtt = np.asarray(rtt_s, dtype=float)
    net = split.net
    # a reset's hot spot (one call per round): the same operations as written out per user, with the
    # depth-only rows computed once (_depth_grid)
    g, g1, net_row, depth_idx = _depth_grid(g_max, float(net.request_overhead_bytes), float(net.bytes_per_draft_token),
                                            float(net.bytes_per_reply_token), float(net.bandwidth_bytes_per_s))
    c = inp + out / 2.0
    first = np.maximum(inp, 1.0)
    # edge passes: the i-th (0-based) at context c + i + 1 (split_cost.edge_pass_s for a chain), and
    # the edge's prompt prefill tau_E(1, I, I), priced in one element-wise tau_E call (K * G + K points)
    kg = k * g_max
    q_all, c_all = np.empty(kg + k), np.empty(kg + k)  # [chain passes (K * G, row-major), prefills (K)]: filled in place, no concatenate
    q_all[:kg] = 1.0
    q_all[kg:] = first
    np.add(c[:, None], g, out=c_all[:kg].reshape(k, g_max))
    c_all[kg:] = first
    both = split.tau_e.tau(1.0, q_all, c_all)
    step, prefill = both[:kg].reshape(k, g_max), both[kg:]
    cum = step.cumsum(axis=1)  # nondecreasing along a row: every pass takes time
    near = alpha > 1.0 - 1e-9
    if near.any():
        safe = np.where(near, 0.5, alpha)[:, None]
        tokens = np.where(near[:, None], g1, (1.0 - safe ** g1) / (1.0 - safe))
    else:  # the usual round: no acceptance near 1, so both np.where would take the formula everywhere
        a = alpha[:, None]
        tokens = (1.0 - a ** g1) / (1.0 - a)
    iterations = np.ceil(out[:, None] / tokens - 1e-9).astype(np.int64)
    network = rtt[:, None] + net_row
    wait = network + split.tau_l.tau(1.0, g1, c[:, None] + g1)
    opts = split.options
    if opts.proactive and opts.interrupt == "step":
        # the proactive block's pass in flight when the verdict arrives delays the next block (no
        # saving is priced: see the module docstring); depth j (0-based) has passes 0..j, those
        # finished within the wait form a prefix of length min(m, j + 1), m = how many of the chain's
        # passes finish within it (cum is nondecreasing): if m <= j, pass m is in flight
        fits = cum[:, None, :] <= wait[:, :, None]
        if g_max % 8 == 0:  # 8 bools (bytes 0 or 1) are one uint64 word: its popcount is their count (a reset's hot spot; a short-axis sum is slower)
            words = np.bitwise_count(fits.view(np.uint64))
            m = words[:, :, 0] if g_max == 8 else words.sum(axis=2, dtype=np.int64)
        else:  # counted over uint8: numpy's bool sum is slower
            m = fits.view(np.uint8).sum(axis=2, dtype=np.int64)
        delay = np.where(m <= depth_idx[None, :], cum[np.arange(k)[:, None], np.minimum(m, g_max - 1)] - wait, 0.0)
        edge = cum + delay + network
    else:
        edge = cum + network
    prof = split.profile
    room = prof.edge.device.memory_bytes - prof.edge.device.reserve_bytes - prof.slm.weight_bytes
    fits_edge = (inp + out)[:, None] + g1 <= room / split.kv_s  # whole numbers of tokens: (I + O + g) + 1 is I + O + (g + 1) exactly
    return EdUsers(tokens, iterations, edge, has[:, None] & fits_edge, prefill)


# ------------------------------------------------------------------------- the ED batch
def ed_time(cost: CostModel, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike, j_max: ArrayLike, q_max: ArrayLike) -> np.ndarray:
    """``C_E`` in seconds on the whole GPU (0 for an empty batch); numpy."""
    b = np.asarray(b, dtype=np.int64)
    bb = np.maximum(b, 1)
    s = np.maximum(np.asarray(s_max, dtype=float), 1.0)
    q = np.asarray(q_max, dtype=float)
    c = s + np.asarray(n_max, dtype=float) / 2.0
    t = cost.tau_l.tau(bb, s, s) + np.asarray(j_max, dtype=float) * cost.tau_l.tau(bb, q, c + q)
    return np.where(b > 0, t, 0.0)


def ed_time1(cost: CostModel, b: int, s_max: int, n_max: int, j_max: int, q_max: int) -> float:
    """:func:`ed_time` of one batch in Python floats (same operations, same order)."""
    if b <= 0:
        return 0.0
    s = max(float(s_max), 1.0)
    q = float(q_max)
    c = s + float(n_max) / 2.0
    return cost.tau_l.tau1(b, s, s) + float(j_max) * cost.tau_l.tau1(b, q, c + q)


def ed_memory(cost: CostModel, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike, sum_out: ArrayLike, q_max: ArrayLike) -> np.ndarray:
    """Server KV bytes of the ED batch (the target's KV only)."""
    b = np.asarray(b, dtype=float)
    s = np.asarray(s_max, dtype=float)
    if cost.kv_memory == "per_user":
        return (b * (s + q_max) + sum_out) * cost.kv_l
    return b * (s + n_max + q_max) * cost.kv_l


def ed_memory1(cost: CostModel, b: int, s_max: int, n_max: int, sum_out: int, q_max: int) -> float:
    if cost.kv_memory == "per_user":
        return (float(b) * (float(s_max) + q_max) + sum_out) * cost.kv_l
    return float(b) * (float(s_max) + n_max + q_max) * cost.kv_l


def ed_budget(t_min: ArrayLike, u_max: ArrayLike, p_max: ArrayLike, j_max: ArrayLike, x_max: ArrayLike) -> np.ndarray:
    """``beta_E = min T_k - U_E - P_E - J X_E`` (works on floats and arrays alike)."""
    return t_min - u_max - p_max - j_max * x_max


def ed_share(time_s: ArrayLike, b: ArrayLike, budget: ArrayLike) -> np.ndarray:
    """``C_E / beta_E`` (0 if empty, inf if the budget is <= 0); numpy."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(budget > 0, time_s / np.where(budget > 0, budget, 1.0), np.inf)
    return np.where(np.asarray(b) > 0, r, 0.0)


@dataclass
class SplitReport:
    """The exact check of a plan with AD, SD and ED users."""

    feasible: bool
    ad_share_min: float
    sd_share_min: float
    ed_share_min: float
    ad_memory_bytes: float
    sd_memory_bytes: float
    ed_memory_bytes: float
    memory_budget_bytes: float
    ed_time_s: float
    z: float  #: AD's compute share (proportional split of the slack)
    ed_share: float  #: ED's compute share; SD gets 1 - z - ed_share
    lam: float  #: AD's share of the KV memory


def ed_aggregates(users: EdUsers, rnd: Round, idx: np.ndarray, depth: np.ndarray) -> dict:
    """The ED batch's aggregates for users ``idx`` at depths ``depth`` (both (b,))."""
    col = depth - 1
    return {
        "b": len(idx),
        "s_max": int(rnd.input_tokens[idx].max(initial=0)),
        "n_max": int(rnd.output_tokens[idx].max(initial=0)),
        "j_max": int(users.iterations[idx, col].max(initial=0)),
        "q_max": int(depth.max(initial=0)) + 1 if len(idx) else 0,
        "u_max": float(rnd.uplink_s[idx].max(initial=0.0)),
        "t_min": float(rnd.deadline_s[idx].min(initial=np.inf)),
        "p_max": float(users.prefill_s[idx].max(initial=0.0)),
        "x_max": float(users.edge_s[idx, col].max(initial=0.0)),
        "sum_out": int(rnd.output_tokens[idx].sum()),
    }


def check_plan_split(cost: CostModel, users: EdUsers, rnd: Round, modes: np.ndarray, gamma: int, ed_depth: ArrayLike) -> SplitReport:
    """The exact check of one plan: ``modes`` (K,) over REJECT/AD/SD/ED, SD depth ``gamma``, ED depths per user."""
    modes = np.asarray(modes)
    depth = np.asarray(ed_depth, dtype=np.int64)
    g_max = users.tokens.shape[1]
    idx = np.flatnonzero(modes == ED)
    d = depth[idx]
    if np.any((d < 1) | (d > g_max)):
        raise ValueError(f"ed_depth of ED users must be in [1, {g_max}], got {d.tolist()}")
    rep = check_plans(cost, rnd, np.where(modes == ED, REJECT, modes), gamma)
    agg = ed_aggregates(users, rnd, idx, d)
    c_e = float(ed_time(cost, agg["b"], agg["s_max"], agg["n_max"], agg["j_max"], agg["q_max"]))
    r_e = float(ed_share(c_e, agg["b"], ed_budget(agg["t_min"], agg["u_max"], agg["p_max"], agg["j_max"], agg["x_max"])))
    m_e = float(ed_memory(cost, agg["b"], agg["s_max"], agg["n_max"], agg["sum_out"], agg["q_max"])) if agg["b"] else 0.0
    r_a, r_s = float(rep.ad_share_min), float(rep.sd_share_min)
    m_a, m_s, budget = float(rep.ad_memory_bytes), float(rep.sd_memory_bytes), float(rep.memory_budget_bytes)
    ok = bool(users.allowed[idx, d - 1].all()) and r_a + r_s + r_e <= 1.0 + EPS and m_a + m_s + m_e <= budget * (1 + EPS) and budget >= 0
    z, e_share, lam = shares_split(r_a, r_s, r_e, m_a, m_s, m_e, int(np.count_nonzero(modes == AD)), int(np.count_nonzero(modes == SD)), agg["b"])
    return SplitReport(ok, r_a, r_s, r_e, m_a, m_s, m_e, budget, c_e, z, e_share, lam)


def shares_split(r_a: float, r_s: float, r_e: float, m_a: float, m_s: float, m_e: float, b_a: int, b_s: int, b_e: int) -> tuple[float, float, float]:
    """``(z, ed_share, lam)`` for a feasible plan: the compute slack split in proportion to the needs.

    Without ED users this is ``envs.feasibility.shares_for`` (AD and SD); with them each non-empty
    mode gets ``r_m / (r_A + r_S + r_E) >= r_m``. ``lam`` is AD's share of the KV in use.
    """
    if b_e == 0:
        if b_s == 0:
            return 1.0, 0.0, 1.0
        if b_a == 0:
            return 0.0, 0.0, 0.0
        return r_a / max(r_a + r_s, 1e-300), 0.0, m_a / max(m_a + m_s, 1e-300)
    total = max(r_a + r_s + r_e, 1e-300)
    mem = max(m_a + m_s + m_e, 1e-300)
    if b_a == 0 and b_s == 0:
        return 0.0, 1.0, 0.0
    return r_a / total, (r_e / total if b_s else 1.0 - r_a / total), m_a / mem
