"""When each ED user of a round ends: at its ED batch's end (v1's closed form) or at its own last token.

``envs.split_plan.evaluate_split_plan`` prices the ED batch (``b`` users, padded prompt ``S``, longest
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
