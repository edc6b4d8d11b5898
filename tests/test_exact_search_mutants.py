"""The exhaustive search and its node bound (``agents/exact_search.py``) against brute force.

Written against the mutants ``bash scripts/mutation.sh agents`` left alive in that module. Every
expected value comes from outside the search: the exact check of ``envs`` on all ``3^K`` plans of
tiny rounds (K <= 6), or a round built by hand on the golden system of ``test_agents_core.py``.

* rounds where the constraints bind (``tests/adversarial_rounds.py``: deadlines between
  neighbouring batch costs, a KV budget equal to one subset's need, plans that need both modes;
  golden rounds with memory for a few users, both KV models, an SD workspace per user), so a
  node bound made too tight by a mutant cuts the true optimum;
* at *every* partial plan of such rounds (each level of the search order, each feasible prefix),
  :func:`node_bound` must cover the best completion brute force finds, and its ``alive`` mask
  must say exactly which remaining users still fit the partial plan alone;
* the dominance rule of the symmetry breaking, the options and the degenerate rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from adversarial_rounds import adversarial_round, mixed_round
from test_agents_core import all_plans, brute_optimum, golden, make_round, random_round

from agents.cost_envelope import CostEnvelope
from agents.dominance import dominance
from agents.exact_search import exhaustive_search, node_bound
from envs import AD, SD, CostModel, EnvConfig, PlanBuilder, check_plans
from envs.model_choices import ModelChoices

PAPER = EnvConfig(num_users=5)
PAPER_COST = CostModel.from_config(PAPER)


def _squeezed(cost: CostModel, rnd, fill: float) -> CostModel:
    """``cost`` with a KV budget (SLM loaded) of ``fill`` times everyone's AD need: memory binds."""
    p = cost.profile
    everyone = float(cost.ad_memory(rnd.num_users, rnd.input_tokens.max(), rnd.output_tokens.max(), rnd.output_tokens.sum()))
    return CostModel(p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes + fill * everyone), cost.kv_memory, cost.choices)


def binding_cases():
    """(cost, round, gamma) triples on which deadlines and KV memory both bind, K = 4..6."""
    cases = []
    rng = np.random.default_rng(7)
    for i in range(6):
        case = adversarial_round(rng, PAPER, PAPER_COST, 4 + i % 2, tight_memory=i % 2 == 0)
        cases.append((case.cost, case.rnd, 4))
    for _ in range(2):
        cases.append((PAPER_COST, mixed_round(rng, PAPER, PAPER_COST, 5), 4))
    work = ModelChoices(sd_user_workspace_bytes=4_000.0)
    for i in range(10):
        kv = ("per_user", "padded")[i % 2]
        rnd = random_round(rng, 5 + i % 2)
        base = golden(kv)
        if i % 3 == 2:
            base = CostModel(base.profile, kv, work)
        cases.append((_squeezed(base, rnd, (0.35, 0.5, 0.7)[i % 3]), rnd, 1 + i % 3))
    # identical users with graded deadlines: compute binds, the a-th largest slack decides
    graded = make_round([11] * 5, [4] * 5, [0.0728, 0.076, 0.0972, 0.1704, 0.1978], [0.7, 0.9, 0.9, 0.9, 0.5],
                        [0.0071, 0.0018, 0.0199, 0.0239, 0.0155], [0.0081, 0.0036, 0.0072, 0.0053, 0.0033])
    cases.append((golden("padded", 2_180_000.0), graded, 3))
    return cases


CASES = binding_cases()


def _in_order(rnd):
    return np.argsort(rnd.slack_s - rnd.uplink_s, kind="stable")


def _builder(cost, rnd, gamma, order, prefixes):
    """A PlanBuilder holding each prefix (modes of ``order[:level]``) as one partial plan."""
    n, level = prefixes.shape
    b = PlanBuilder(cost, n, gamma)
    for lv in range(level):
        u = order[lv]
        b.prepare(*(np.repeat(x[u : u + 1], n) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)))
        m = prefixes[:, lv]
        b.apply(np.where(m == AD, 1, np.where(m == SD, 1 + gamma, 0)))
    return b


# ------------------------------------------------------------------------------- node_bound
@pytest.mark.parametrize("idx", range(len(CASES)))
def test_node_bound_covers_every_completion_and_alive_is_exact(idx):
    cost, rnd, gamma = CASES[idx]
    k = rnd.num_users
    order = _in_order(rnd)
    env = CostEnvelope(cost, rnd, gamma)
    plans = all_plans(k)
    feasible = check_plans(cost, rnd, plans, gamma).feasible
    served = (plans != 0).sum(axis=1)
    seq = plans[:, order]  # modes in search order
    for level in range(k):
        # the feasible partial plans at this level: prefixes of feasible plans (downward closed)
        prefixes = np.unique(seq[feasible, :level], axis=0) if level else np.zeros((1, 0), dtype=np.int8)
        n = len(prefixes)
        admitted = (prefixes != 0).sum(axis=1).astype(np.int64)
        alive, bound = node_bound(_builder(cost, rnd, gamma, order, prefixes), np.ones((n, k), dtype=bool), admitted, (env, rnd, order, gamma), level)
        assert bound.dtype.kind == "i" and alive.shape == (n, k)
        for r, p in enumerate(prefixes):
            match = feasible & (seq[:, :level] == p).all(axis=1)
            assert bound[r] >= served[match].max(), (level, p)
            # alive: the remaining users that fit this partial plan alone (AD, or SD at depth gamma)
            for c in range(level, k):
                fits = False
                for m in (AD, SD):
                    full = np.zeros(k, dtype=np.int8)
                    full[order[:level]] = p
                    full[order[c]] = m
                    fits |= bool(check_plans(cost, rnd, full, gamma).feasible)
                assert alive[r, c] == fits, (level, p, c)


def test_binding_cases_do_bind():
    """The cases are not vacuous: memory and deadlines leave most rounds short of serving everyone."""
    opts = [brute_optimum(cost, rnd, g) for cost, rnd, g in CASES]
    assert sum(o < rnd.num_users for o, (_, rnd, _) in zip(opts, CASES, strict=True)) >= len(CASES) // 2
    assert min(opts) >= 1


# --------------------------------------------------------------------------- exhaustive search
@pytest.mark.parametrize("idx", range(len(CASES)))
def test_search_equals_brute_force_with_and_without_symmetry(idx):
    cost, rnd, gamma = CASES[idx]
    opt = brute_optimum(cost, rnd, gamma)
    for symmetry in (True, False):
        modes, complete, ub = exhaustive_search(cost, rnd, gamma, symmetry=symmetry)
        assert complete and ub == opt
        assert modes.dtype == np.int8 and set(modes.tolist()) <= {0, AD, SD}
        assert np.count_nonzero(modes) == opt and check_plans(cost, rnd, modes, gamma).feasible


def test_search_on_the_degenerate_rounds():
    """No user: nothing beats any incumbent, complete, bound 0. One servable user: served with
    the default incumbent (0), and the plan's modes are int8 like every plan of ``envs``."""
    nobody = make_round([], [], [], [], [], [])
    assert exhaustive_search(golden(), nobody, 2) == (None, True, 0)
    one = make_round([5], [10], [0.3], [0.9], [0.01], [0.005])
    assert brute_optimum(golden(), one, 2) == 1
    modes, complete, ub = exhaustive_search(golden(), one, 2)
    assert complete and ub == 1 and modes.dtype == np.int8 and np.count_nonzero(modes) == 1
    assert check_plans(golden(), one, modes, 2).feasible
    assert exhaustive_search(golden(), one, 2, incumbent=1) == (None, True, 1)


def test_a_budget_equal_to_the_batch_time_is_enough():
    """The exact check accepts a batch needing exactly the whole share (within ``EPS``): a user
    whose time budget equals its AD batch time (SD does not fit its memory) is served, and the
    root bound says so."""
    cost = golden(memory_bytes=2_100_000.0 + 60_000.0)  # KV budget 60_000 B: AD 50_000 B fits, SD 81_000 B not
    c = float(cost.ad_time(1, 10, 15))
    rnd = make_round([10], [15], [0.01 + 0.005 + c], [0.9], [0.01], [0.005])
    rep = check_plans(cost, rnd, np.array([[AD], [SD]], dtype=np.int8), 2)
    assert rep.feasible.tolist() == [True, False] and abs(float(rep.ad_share_min[0]) - 1.0) < 1e-12
    modes, complete, ub = exhaustive_search(cost, rnd, 2)
    assert modes.tolist() == [AD] and complete and ub == 1
    env = CostEnvelope(cost, rnd, 2)
    _, bound = node_bound(PlanBuilder(cost, 1, 2), np.ones((1, 1), dtype=bool), np.zeros(1, dtype=np.int64), (env, rnd, np.zeros(1, dtype=np.int64), 2), 0)
    assert bound.tolist() == [1]


def test_node_bound_with_nothing_left_and_with_users_it_must_serve():
    """No remaining user alive (``alive`` inherited from the parent): the bound is what the plan
    already serves. A user the search must serve (``must``) that no longer fits: bound -1."""
    cost = golden()
    # user 2's uplink and downlink take more than its deadline: it fits no plan (first in order)
    rnd = make_round([5, 6, 4], [10, 8, 12], [0.3, 0.25, 0.01], [0.9, 0.9, 0.9], [0.01, 0.01, 0.02], [0.005, 0.005, 0.005])
    order = _in_order(rnd)
    assert order[0] == 2
    ctx = (CostEnvelope(cost, rnd, 2), rnd, order, 2)
    root = PlanBuilder(cost, 2, 2)
    no, yes = np.zeros((2, 3), dtype=bool), np.ones((2, 3), dtype=bool)
    admitted = np.array([0, 3], dtype=np.int64)
    alive, bound = node_bound(root, no, admitted, ctx, 0)
    assert bound.tolist() == [0, 3] and not alive.any()
    must = np.array([[True, False, False], [False, False, False]])
    assert node_bound(root, no, admitted, ctx, 0, must=must)[1].tolist() == [-1, 3]
    opt = brute_optimum(cost, rnd, 2)
    alive, bound = node_bound(root, yes, admitted, ctx, 0)
    assert alive[:, 0].tolist() == [False, False] and alive[:, 1:].all()
    assert bound[0] >= opt == 2 and bound[1] >= 3 + opt
    free = node_bound(root, yes, admitted, ctx, 0, must=np.array([[False, True, True], [False, False, True]]))[1]
    assert free.tolist() == bound.tolist()  # users that still fit change nothing
    assert node_bound(root, yes, admitted, ctx, 0, must=np.array([[True, False, False], [False, True, False]]))[1].tolist() == [-1, bound[1]]


# ----------------------------------------------------------------------- symmetry breaking
def _breaks_the_rule(modes, dom, order) -> bool:
    """A served dominator (earlier in ``order``) with a rejected user it dominates in that mode."""
    pos = modes[order]
    for m in (AD, SD):
        p, q = np.nonzero(dom[m])
        if ((pos[p] == m) & (pos[q] == 0)).any():
            return True
    return False


# (cost, round): identical users in both modes' sense; dominance in AD only (iterations differ)
RULE_ROUNDS = {
    "both modes": (golden(), make_round([8, 8, 8, 3], [5, 12, 12, 5], [0.08, 0.3, 0.15, 0.08], [0.9, 0.6, 0.6, 0.9], [0.01, 0.005, 0.005, 0.01], [0.005] * 4)),
    "AD only": (golden(memory_bytes=2_240_000.0), make_round([8, 3, 8, 3], [5, 12, 12, 12], [0.15, 0.08, 0.3, 0.3], [0.95, 0.95, 0.95, 0.5], [0.01] * 4, [0.005] * 4)),
}


@pytest.mark.parametrize("name", sorted(RULE_ROUNDS))
def test_symmetry_breaking_serves_the_dominated_users(name):
    """With symmetry breaking (the default) the plan never rejects a user while a user dominating
    it is served in the matching mode; ``symmetry=False`` is the plain search, whose first largest
    plan (chunks of one node: depth first) does reject one here. Both are optimal."""
    cost, rnd = RULE_ROUNDS[name]
    order = _in_order(rnd)
    env = CostEnvelope(cost, rnd, 2)
    dom = dominance(env, rnd, order)
    assert env.monotone and dom[AD].any() and dom[SD].any() == (name == "both modes")
    opt = brute_optimum(cost, rnd, 2)
    sym, complete, ub = exhaustive_search(cost, rnd, 2, chunk=1)
    assert complete and ub == opt and np.count_nonzero(sym) == opt and not _breaks_the_rule(sym, dom, order)
    plain, complete, ub = exhaustive_search(cost, rnd, 2, chunk=1, symmetry=False)
    assert complete and ub == opt and np.count_nonzero(plain) == opt and _breaks_the_rule(plain, dom, order)
