"""Per-user completion (envs.split_outcome, envs.split_plan): a hand-derived case, own <= batch, the switches, the v1 env."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan import ED, REJECT, Plan
from envs.profile import load_profile
from envs.split_cost import SplitCostModel
from envs.split_outcome import ed_own_latency, evaluate_split_plan
from envs.split_plan import check_plan_split, ed_users
from envs.workload import Round, sample_round

PROFILE = "split_a100-40gb_llama2-7b_tinyllama-1.1b"
G = 4


class LinearTau:
    """A toy pass time ``0.1 b + 0.01 q`` seconds (context ignored): easy to price by hand."""

    def tau1(self, b, q, c):
        return 0.1 * b + 0.01 * q


def test_hand_derived_two_users():
    cost = SimpleNamespace(tau_l=LinearTau())
    # b = 2, S = 10, N = 20, q = 3: prefill pass tau(2, 10, 10) = 0.3 s, verify pass tau(2, 3, 23) = 0.23 s;
    # share 0.5, uplink 0.05 s; user 0: J = 4, P = 0.2, X = 0.3; user 1: J = 2, P = 0.1, X = 0.5
    got = ed_own_latency(cost, 2, 10, 20, 3, np.array([4, 2]), 0.05, np.array([0.2, 0.1]), np.array([0.3, 0.5]), 0.5)
    # user 0: 0.05 + (0.3 + 4 * 0.23) / 0.5 + 0.2 + 4 * 0.3 = 0.05 + 2.44 + 0.2 + 1.2
    # user 1: 0.05 + (0.3 + 2 * 0.23) / 0.5 + 0.1 + 2 * 0.5 = 0.05 + 1.52 + 0.1 + 1.0
    assert got == pytest.approx([3.89, 2.67], abs=1e-12)
    # the batch's end (J = 4, P_E = 0.2, X_E = 0.5) is 0.05 + 2.44 + 0.2 + 2.0 = 4.69: both end earlier
    assert (got < 4.69).all()


def test_no_share_never_ends_and_bad_arguments_fail():
    cost = SimpleNamespace(tau_l=LinearTau())
    got = ed_own_latency(cost, 1, 10, 20, 3, np.array([2]), 0.0, np.array([0.1]), np.array([0.2]), 0.0)
    assert np.isinf(got).all()
    with pytest.raises(ValueError, match="b \\(ED batch size\\)"):
        ed_own_latency(cost, 0, 10, 20, 3, np.array([], dtype=int), 0.0, np.array([]), np.array([]), 0.5)


@pytest.fixture(scope="module")
def models():
    p = load_profile(PROFILE)
    return CostModel(p), SplitCostModel(p)


def ed_plan(cost, split, rnd, depth_seed: int):
    """Every user with an edge in ED at a random allowed depth (others rejected), with the check's shares."""
    users = ed_users(split, rnd, G)
    rng = np.random.default_rng(depth_seed)
    modes = np.full(rnd.num_users, REJECT, dtype=np.int8)
    depth = np.zeros(rnd.num_users, dtype=np.int64)
    for k in range(rnd.num_users):
        ok = np.flatnonzero(users.allowed[k])
        if ok.size:
            modes[k], depth[k] = ED, int(rng.choice(ok)) + 1
    rep = check_plan_split(cost, users, rnd, modes, 1, depth)
    return Plan(modes, gamma=1, z=rep.z, lam=rep.lam, ed_depth=depth, ed_share=rep.ed_share), users


@pytest.mark.parametrize("seed", range(12))
def test_own_is_at_most_batch_for_every_ed_user(models, seed):
    cost, split = models
    cfg = EnvConfig(num_users=8, profile=PROFILE, edge_fraction=0.8, rtt_ms=[5.0, 40.0], max_gamma=G, deadline_s=[0.5, 8.0])
    rnd = sample_round(np.random.default_rng(seed), cfg)
    plan, users = ed_plan(cost, split, rnd, seed)
    ed = plan.modes == ED
    if not ed.any() or plan.ed_share <= 0:
        pytest.skip("no ED user in this round")
    batch = evaluate_split_plan(cost, split, rnd, plan)
    own = evaluate_split_plan(cost, split, rnd, plan, ed_completion="own")
    assert np.all(own.latency_s[ed] <= batch.latency_s[ed])
    assert np.all(own.served[ed] >= batch.served[ed])  # ending earlier never loses a user
    np.testing.assert_array_equal(own.latency_s[~ed], batch.latency_s[~ed])  # only ED users change
    # the batch's end is the latest own end exactly when one user has the most iterations, the slowest
    # prefill and the slowest edge iteration; in general it is at least it
    assert own.latency_s[ed].max() <= batch.latency_s[ed][0]
    col = plan.ed_depth[ed] - 1
    it, x, p = users.iterations[ed, col], users.edge_s[ed, col], users.prefill_s[ed]
    slowest = (it == it.max()) & (x == x.max()) & (p == p.max())
    if slowest.any():
        assert own.latency_s[ed][slowest] == pytest.approx(batch.latency_s[ed][0], rel=0, abs=0)


def test_batch_is_the_default_and_a_bad_switch_fails(models):
    cost, split = models
    cfg = EnvConfig(num_users=6, profile=PROFILE, edge_fraction=1.0, rtt_ms=[5.0, 40.0], max_gamma=G, deadline_s=[2.0, 8.0])
    rnd = sample_round(np.random.default_rng(3), cfg)
    plan, _ = ed_plan(cost, split, rnd, 3)
    default = evaluate_split_plan(cost, split, rnd, plan)
    batch = evaluate_split_plan(cost, split, rnd, plan, ed_completion="batch")
    np.testing.assert_array_equal(default.latency_s, batch.latency_s)
    ed_lat = batch.latency_s[plan.modes == ED]
    assert np.all(ed_lat == ed_lat[0])  # batch: every ED user ends together
    with pytest.raises(ValueError, match="ed_completion"):
        evaluate_split_plan(cost, split, rnd, plan, ed_completion="token")


def _greedy_episode(completion: str, seed: int) -> tuple[dict, Round]:
    """One EdgeSchedule-v1 episode (prediction error on) admitting each user to the highest valid
    action (ED at the deepest depth first, then SD, AD), with the given completion: its final info and round."""
    import gymnasium as gym

    import envs  # noqa: F401 - registers the environments

    env = gym.make("EdgeSchedule-v1", num_users=8, profile=PROFILE, edge_fraction=0.5, max_gamma=G, deadline_s=[0.5, 8.0], output_cv=0.5,
                   alpha_cv=0.2, completion=completion).unwrapped
    env.reset(seed=seed)
    done, info = False, {}
    while not done:
        _, _, done, _, info = env.step(int(np.flatnonzero(env.action_masks())[-1]))
    return info, env.round


def test_v1_env_completion_own_ends_every_mode_at_its_own_last_token():
    """``completion="own"`` in EdgeSchedule-v1: the same rounds and actions serve at least as many as
    ``batch`` (every user ends no later) and exactly what evaluate_split_plan serves with ED, AD and
    SD users all ending at their own last token -- not only AD/SD (some rounds tell the two apart)."""
    cost, split = CostModel(load_profile(PROFILE)), SplitCostModel(load_profile(PROFILE))
    more = ed_matters = 0
    for seed in range(12):
        batch, _ = _greedy_episode("batch", seed)
        own, rnd = _greedy_episode("own", seed)
        np.testing.assert_array_equal(own["modes"], batch["modes"])  # completion never changes the plan
        assert own["served"] >= batch["served"], seed
        plan = Plan(own["modes"], gamma=max(int(own["gamma"]), 1), z=own["z"], lam=own["lam"],
                    ed_depth=own["ed_depth"] if (own["modes"] == ED).any() else None, ed_share=own["ed_share"])
        assert own["served"] == evaluate_split_plan(cost, split, rnd, plan, completion="own", ed_completion="own").served_count, seed
        more += own["served"] > batch["served"]
        ed_matters += own["served"] != evaluate_split_plan(cost, split, rnd, plan, completion="own").served_count
    assert more >= 3 and ed_matters >= 1
