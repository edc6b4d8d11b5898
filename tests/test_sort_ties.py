"""Plans do not depend on how a platform's unstable sort orders ties.

The schedulers rank users and candidate rows with ``np.argsort(..., kind="stable")``: among equal
keys the lower index comes first, on every machine. numpy's default kind (introsort, or
x86-simd-sort on AVX-512 builds) leaves the order of equal keys to the implementation, and where
the solvers' ties are real -- equally large user sets reached from rows with the same bound, users
with the same compute share -- that order decides which of the equally good plans is returned. A
plan that changed with the CPU it was computed on would break the bit-exact goldens and the
reproducibility of every published table.

The tests run each scheduler twice: as it is, and with the module's ``np`` replaced by a namespace
whose ``argsort`` -- unless asked for a stable sort -- orders ties by *descending* index, as
another platform's unstable sort may. The plans must be identical. (Written against the mutants
``bash scripts/mutation.sh agents split`` left alive: ``kind="stable"`` dropped from those sorts.)
"""

from __future__ import annotations

import types

import numpy as np
import pytest

import agents.balance_ed as balance_ed
import agents.edge_first as edge_first
import agents.mode_solver as mode_solver
from agents.balance_ed import BalanceED
from agents.edge_first import EdgeFirst
from envs import AD, SD, CostModel
from envs.config import EnvConfig
from envs.workload import make_rounds

SPLIT_PROFILE = "split_a100-40gb_llama2-7b_tinyllama-1.1b"


def _ties_reversed_argsort(a, axis=-1, kind=None, order=None):
    """``np.argsort``, but an unstable kind puts equal keys in descending index order."""
    if kind is not None and kind.lower() == "stable":
        return np.argsort(a, axis=axis, kind="stable", order=order)
    a = np.asarray(a)
    if a.ndim != 1 or order is not None:
        raise NotImplementedError("the schedulers sort 1-d keys")
    n = len(a)
    return (n - 1 - np.argsort(a[::-1], kind="stable")).astype(np.intp)


OTHER_PLATFORM_NP = types.SimpleNamespace(**{name: getattr(np, name) for name in dir(np) if not name.startswith("__")})
OTHER_PLATFORM_NP.argsort = _ties_reversed_argsort


def test_the_stand_in_sort_reverses_ties_only():
    keys = np.array([2, 1, 2, 0, 1, 2])
    assert _ties_reversed_argsort(keys).tolist() == [3, 4, 1, 5, 2, 0]
    assert _ties_reversed_argsort(keys, kind="stable").tolist() == [3, 1, 4, 0, 2, 5]
    for kind in (None, "quicksort"):  # a valid sort either way
        assert np.all(np.diff(keys[_ties_reversed_argsort(keys, kind=kind)]) >= 0)


@pytest.mark.parametrize("k", [24, 40])
def test_solve_mode_is_the_same_whatever_the_unstable_sort(monkeypatch, k):
    cfg = EnvConfig(num_users=k)
    cost = CostModel.from_config(cfg)
    cases = []
    for rnd in make_rounds(cfg, 6, seed=7, split="test"):
        for mode in (AD, SD):
            tab = mode_solver.build_table(cost, rnd, mode, 4)
            mem = float(cost.memory_budget(mode == SD))
            for share in (0.3, 0.6, 1.0):
                cases.append((tab, share, mem))
    everyone = np.ones(k, dtype=bool)
    here = [mode_solver.solve_mode(tab, everyone, share, mem).tolist() for tab, share, mem in cases]
    monkeypatch.setattr(mode_solver, "np", OTHER_PLATFORM_NP)
    there = [mode_solver.solve_mode(tab, everyone, share, mem).tolist() for tab, share, mem in cases]
    assert there == here
    assert sum(len(h) > 0 for h in here) > len(cases) // 2  # most cases serve someone: not a comparison of empty sets


@pytest.mark.parametrize("scheduler", [BalanceED, EdgeFirst])
def test_split_schedulers_plan_the_same_whatever_the_unstable_sort(monkeypatch, scheduler):
    """Rounds of four users, each repeated 16 times: the copies' shares alone tie exactly, and
    where the ED batch takes only some copies of a user, the sort's tie order picks which."""
    cfg = EnvConfig(num_users=4, profile=SPLIT_PROFILE, edge_fraction=1.0, max_gamma=8, deadline_s=[2.0, 8.0],
                    output_tokens=[20, 400], rtt_ms=[5.0, 65.0])
    cost = CostModel.from_config(cfg)
    copies = 16
    rounds = [rnd.subset(np.repeat(np.arange(4), copies)) for rnd in make_rounds(cfg, 6, seed=3, split="test")]
    here = [scheduler(cost, cfg.max_gamma).decide(rnd) for rnd in rounds]
    ed_copies = [np.bincount(np.flatnonzero(p.ed_depth > 0) // copies, minlength=4) for p in here if p.ed_depth is not None]
    assert any(np.any((n > 0) & (n < copies)) for n in ed_copies)  # some user has only some copies in ED: the ties decide
    module = balance_ed if scheduler is BalanceED else edge_first
    monkeypatch.setattr(module, "np", OTHER_PLATFORM_NP)
    there = [scheduler(cost, cfg.max_gamma).decide(rnd) for rnd in rounds]
    for a, b in zip(here, there, strict=True):
        assert a.modes.tolist() == b.modes.tolist() and a.gamma == b.gamma
        assert (a.ed_depth is None) == (b.ed_depth is None)
        if a.ed_depth is not None:
            assert a.ed_depth.tolist() == b.ed_depth.tolist()
