"""The cost model's alternative modelling choices (envs/model_choices.py) and env=paper_fit."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import CostModel, EnvConfig, check_plans, sample_round
from envs.config import ConfigError
from envs.cost_model import sd_iterations
from envs.model_choices import ModelChoices
from envs.plan_builder import PlanBuilder, ScalarPlan
from envs.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent
PROFILE = load_profile("rtx4090_llama2-7b_tinyllama-1.1b")
DEFAULT = CostModel(PROFILE)
KV_L = 2 * 32 * 32 * 128 * 2  # Llama-2-7B: 2 (K, V) x 32 layers x 32 KV heads x 128 dims x 2 bytes = 512 KiB
KV_S = 2 * 22 * 4 * 64 * 2  # TinyLlama-1.1B: 22 layers, 4 KV heads of 64 dims = 22 KiB
CHOICES = [
    ModelChoices(draft_kv="target"),
    ModelChoices(verify_flops_efficiency=0.3),
    ModelChoices(sd_user_workspace_bytes=3.2e8),
    ModelChoices(sd_overhead_bytes=3.2e8),
]


def test_defaults_unchanged():
    # golden values from the cost model before the choices existed (git HEAD ebb1b5c), exact floats
    for cost in (DEFAULT, CostModel(PROFILE, choices=ModelChoices()), CostModel.from_config(EnvConfig())):
        assert cost.kv_sd == KV_L + KV_S == 546816.0
        assert float(cost.ad_time(1, 500, 256)) == 5.252680062873285
        assert float(cost.sd_time(1, 500, 256, 77, 4)) == 3.1723618414366426
        assert float(cost.sd_time(7, 120, 80, 30, 3)) == 1.2015792946892656
        assert float(cost.ad_time(7, 120, 80)) == 1.7462370333677693
        assert float(cost.sd_memory(7, 120, 80, 300, 3)) == 634853376.0
        assert float(cost.ad_memory(7, 120, 80, 300)) == 597688320.0
        assert float(cost.memory_budget(True)) == 8581220864.0
        assert float(cost.memory_budget(False)) == 10781220864.0
        assert cost.sd_user_extra_tokens == 0.0 and cost.verify_s_per_flop is None
    assert float(CostModel(PROFILE, "padded").sd_memory(7, 120, 80, 300, 3)) == 777025536.0
    assert EnvConfig().model_choices.is_default


def test_draft_kv_target_golden():
    cost = CostModel(PROFILE, choices=ModelChoices(draft_kv="target"))
    assert cost.kv_sd == 2 * KV_L == 1048576.0
    # one user, input 500, output 256, gamma 4: (500 + 4 + 256) tokens x 1 MiB
    assert float(cost.sd_memory(1, 500, 256, 256, 4)) == 760 * 1048576.0
    # AD and time untouched
    assert cost.kv_l == DEFAULT.kv_l
    assert float(cost.sd_time(7, 120, 80, 30, 3)) == float(DEFAULT.sd_time(7, 120, 80, 30, 3))


def test_verify_compute_golden():
    cost = CostModel(PROFILE, choices=ModelChoices(verify_flops_efficiency=0.5))
    # b = 2, S = 100, N = 50, J = 10, gamma = 4: iterations at context c = 100 + 50/2 = 125, verify over c + 4 = 129.
    # Llama-2-7B FLOPs per token: 32 * (4*4096^2 + 4*4096*4096 + 6*4096*11008) + 2*4096*32000 = 13,214,154,752
    # plus attention 32 * 4 * 4096 * 129 = 67,633,152 -> 13,281,787,904; x b (gamma+1) = 10 tokens per iteration.
    flops = 10 * 13_281_787_904
    extra = 10 * flops / (0.5 * 165.2e12)
    got = float(cost.sd_time(2, 100, 50, 10, 4)) - float(DEFAULT.sd_time(2, 100, 50, 10, 4))
    assert got == pytest.approx(extra, rel=1e-12)
    assert float(cost.ad_time(2, 100, 50)) == float(DEFAULT.ad_time(2, 100, 50))  # AD keeps the roofline
    assert float(cost.sd_time(0, 100, 50, 10, 4)) == 0.0  # an empty batch costs nothing


def test_sd_user_workspace_golden():
    w = 3.0e8
    cost = CostModel(PROFILE, choices=ModelChoices(sd_user_workspace_bytes=w))
    # 3 users, input 100, gamma 4, outputs summing to 90: (3 * 104 + 90) KV tokens + 3 workspaces
    assert float(cost.sd_memory(3, 100, 50, 90, 4)) == (3 * 104 + 90) * 546816.0 + 3 * w
    assert float(cost.sd_memory(0, 0, 0, 0, 4)) == 0.0
    assert cost.sd_user_extra_tokens == w / 546816.0
    padded = CostModel(PROFILE, "padded", ModelChoices(sd_user_workspace_bytes=w))
    assert float(padded.sd_memory(3, 100, 50, 90, 4)) == 3 * 154 * 546816.0 + 3 * w
    assert float(cost.memory_budget(True)) == float(DEFAULT.memory_budget(True))


def test_sd_overhead_golden():
    cost = CostModel(PROFILE, choices=ModelChoices(sd_overhead_bytes=3.0e8))
    assert float(cost.memory_budget(True)) == 8581220864.0 - 3.0e8
    assert float(cost.memory_budget(False)) == 10781220864.0  # AD-only never loads the SLM
    assert cost.w_s == PROFILE.slm.weight_bytes + 3.0e8


@pytest.mark.parametrize("choices", CHOICES, ids=lambda c: next(k for k, v in c.__dict__.items() if v != ModelChoices().__dict__[k]))
def test_each_choice_only_makes_sd_dearer(choices):
    cost = CostModel(PROFILE, choices=choices)
    b = np.arange(0, 40)
    for s, n in ((1, 1), (160, 160), (1000, 1000)):
        j = sd_iterations(n, 0.6, 4)
        assert np.all(cost.sd_time(b, s, n, j, 4) >= DEFAULT.sd_time(b, s, n, j, 4))
        assert np.all(cost.sd_memory(b, s, n, b * n, 4) >= DEFAULT.sd_memory(b, s, n, b * n, 4))
        assert np.array_equal(cost.ad_time(b, s, n), DEFAULT.ad_time(b, s, n))
        assert np.array_equal(cost.ad_memory(b, s, n, b * n), DEFAULT.ad_memory(b, s, n, b * n))
    assert cost.memory_budget(True) <= DEFAULT.memory_budget(True)


@settings(max_examples=60, deadline=None)
@given(i=st.integers(0, len(CHOICES) - 1), b=st.integers(0, 80), s=st.integers(1, 2000), n=st.integers(1, 2000), j=st.integers(1, 2000), g=st.integers(1, 8), extra=st.integers(0, 5000))
def test_scalar_path_bit_identical(i, b, s, n, j, g, extra):
    cost = CostModel(PROFILE, choices=CHOICES[i])
    assert cost.sd_time1(b, s, n, j, g) == float(cost.sd_time(b, s, n, j, g))
    sum_out = b * n + extra
    assert cost.sd_memory1(b, s, n, sum_out, g) == float(cost.sd_memory(b, s, n, sum_out, g))
    assert cost.memory_budget1(True) == float(cost.memory_budget(True))


@settings(max_examples=25, deadline=None)
@given(i=st.integers(0, len(CHOICES) - 1), seed=st.integers(0, 10**6))
def test_incremental_masks_match_exact_check(i, seed):
    """The env's incremental builders and the exact check agree under every choice."""
    cfg = EnvConfig(num_users=8)
    cost = CostModel(PROFILE, choices=CHOICES[i])
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, cfg)
    builder, scalar = PlanBuilder(cost, 1, cfg.max_gamma), ScalarPlan(cost, cfg.max_gamma)
    modes, gamma = np.zeros(8, dtype=np.int8), 0
    for k in range(8):
        user = [x[k : k + 1] for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)]
        masks = builder.prepare(*user)[0]
        assert list(masks) == scalar.prepare(*(float(u[0]) if j >= 2 else int(u[0]) for j, u in enumerate(user)))
        for a in range(1, 2 + cfg.max_gamma):
            if a >= 2 and gamma and a - 1 != gamma:
                assert not masks[a]  # the round's depth is fixed by its first SD user
                continue
            trial = modes.copy()
            trial[k] = 1 if a == 1 else 2
            depth = a - 1 if a >= 2 else (gamma or 4)
            assert bool(masks[a]) == bool(check_plans(cost, rnd, trial, depth).feasible)
        action = int(rng.choice(np.flatnonzero(masks)))
        builder.apply(np.array([action]))
        scalar.apply(action)
        if action >= 1:
            modes[k] = 1 if action == 1 else 2
        if action >= 2 and not gamma:
            gamma = action - 1


def test_larger_workspace_can_make_a_plan_infeasible():
    cfg = EnvConfig(num_users=6)
    rnd = sample_round(np.random.default_rng(3), cfg)
    modes = np.full(6, 2, dtype=np.int8)
    huge = CostModel(PROFILE, choices=ModelChoices(sd_user_workspace_bytes=2.0e9))  # 6 x 2 GB > the 8.6 GB left
    assert not check_plans(huge, rnd, modes, 4).feasible


@pytest.mark.parametrize(
    "field,value",
    [("draft_kv", "draft"), ("draft_kv", None), ("verify_flops_efficiency", 0), ("verify_flops_efficiency", 1.5), ("verify_flops_efficiency", float("nan")),
     ("verify_flops_efficiency", True), ("sd_user_workspace_bytes", -1.0), ("sd_user_workspace_bytes", float("inf")), ("sd_overhead_bytes", "1e9"),
     ("sd_overhead_bytes", 2e12)],
)
def test_bad_choices_named(field, value):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        EnvConfig(**{field: value})
    with pytest.raises(ValueError, match=f"'{field}'"):
        ModelChoices(**{field: value})


def test_paper_fit_loads_via_envconfig_and_changes_only_choices():
    from omegaconf import OmegaConf  # YAML 1.2 numbers (PyYAML reads 1.0e6 as a string)

    fit = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper_fit.yaml"))
    paper = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "env" / "paper.yaml"))
    values = {**paper, **{k: v for k, v in fit.items() if k != "defaults"}}
    cfg = EnvConfig.from_kwargs(**values)
    assert not cfg.model_choices.is_default
    changed = {k for k in values if values[k] != paper.get(k)}
    assert changed and changed <= set(ModelChoices.__dataclass_fields__)  # one documented choice, workload untouched


def test_paper_fit_loads_via_hydra_env_group():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        fit = OmegaConf.to_container(compose(config_name="evaluate", overrides=["env=paper_fit"]), resolve=True)
        paper = OmegaConf.to_container(compose(config_name="evaluate"), resolve=True)
    cfg = EnvConfig.from_kwargs(**fit["env"])
    assert not cfg.model_choices.is_default
    assert EnvConfig.from_kwargs(**paper["env"]).model_choices.is_default
    assert CostModel.from_config(cfg).choices == cfg.model_choices


def test_paper_fit_runs_in_the_env_and_the_train_config():
    import gymnasium as gym
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from agents.train import TrainConfig

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        raw = OmegaConf.to_container(compose(config_name="train", overrides=["env=paper_fit"]), resolve=True)
    assert not TrainConfig.from_dict(raw).env.model_choices.is_default
    env = gym.make("EdgeSchedule-v0", num_users=6, draft_kv="target")
    env.reset(seed=0)
    assert env.unwrapped.cost.kv_sd == 2 * KV_L
    for _ in range(6):
        mask = env.unwrapped.action_masks()
        env.step(int(np.flatnonzero(mask)[-1]))


@pytest.mark.parametrize("choices", [ModelChoices(), *CHOICES])
def test_sd_time_is_prefills_plus_iterations(choices):
    """``sd_iteration_time`` is the one place an SD iteration is priced (bounds may reuse it)."""
    cost = CostModel(PROFILE, choices=choices)
    b, s, n, j, g = 5, 300, 120, 40, 4
    prefill = float(PROFILE.tau_llm.tau(b, s, s) + PROFILE.tau_slm.tau(b, s, s))
    assert float(cost.sd_time(b, s, n, j, g)) == prefill + j * float(cost.sd_iteration_time(b, s + n / 2, g))
