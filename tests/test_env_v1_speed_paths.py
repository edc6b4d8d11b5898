"""EdgeSchedule-v1's speed paths (issue #13) change no value: each equals, bit for bit, what it replaced.

* ``envs.scalar_times.ad_time_of`` / ``sd_parts_of`` / ``sd_parts_all_of`` (the memo misses' pricing)
  equal ``CostModel.ad_time1`` / ``sd_parts1`` / ``sd_parts_all1`` (also while the latency model's
  decode-sum table grows), and hand back the method for a model they do not cover;
* ``SplitScalarPlan``'s memos (times by their exact arguments, passes by what they depend on) keep
  every float: a plan reused over many rounds answers as a fresh one;
* ``envs.split_plan.ed_users_arrays`` equals its previous form (kept below as the reference: the
  proactive prefix masked, both ``np.where`` always taken);
* ``envs.split_builder.ed_rows`` from the edge users' constants alone equals the rows from every
  user's (as the env built them before);
* ``envs.split_outcome.served_from_aggregates`` (the terminal step) equals
  ``evaluate_split_plan(...).served_count`` on plans built by ``SplitScalarPlan``, and declines (None)
  where it does not apply;
* ``envs.v1_user_features.user_feature_table`` with acceptance at 1 equals v0's user features.

``tests/test_env_v1_golden.py`` pins whole trajectories; these pin the pieces on wider inputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.edge_schedule import user_features
from envs.edge_schedule_v1 import EdgeScheduleV1Env, round_features
from envs.model_choices import ModelChoices
from envs.plan import AD, ED, SD, Plan
from envs.profile import load_profile
from envs.scalar_times import ad_time_of, sd_parts_all_of, sd_parts_of
from envs.split_builder import SplitScalarPlan, ed_rows
from envs.split_cost import SplitCostModel, SplitOptions
from envs.split_outcome import evaluate_split_plan, served_from_aggregates
from envs.split_plan import EdUsers, ed_users, ed_users_arrays, shares_split
from envs.workload import sample_round

SPLIT = "split_a100-40gb_llama2-7b_tinyllama-1.1b"
TABLE = "split_cpu_specsched-pair"  #: measured tables with an engine overhead


def _models() -> list[tuple[str, CostModel]]:
    roofline, table = load_profile(SPLIT), load_profile(TABLE)
    return [
        ("roofline", CostModel(roofline)),
        ("roofline padded, draft KV at the target's size", CostModel(roofline, "padded", ModelChoices(draft_kv="target"))),
        ("roofline, verify compute not overlapped", CostModel(roofline, choices=ModelChoices(verify_flops_efficiency=0.5))),
        ("table with engine overhead", CostModel(table)),
        ("table without engine overhead", CostModel(dataclasses.replace(table, engine=None))),
    ]


@pytest.mark.parametrize("name,cost", _models(), ids=[n for n, _ in _models()])
def test_memo_miss_pricing_equals_the_cost_model(name, cost):
    sd_prefills: dict = {}  # shared by the SD forms, as the plan shares it
    ad, sd, sd_all = ad_time_of(cost, {}, {}), sd_parts_of(cost, sd_prefills, {}), sd_parts_all_of(cost, sd_prefills)  # memos fill as (b, S) repeat
    if cost.engine is not None:
        assert ad == cost.ad_time1 and sd == cost.sd_parts1 and sd_all == cost.sd_parts_all1  # optional terms: the methods themselves
    if cost.verify_s_per_flop is not None:
        assert sd == cost.sd_parts1 and sd_all == cost.sd_parts_all1
    rng = np.random.default_rng(3)
    points = [(1, 1, 1), (1, 0, 0), (2, 1, 2)] + [tuple(int(v) for v in rng.integers(1, (8, 64, 2048))) for _ in range(600)]
    for b, s, n in points:
        assert ad(b, s, n) == cost.ad_time1(b, s, n)
        for g in (1, 4, 8):
            assert sd(b, s, n, g) == cost.sd_parts1(b, s, n, g)
        assert sd_all(b, s, n, 8) == cost.sd_parts_all1(b, s, n, 8)


def test_sd_parts_are_inlined_only_for_the_plain_cost_model():
    """``CostModel.sd_parts_are_plain``: the scalar path inlines SD's parts only for the base
    class's own methods without optional terms; an override or an engine section keeps the method."""
    table = load_profile(TABLE)
    plain = CostModel(dataclasses.replace(table, engine=None))
    assert plain.sd_parts_are_plain() and sd_parts_of(plain, {}, {}) != plain.sd_parts1
    assert not CostModel(table).sd_parts_are_plain()  # an engine section

    class Slower(CostModel):
        def _sd_iterations1(self, b, gammas, c, draft_step_s):
            return [2 * t for t in super()._sd_iterations1(b, gammas, c, draft_step_s)]

    slower = Slower(dataclasses.replace(table, engine=None))
    assert not slower.sd_parts_are_plain()
    assert sd_parts_all_of(slower, {}) == slower.sd_parts_all1 and sd_parts_of(slower, {}, {}) == slower.sd_parts1


def test_ad_time_decode_sums_survive_a_growing_table():
    """ad_time_of remembers the decode sums' table entries; the latency model grows its table when a
    longer context comes (rebuilt, geometrically): the remembered entries stay the new table's."""
    for name in (SPLIT, TABLE):
        p = load_profile(name)
        fresh = dataclasses.replace(p, tau_llm=dataclasses.replace(p.tau_llm), engine=None)  # a latency model with no table yet
        cost = CostModel(fresh)
        ad = ad_time_of(cost, {}, {})
        rng = np.random.default_rng(6)
        for top in (100, 1000, 3000, 9000, 200):  # contexts up to `top`: the table grows twice on the way
            for b, s, n in rng.integers(1, (6, 40, top), size=(150, 3)).tolist():
                assert ad(b, s, n) == cost.ad_time1(b, s, n), (name, b, s, n)
        assert cost.tau_l._prefix.shape[1] > 8192


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_split_plan_memos_keep_every_float(kv):
    """A SplitScalarPlan reused over many rounds (its memos warm, passes shared between batches of one
    mean context) gives, round by round, what a fresh plan gives (memos cold): masks, shares, KV."""
    cfg = EnvConfig(num_users=40, profile=SPLIT, edge_fraction=0.6, rtt_ms=[5.0, 60.0], kv_memory=kv, input_tokens=[1, 60], output_tokens=[1, 60])
    cost, split = CostModel.from_config(cfg), SplitCostModel(load_profile(SPLIT))
    reused = SplitScalarPlan(cost, cfg.max_gamma)
    rng = np.random.default_rng(9)
    for _ in range(25):
        rnd = sample_round(rng, cfg)
        rows = ed_rows(split, rnd, cfg.max_gamma)
        users = list(zip(rnd.input_tokens.tolist(), rnd.output_tokens.tolist(), rnd.alpha.tolist(), rnd.uplink_s.tolist(), rnd.slack_s.tolist(),
                         rnd.deadline_s.tolist(), rows, strict=True))
        picks = rng.integers(0, 1000, size=rnd.num_users).tolist()
        traces = []
        for plan in (reused, SplitScalarPlan(cost, cfg.max_gamma)):
            plan.reset()
            trace = []
            for user, pick in zip(users, picks, strict=True):
                masks = plan.prepare(*user)
                ok = [i for i, m in enumerate(masks) if m]
                plan.apply(ok[pick % len(ok)])
                trace.append((tuple(masks), tuple(plan.share), tuple(plan.mem), tuple(plan.ed), plan.j_max, plan.gamma))
            traces.append(trace)
        assert traces[0] == traces[1]


def _ed_users_before(split: SplitCostModel, input_tokens, output_tokens, alpha, has_edge, rtt_s, g_max: int) -> EdUsers:
    """``ed_users_arrays`` as it was before issue #13's reset work (the reference)."""
    k = len(input_tokens)
    inp, out = input_tokens.astype(float), output_tokens.astype(float)
    alpha, has, rtt, net = np.asarray(alpha, dtype=float), np.asarray(has_edge, dtype=bool), np.asarray(rtt_s, dtype=float), split.net
    g = np.arange(1, g_max + 1, dtype=float)[None, :]
    g1 = g + 1.0
    net_row = (2.0 * float(net.request_overhead_bytes) + g1 * (float(net.bytes_per_draft_token) + float(net.bytes_per_reply_token))) / float(net.bandwidth_bytes_per_s)
    depth_idx = np.arange(g_max)
    prefix = (depth_idx[None, :] <= depth_idx[:, None])[None]
    c = inp + out / 2.0
    first = np.maximum(inp, 1.0)
    kg = k * g_max
    q_all, c_all = np.ones(kg + k), np.empty(kg + k)
    q_all[kg:] = first
    np.add(c[:, None], g, out=c_all[:kg].reshape(k, g_max))
    c_all[kg:] = first
    both = split.tau_e.tau(1.0, q_all, c_all)
    step, prefill = both[:kg].reshape(k, g_max), both[kg:]
    cum = np.cumsum(step, axis=1)
    near = alpha > 1.0 - 1e-9
    safe = np.where(near, 0.5, alpha)[:, None]
    tokens = np.where(near[:, None], g1, (1.0 - safe ** g1) / (1.0 - safe))
    iterations = np.ceil(out[:, None] / tokens - 1e-9).astype(np.int64)
    network = rtt[:, None] + net_row
    wait = network + split.tau_l.tau(1.0, g1, c[:, None] + g1)
    if split.options.proactive and split.options.interrupt == "step":
        h = ((cum[:, None, :] <= wait[:, :, None]) & prefix).sum(axis=2)
        delay = np.where(h <= depth_idx[None, :], cum[np.arange(k)[:, None], np.minimum(h, g_max - 1)] - wait, 0.0)
        edge = cum + delay + network
    else:
        edge = cum + network
    prof = split.profile
    room = prof.edge.device.memory_bytes - prof.edge.device.reserve_bytes - prof.slm.weight_bytes
    fits_edge = (inp + out)[:, None] + g + 1.0 <= room / split.kv_s
    return EdUsers(tokens, iterations, edge, has[:, None] & fits_edge, prefill)


@pytest.mark.parametrize("options", [{}, {"proactive": False}, {"interrupt": "immediate"}])
@pytest.mark.parametrize("profile", [SPLIT, TABLE])
def test_ed_users_equal_the_previous_form(options, profile):
    split = SplitCostModel(load_profile(profile), SplitOptions(**options))
    rng = np.random.default_rng(11)
    for g_max in (1, 3, 8, 9, 16):
        for alpha in ((0.6, 0.95), (0.9, 1.0)):
            cfg = EnvConfig(num_users=37, profile=profile, edge_fraction=0.6, rtt_ms=[2.0, 150.0], max_gamma=g_max, alpha=list(alpha),
                            input_tokens=[1, 4000], output_tokens=[1, 4000])
            rnd = sample_round(rng, cfg)
            if alpha[1] == 1.0:
                rnd.alpha[::4] = 1.0  # acceptance at 1: the np.where path
            new, old = ed_users(split, rnd, g_max), _ed_users_before(split, rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.has_edge, rnd.rtt_s, g_max)
            for f in dataclasses.fields(EdUsers):
                a, b = getattr(new, f.name), getattr(old, f.name)
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), (g_max, alpha, f.name)
            # and the arrays form of several rounds' users concatenated, as the vector env calls it
            both = ed_users_arrays(split, np.tile(rnd.input_tokens, 2), np.tile(rnd.output_tokens, 2), np.tile(rnd.alpha, 2), np.tile(rnd.has_edge, 2),
                                   np.tile(rnd.rtt_s, 2), g_max)
            assert np.array_equal(both.edge_s[:37], old.edge_s) and np.array_equal(both.edge_s[37:], old.edge_s)


def test_ed_rows_from_the_edge_users_alone_equal_every_users():
    split = SplitCostModel(load_profile(SPLIT))
    rng = np.random.default_rng(5)
    unfit = 0
    for g_max in (4, 8):
        # inputs up to 2^20 tokens: some edges fit no depth (a user with an edge but no ED row)
        cfg = EnvConfig(num_users=40, profile=SPLIT, edge_fraction=0.5, rtt_ms=[5.0, 80.0], max_gamma=g_max, input_tokens=[1, 1 << 20])
        for i in range(10):
            rnd = sample_round(rng, cfg)
            if i == 8:
                rnd.has_edge[:] = True  # everyone has an edge (nothing gathered)
            if i == 9:
                rnd.rtt_s = None  # the network section's RTT for everyone
            users = ed_users(split, rnd, g_max)
            ref = [(users.iterations[k].tolist(), users.edge_s[k].tolist(), users.allowed[k].tolist(), float(users.prefill_s[k]))
                   if users.allowed[k].any() else None for k in range(rnd.num_users)]
            assert ed_rows(split, rnd, g_max) == ref and ed_rows(split, rnd, g_max, users) == ref
            unfit += int((rnd.has_edge & ~users.allowed.any(axis=1)).sum())
    assert unfit > 0


def _play(cfg: EnvConfig, cost: CostModel, split: SplitCostModel, rnd, rng) -> tuple[SplitScalarPlan, np.ndarray, np.ndarray]:
    """A SplitScalarPlan built over ``rnd`` by a random masked policy that favours admitting."""
    users = ed_users(split, rnd, cfg.max_gamma)
    plan = SplitScalarPlan(cost, cfg.max_gamma)
    modes, depth = np.zeros(rnd.num_users, dtype=np.int8), np.zeros(rnd.num_users, dtype=np.int64)
    g = cfg.max_gamma
    for t in range(rnd.num_users):
        ed = (users.iterations[t].tolist(), users.edge_s[t].tolist(), users.allowed[t].tolist(), float(users.prefill_s[t])) if users.allowed[t].any() else None
        masks = plan.prepare(int(rnd.input_tokens[t]), int(rnd.output_tokens[t]), float(rnd.alpha[t]), float(rnd.uplink_s[t]), float(rnd.slack_s[t]),
                             float(rnd.deadline_s[t]), ed)
        allowed = np.flatnonzero(masks)
        a = int(allowed[-1] if rng.random() < 0.3 else rng.choice(allowed))
        assert plan.apply(a)
        if a >= 1:
            modes[t], depth[t] = (AD, 0) if a == 1 else ((SD, 0) if a <= 1 + g else (ED, a - 1 - g))
    return plan, modes, depth


@pytest.mark.parametrize("kwargs", [{}, {"kv_memory": "padded"}, {"max_gamma": 3, "deadline_s": [0.2, 3.0]}, {"edge_fraction": 1.0, "num_users": 60}])
def test_served_from_aggregates_equals_evaluate(kwargs):
    cfg = EnvConfig(**{"num_users": 30, "profile": SPLIT, "edge_fraction": 0.5, "rtt_ms": [5.0, 60.0], **kwargs})
    cost, split = CostModel.from_config(cfg), SplitCostModel(load_profile(SPLIT))
    rng = np.random.default_rng(21)
    seen_ed = seen_late = 0
    for _ in range(40):
        rnd = sample_round(rng, cfg)
        plan, modes, depth = _play(cfg, cost, split, rnd, rng)
        z, ed_share, lam = shares_split(*plan.share, *plan.mem, *plan.b)
        n_ed = int((modes == ED).sum())
        evaluated = Plan(modes, gamma=max(plan.gamma, 1), z=z, lam=lam, ed_depth=depth if n_ed else None, ed_share=ed_share)
        latency = evaluate_split_plan(cost, split, rnd, evaluated, users=ed_users(split, rnd, cfg.max_gamma)).latency_s
        # the given deadlines, then each admitted user's own latency just above or just below (its deadline's
        # 1e-9 tolerance either side): a latency off by more than that changes the count
        just = np.where(np.arange(rnd.num_users) % 2, 1 + 5e-10, 1 - 5e-9)
        for deadline in (rnd.deadline_s, np.where(modes > 0, latency * just, rnd.deadline_s)):
            r = dataclasses.replace(rnd, deadline_s=deadline)
            got = served_from_aggregates(cost, r, modes, plan.gamma, z, ed_share, plan.b, plan.s_max, plan.n_max, plan.u_max, plan.ed)
            out = evaluate_split_plan(cost, split, r, evaluated, users=ed_users(split, rnd, cfg.max_gamma))
            if n_ed == 0:
                assert got is None  # evaluate_plan's arithmetic: not this function's
                continue
            seen_ed += 1
            seen_late += out.served_count < int((modes > 0).sum())
            assert got == out.served_count
        # realised outputs that differ from the predictions: the aggregates are not evaluate's numbers
        r = dataclasses.replace(rnd, realized_output_tokens=rnd.output_tokens + 1)
        assert served_from_aggregates(cost, r, modes, plan.gamma, z, ed_share, plan.b, plan.s_max, plan.n_max, plan.u_max, plan.ed) is None
    assert seen_ed > 20 and seen_late > 5


def test_scalar_env_final_info_equals_the_evaluated_one():
    """The terminal step's info (served from the aggregates) equals final_info evaluating the plan."""
    from envs.edge_schedule_v1 import final_info

    env = EdgeScheduleV1Env(num_users=20, edge_fraction=0.7, user_order="slack")
    rng = np.random.default_rng(4)
    for seed in range(30):
        env.reset(seed=seed)
        terminated = False
        while not terminated:
            _, _, terminated, _, info = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        p = env._plan  # the episode's plan, modes and depths as the last step left them
        ref = final_info(env.cfg, env.cost, env.split, env.round, env._order, env._modes, env._depth, p.gamma, shares_split(*p.share, *p.mem, *p.b), None,
                         env._ed)
        assert info.keys() >= ref.keys()
        for k, v in ref.items():
            assert np.array_equal(info[k], v) if isinstance(v, np.ndarray) else info[k] == v, k


def test_user_features_with_acceptance_at_one_equal_v0s():
    cfg = EnvConfig.from_kwargs(num_users=30, alpha=(0.5, 1.0), edge_fraction=0.5, profile=SPLIT)
    rng = np.random.default_rng(8)
    for i in range(6):
        rnd = sample_round(rng, cfg)
        if i % 2:
            rnd.alpha[::3] = 1.0
        order = rnd.order(cfg.user_order)
        assert np.array_equal(round_features(rnd, order, cfg)[:, :8], user_features(rnd, order, cfg))
