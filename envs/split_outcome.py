"""The realised outcome of a round with ED users: :func:`evaluate_split_plan` (each user's latency
and whether it is served, v0's ``envs.outcome.evaluate_plan`` for plans without ED) and
:func:`served_from_aggregates` (its served count from a builder's aggregates, the v1 env's last
step); the exact check that admitted the plan is ``envs.split_plan``'s.

When each ED user ends: at its ED batch's end (v1's closed form) or at its own last token.
:func:`evaluate_split_plan` prices the ED batch (``b`` users, padded prompt ``S``, longest
output ``N``, ``q = max g_k + 1`` query tokens, ``J = max J_k`` iterations) as the closed form of the
exact check does (notation of ``envs.split_plan``):

* ``ed_completion="batch"`` (default; EdgeSchedule-v1's outcome, bit-identical): every ED user ends
  when the batch ends, ``U_E + C_E / zeta_E + P_E + J X_E`` -- its most iterations times its slowest
  edge iteration, after the slowest edge prefill.
* ``ed_completion="own"`` (opt-in; what ``runtime.serve placement=split`` does: each request ends at
  its own last token, as v0's ``completion="own"``): user ``k`` ends after its own ``J_k``
  iterations, each taking its own edge iteration ``X_k`` and one verify pass of the batch
  at the server's occupancy (the batch's size ``b``, padded ``S``, ``N`` and ``q``, at share
  ``zeta_E``: the pass's cost does not shrink as users leave, as v0's "own" keeps the batch's size),
  after its own edge prefill ``P_k``:

      ``L_k = U_E + (tau_L(b, S, S) + J_k tau_L(b, q, c + q)) / zeta_E + P_k + J_k X_k``,
      ``c = S + N / 2``.

  The uplink stays the batch's slowest (the batch starts when its last user has arrived, as in v0).
  Every term is at most its batch counterpart (``J_k <= J``, ``P_k <= P_E``, ``X_k <= X_E``) and
  the operations are monotone in IEEE arithmetic, so ``own <= batch`` for every user, with equality
  for a user that has the batch's most iterations, slowest prefill and slowest edge iteration.

The admission check (``envs.split_plan.check_plan_split``) is unchanged: it plans for the batch's end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from envs.cost_model import sd_iterations
from envs.outcome import Outcome, evaluate_plan
from envs.plan import AD, ED, REJECT, SD, Plan
from envs.split_cost import SplitCostModel
from envs.split_plan import EdUsers, ed_time1, ed_users
from envs.workload import Round

if TYPE_CHECKING:
    from envs.cost_model import CostModel

ED_COMPLETIONS = ("batch", "own")


def check_ed_completion(ed_completion: str) -> None:
    """Raise a clear error unless ``ed_completion`` is one of :data:`ED_COMPLETIONS`."""
    if ed_completion not in ED_COMPLETIONS:
        raise ValueError(f"ed_completion must be one of {list(ED_COMPLETIONS)}, got {ed_completion!r}")


def ed_own_latency(cost: CostModel, b: int, s_max: int, n_max: int, q: int, iterations: np.ndarray, uplink_max_s: float,
                   prefill_s: np.ndarray, edge_s: np.ndarray, share: float) -> np.ndarray:
    """Seconds from the round's start to each ED user's own last token (``ed_completion="own"``).

    ``b, s_max, n_max, q``: the batch's size, longest prompt, longest realised output and query
    tokens per user (``max g_k + 1``); ``iterations`` (b,) the users' own ``J_k``; ``uplink_max_s`` the
    batch's slowest uplink; ``prefill_s`` (b,) and ``edge_s`` (b,) their own ``P_k`` and ``X_k`` in
    seconds; ``share`` the ED batch's compute share ``zeta_E`` (no share: never ends, inf).
    """
    if b < 1:
        raise ValueError(f"b (ED batch size) must be >= 1, got {b}")
    # the same operations in the same order as split_plan.ed_time1, so a user with the batch's most
    # iterations pays exactly the batch's server work
    s = max(float(s_max), 1.0)
    qf = float(q)
    c = s + float(n_max) / 2.0
    j = np.asarray(iterations, dtype=float)
    work_s = cost.tau_l.tau1(b, s, s) + j * cost.tau_l.tau1(b, qf, c + qf)
    end_s = work_s / share if share > 0 else np.full(j.shape, np.inf)
    return uplink_max_s + end_s + np.asarray(prefill_s, dtype=float) + j * np.asarray(edge_s, dtype=float)


def evaluate_split_plan(cost: CostModel, split: SplitCostModel | None, rnd: Round, plan: Plan, rng: np.random.Generator | None = None,
                        simulate_acceptance: bool = False, completion: str = "batch", sharing: str = "fixed", users: EdUsers | None = None,
                        ed_completion: str = "batch") -> Outcome:
    """Realised latency and served flags of a plan with AD, SD and ED users.

    Without ED users this *is* ``envs.outcome.evaluate_plan`` (v0's outcome). With them (choice):
    each batch runs at its fixed share (AD ``z``, ED ``ed_share``, SD the rest) for its whole life;
    ``sharing`` other than the paper's is not modelled for such rounds. ``completion`` applies to their
    AD and SD users as in v0: ``"batch"`` (the paper) ends every user at its batch's end,
    ``"own"`` ends each at its own last token (its own work, at the batch's size, over the batch's
    share: v0's ``completion="own"`` under fixed sharing; ED users follow ``ed_completion``). ED users'
    realised latency is ``U_E + C_E / zeta_E + P_E + J X_E`` with their realised outputs and
    acceptance (expected tokens per iteration: ``simulate_acceptance`` applies to SD only).
    ``users``: the round's predicted :class:`EdUsers` (at least ``max ed_depth``
    depths), reused when realised equals predicted (saves recomputing them). ``ed_completion``:
    ``"batch"`` (default, the formula above) or ``"own"`` (each ED user ends at its own last token:
    ``envs.split_outcome``).
    """
    check_ed_completion(ed_completion)
    ed_idx = np.flatnonzero(plan.modes == ED)
    if ed_idx.size == 0:
        return evaluate_plan(cost, rnd, plan, rng=rng, simulate_acceptance=simulate_acceptance, completion=completion, sharing=sharing)
    if split is None or plan.ed_depth is None:
        raise ValueError("a plan with ED users needs a SplitCostModel and plan.ed_depth")
    modes = plan.modes
    latency = np.full(rnd.num_users, np.inf)
    ad_batch_s = sd_batch_s = 0.0
    # AD and SD at fixed shares (AD z, SD 1 - z - ed_share), each user finishing at its batch's end
    # ("batch") or at its own last token ("own"): what evaluate_plan computes for an AD-only and an
    # SD-only plan (sharing "fixed"), here in Python floats per batch (the scalar env's end-of-episode
    # hot path; ad_time1 / sd_time1 are the array forms' operations in their order). An empty batch
    # reports nothing and its time is 0.
    if completion not in ("batch", "own"):
        raise ValueError(f"completion must be 'batch' or 'own', got {completion!r}")
    ad_idx = np.flatnonzero(modes == AD)
    if ad_idx.size:
        s_max, n_max = _max(rnd.input_tokens, ad_idx), _max(rnd.realized_output_tokens, ad_idx)
        total = cost.ad_time1(ad_idx.size, s_max, n_max)
        # "own": v0's own work -- the batch's size, each user's own output
        own = cost.ad_time(np.full(ad_idx.size, ad_idx.size), s_max, rnd.realized_output_tokens[ad_idx]) if completion == "own" else None
        ad_batch_s = _fixed_share_finish(latency, rnd, ad_idx, total, float(plan.z), own)
    sd_idx = np.flatnonzero(modes == SD)
    if sd_idx.size and simulate_acceptance:  # acceptance drawn token by token from rng: evaluate_plan's own draws
        s = evaluate_plan(cost, rnd, Plan(np.where(modes == SD, SD, REJECT), gamma=plan.gamma, z=plan.z + plan.ed_share), rng=rng, simulate_acceptance=True,
                          completion=completion)
        latency[sd_idx], sd_batch_s = s.latency_s[sd_idx], s.sd_batch_s
    elif sd_idx.size:
        gamma = int(plan.gamma)
        j = sd_iterations(rnd.realized_output_tokens[sd_idx], rnd.realized_alpha[sd_idx], gamma)
        s_max, n_max = _max(rnd.input_tokens, sd_idx), _max(rnd.realized_output_tokens, sd_idx)
        total = cost.sd_time1(sd_idx.size, s_max, n_max, max(j.tolist()), gamma)
        # "own": each user's own iterations, every pass at the batch's size, S and N
        own = cost.sd_time(np.full(sd_idx.size, sd_idx.size), s_max, n_max, j, gamma) if completion == "own" else None
        sd_batch_s = _fixed_share_finish(latency, rnd, sd_idx, total, 1.0 - float(plan.z + plan.ed_share), own)
    depth = plan.ed_depth[ed_idx]
    d_max = max(depth.tolist())
    if users is None or users.tokens.shape[1] < d_max or not (_same(rnd.realized_output_tokens, rnd.output_tokens) and _same(rnd.realized_alpha, rnd.alpha)):
        users = ed_users(split, rnd, d_max, realised=True)
    col = depth - 1
    b = ed_idx.size
    s_max = _max(rnd.input_tokens, ed_idx)
    n_max = _max(rnd.realized_output_tokens, ed_idx)
    j_max = max(users.iterations[ed_idx, col].tolist())
    c_e = ed_time1(cost, b, s_max, n_max, j_max, d_max + 1)  # ed_time's operations in Python floats
    share = plan.ed_share
    end = c_e / share if share > 0 else np.inf
    if ed_completion == "own":
        latency[ed_idx] = ed_own_latency(cost, b, s_max, n_max, d_max + 1, users.iterations[ed_idx, col], _max(rnd.uplink_s, ed_idx),
                                         users.prefill_s[ed_idx], users.edge_s[ed_idx, col], share)
    else:
        latency[ed_idx] = _max(rnd.uplink_s, ed_idx) + end + _max(users.prefill_s, ed_idx) + j_max * max(users.edge_s[ed_idx, col].tolist())
    served = np.isfinite(latency) & (latency <= rnd.deadline_s * (1 + 1e-9))
    return Outcome(latency, served, ad_batch_s, sd_batch_s)


def served_from_aggregates(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: int, z: float, ed_share: float, b: list[int], s_max: list[int],
                           n_max: list[int], u_max: list[float], ed: list) -> int | None:
    """``evaluate_split_plan(...).served_count`` (expected acceptance) of a plan from its batches'
    aggregates, as ``envs.split_builder.SplitScalarPlan`` built them from the round's predictions and
    its ED rows (``ed_users``): ``b``, ``s_max``, ``n_max``, ``u_max`` per mode AD, SD, ED, and ``ed`` =
    ED's ``[J, q, P, X]`` maxima -- the scalar env's last step (issue #13). ``modes`` (K,) over
    ``rnd``'s users; ``gamma``, ``z``, ``ed_share`` the plan's.

    None unless the plan has ED users (without, ``evaluate_plan`` decides) and the round's realised
    outputs and acceptance are the predictions: then every maximum ``evaluate_split_plan`` takes is
    an aggregate (the same numbers), and the times, ends and latencies below are its operations in
    their order; only SD's ``J`` is recomputed, by its numpy ``sd_iterations``.
    """
    if not b[2] or not (_same(rnd.realized_output_tokens, rnd.output_tokens) and _same(rnd.realized_alpha, rnd.alpha)):
        return None
    # per mode, its users' latency before their own downlink (REJECT: inf); AD, SD: U + end (+ downlink below)
    lat = [np.inf, np.inf, np.inf, np.inf]
    if b[0]:
        total = cost.ad_time1(b[0], s_max[0], n_max[0])
        lat[AD] = u_max[0] + (total / z if z > 0 else np.inf)
    if b[1]:
        sd_idx = np.flatnonzero(modes == SD)  # the same arrays sd_iterations gets there
        j = sd_iterations(rnd.realized_output_tokens[sd_idx], rnd.realized_alpha[sd_idx], gamma)
        total = cost.sd_time1(b[1], s_max[1], n_max[1], max(j.tolist()), gamma)
        share = 1.0 - float(z + ed_share)
        lat[SD] = u_max[1] + (total / share if share > 0 else np.inf)
    j_max, q_max, p_max, x_max = ed  # ED: U_E + C_E / zeta_E + P_E + J X_E, no downlink
    c_e = ed_time1(cost, b[2], s_max[2], n_max[2], j_max, q_max)
    lat[ED] = u_max[2] + (c_e / ed_share if ed_share > 0 else np.inf) + p_max + j_max * x_max
    # adding 0.0 to an ED user's latency leaves it as it is
    latency = np.array(lat)[modes] + np.where(modes == ED, 0.0, rnd.realized_downlink_s)
    return int(np.count_nonzero(np.isfinite(latency) & (latency <= rnd.deadline_s * (1 + 1e-9))))


def _fixed_share_finish(latency: np.ndarray, rnd: Round, idx: np.ndarray, total_s: float, share: float, own_s: np.ndarray | None = None) -> float:
    """Write the realised latency of batch ``idx`` (``total_s`` of work at ``share`` of the GPU) into
    ``latency``: every user finishing at the batch's end, or with ``own_s`` (per user, full-device
    seconds; ``completion="own"``) each after its own work -- ``evaluate_plan``'s under fixed
    sharing; return the batch's end (inf without a share)."""
    end = total_s / share if share > 0 else np.inf
    if own_s is None:
        finish = end
    else:
        finish = np.asarray(own_s, dtype=float) / share if share > 0 else np.full(idx.size, np.inf)
    latency[idx] = _max(rnd.uplink_s, idx) + finish + rnd.realized_downlink_s[idx]
    return float(end)


# The end-of-episode hot path (issue #13) takes a few small maxima per batch: Python's max over a
# gathered list is about half numpy's reduction call there, and gives the same value (exact, no NaN
# in these arrays) as a Python int or float -- what the callers converted numpy's result to anyway.
def _max(a: np.ndarray, idx: np.ndarray):
    """``a[idx].max()`` as a Python number (``idx`` non-empty)."""
    return max(a[idx].tolist())


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal(a, b)`` for two of a round's arrays, without its argument checks."""
    return a.shape == b.shape and bool((a == b).all())
