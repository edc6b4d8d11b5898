"""Pipeline-aware cohorts: how N SpecEdge clients share one verifying server in steady state.

The queueing half of the split mode's closed form (``envs.split_cost``), kept apart from the
per-user cost components there because it is expectation arithmetic over those components: it
needs no profile, only each cohort's verify pass and each client's edge iteration as a two-point
law (hit on a proactive reuse, else miss).

**Pipeline-aware cohorts** (steady state, N clients, alternating by index into cohorts A, B of
sizes ``ceil(N/2)``, ``floor(N/2)``; the server batches a cohort once all of it has arrived):
period ``T = max(V_A + V_B, V_A + X_A, V_B + X_B)`` with ``V`` each cohort's verify pass and ``X``
its slowest client's edge iteration. Proactive reuse is random per client, so ``X`` of a cohort is
the maximum of independent two-point variables (``hit`` with the reuse probability, else ``miss``):
a block reused by some clients of a cohort saves nothing unless all of them reuse. The closed form
takes ``E[T]`` over those maxima (exact for independent cycles; carry-over between cycles ignored). Without pipelining (one cohort): ``T = V_N + X``. Every
client's iteration takes ``T``; server occupancy ``(V_A + V_B) / T``; server throughput
``sum_k E_k / T``; inter-token latency ``ITL = N T / sum_k E_k`` (SpecEdge's metric: all clients'
iteration time over all their tokens). Proactive waits solve ``wait = T - (edge time before
send)`` by fixed-point iteration from the lower bound ``network + own cohort's verify``
(:func:`solve_period`).

:class:`Proactive` is a client's per-iteration proactive law (what ``SplitCostModel.proactive``
prices and the cohort maxima consume); :class:`SteadyState` is the record
``SplitCostModel.steady_state`` and ``SplitCostModel.server_only`` return. ``envs.split_cost``
re-exports both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Proactive:
    """Expected effect of proactive drafting on one iteration."""

    reuse_probability: float
    saved_s: float  #: expected edge seconds saved (reuse probability x passes done in the wait)
    delay_s: float  #: interrupt delay (a pass in flight finishing after the verdict)
    done_s: float = 0.0  #: seconds of the next block's passes finished within the wait (saved on reuse)
    levels: int = 0  #: draft passes (levels) finished within the wait


@dataclass(frozen=True)
class SteadyState:
    """N clients in steady state (module docstring: pipeline-aware cohorts)."""

    num_clients: int
    iteration_s: float  #: every client's iteration (period T)
    itl_s: float  #: N T / sum E_k
    throughput_tok_s: float  #: sum E_k / T, the server's tokens per second
    server_busy: float  #: fraction of T the server spends verifying (occupancy)
    tokens_per_iteration: float  #: mean E_k
    verify_s: tuple[float, ...]  #: each cohort's verify pass
    edge_s: tuple[float, ...]  #: each cohort's expected slowest edge iteration E[max_k X_k] (empty for server-only)
    memory_bytes: float  #: server memory for the clients' KV (+ draft weights for server-only SD)
    fits_memory: bool


def cohort_indices(num_clients: int, pipeline: bool) -> list[np.ndarray]:
    """Client indices of each cohort: alternating by index into two (sizes ``ceil(N/2)``, ``floor(N/2)``)
    with ``pipeline`` and at least two clients, else one cohort of all."""
    return [np.arange(0, num_clients, 2), np.arange(1, num_clients, 2)] if (pipeline and num_clients >= 2) else [np.arange(num_clients)]


def max_of_two_point(hit: np.ndarray, miss: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distribution ``(values, probabilities)`` of ``max_k X_k``, ``X_k = hit_k`` w.p. ``p_k`` else ``miss_k`` (independent)."""
    vals = np.unique(np.concatenate([hit, miss]))
    below = np.where(vals[:, None] >= miss[None, :], 1.0, np.where(vals[:, None] >= hit[None, :], p[None, :], 0.0))
    pmf = np.diff(np.concatenate([[0.0], np.prod(below, axis=1)]))
    keep = pmf > 0
    return vals[keep], pmf[keep]


def expected_period(verify: list[float], dists: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """``E[T]``: one cohort ``V + X``; two ``max(V_A + V_B, V_A + X_A, V_B + X_B)``, X the cohorts' edge maxima."""
    if len(verify) == 1:
        vals, probs = dists[0]
        return float((verify[0] + vals) @ probs)
    (xa, pa), (xb, pb) = dists
    va, vb = verify
    t = np.maximum(np.maximum(va + vb, va + xa[:, None]), vb + xb[None, :])
    return float(pa @ t @ pb)


def solve_period(verify: list[float], cohorts: list[np.ndarray], draft: np.ndarray, net: np.ndarray,
                 proactive_at: Callable[[np.ndarray], list[Proactive]], iterations: int) -> tuple[float, tuple[float, ...], np.ndarray]:
    """The steady period ``E[T]`` by fixed-point iteration over the clients' proactive waits.

    ``verify``: each cohort's verify pass; ``cohorts``: :func:`cohort_indices`; ``draft``, ``net``: each
    client's edge drafting and network seconds; ``proactive_at(wait)``: each client's :class:`Proactive`
    for its wait; at most ``iterations`` rounds. Returns the period, each cohort's expected slowest edge
    iteration and the clients' waits (those the last proactive law was priced at, on convergence).
    """
    # wait = E[T] - E[edge time before sending]; start from the lower bound net + own cohort's verify
    wait = np.concatenate([net[c] + verify[i] for i, c in enumerate(cohorts)])[np.argsort(np.concatenate(cohorts))]
    period, edge = 0.0, ()
    for _ in range(iterations):
        pro = proactive_at(wait)
        p = np.array([q.reuse_probability for q in pro])
        done = np.array([q.done_s for q in pro])
        miss = draft + np.array([q.delay_s for q in pro]) + net
        dists = [max_of_two_point(miss[c] - done[c], miss[c], p[c]) for c in cohorts]
        new = expected_period(verify, dists)
        edge = tuple(float(vals @ probs) for vals, probs in dists)
        wait_new = np.maximum(new - (miss - net - p * done), net)
        if abs(new - period) <= 1e-12 * max(new, 1.0) and np.allclose(wait_new, wait, rtol=1e-12, atol=0):
            period = new
            break
        period, wait = new, wait_new
    return period, edge, wait


def check_num_clients(num_clients: int) -> int:
    """``num_clients`` as an int, or ValueError unless it is an integer >= 1 (bools refused)."""
    if not isinstance(num_clients, int | np.integer) or isinstance(num_clients, bool) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    return int(num_clients)
