"""The module boundaries: named accessors instead of private tuples, layering, no import circles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan_builder import PlanBuilder, ScalarPlan
from envs.workload import sample_round

CFG = EnvConfig(num_users=8)
COST = CostModel.from_config(CFG)


def _user_args(rnd, k, n=1):
    return tuple(np.full(n, v) for v in (rnd.input_tokens[k], rnd.output_tokens[k], rnd.alpha[k], rnd.uplink_s[k], rnd.slack_s[k]))


@pytest.mark.parametrize("seed", range(5))
def test_candidate_accessors_match_what_apply_commits(seed):
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    builder, scalar = PlanBuilder(COST, 1, CFG.max_gamma), ScalarPlan(COST, CFG.max_gamma)
    for k in range(rnd.num_users):
        assert not builder.is_prepared and not scalar.is_prepared
        masks = builder.prepare(*_user_args(rnd, k))
        scalar.prepare(int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k]))
        assert builder.is_prepared and scalar.is_prepared
        share_a, share_s = builder.candidate_shares()
        mem_a, mem_s = builder.candidate_memory()
        assert share_s.shape == mem_s.shape == (1, CFG.max_gamma)
        assert scalar.candidate_ad_share() == share_a[0]
        allowed = np.flatnonzero(masks[0])
        action = int(rng.choice(allowed))
        builder.apply(np.array([action]))
        scalar.apply(action)
        if action == 1:
            assert builder.share[0][0] == share_a[0] and builder.mem[0][0] == mem_a[0]
        elif action >= 2:
            assert builder.share[1][0] == share_s[0, action - 2] and builder.mem[1][0] == mem_s[0, action - 2]
    with pytest.raises(RuntimeError, match="prepare"):
        builder.candidate_memory()
    with pytest.raises(RuntimeError, match="prepare"):
        scalar.candidate_ad_share()


# ---------------------------------------------------------------- schedulers take (cost, max_gamma)
def test_every_scheduler_builds_from_cost_and_max_gamma():
    from agents.registry import SCHEDULERS, make_scheduler
    from envs.plan import DEFAULT_DRAFT_DEPTH

    rnd = sample_round(np.random.default_rng(0), CFG)
    for name in SCHEDULERS:
        if name in ("exhaustive", "optimal", "optimal_v1"):
            continue  # searches: covered by tests/test_schedulers.py, too slow to run for every seed here
        sched = make_scheduler(name, COST, CFG.max_gamma, seed=0)
        assert sched.max_gamma == CFG.max_gamma and sched.gamma == DEFAULT_DRAFT_DEPTH
        assert not hasattr(sched, "cfg")
        plan = sched.plan(rnd)
        assert 1 <= plan.gamma <= CFG.max_gamma
    assert make_scheduler("balance", COST, 2, draft_depth=2).gamma == 2


@pytest.mark.parametrize("max_gamma", [0, -1, 2.5, True, CFG])
def test_scheduler_refuses_a_bad_max_gamma(max_gamma):
    from agents.balance import Balance

    with pytest.raises(ValueError, match="max_gamma must be an integer >= 1"):
        Balance(COST, max_gamma)


@pytest.mark.parametrize("depth", [0, 9, 2.0, None, True])
def test_scheduler_refuses_a_bad_draft_depth(depth):
    from agents.balance import Balance

    with pytest.raises(ValueError, match=r"draft_depth must be an integer in \[1, max_gamma=8\]"):
        Balance(COST, 8, draft_depth=depth)


# ---------------------------------------------------------------- the draft-depth config key
def test_draft_depth_resolves_in_one_place():
    from envs.config import ConfigError, resolve_draft_depth
    from envs.plan import DEFAULT_DRAFT_DEPTH, Plan

    assert resolve_draft_depth(None, 8, "x") == DEFAULT_DRAFT_DEPTH == Plan(np.zeros(1)).gamma
    assert resolve_draft_depth(None, 2, "x") == 2  # the default never exceeds the largest depth
    assert resolve_draft_depth(3, 8, "x") == 3
    for bad in (0, 9, 2.5, "4", True):
        with pytest.raises(ConfigError, match=r"x config 'draft_depth' must be null \(= 4\) or an integer in \[1, max_gamma=8\]"):
            resolve_draft_depth(bad, 8, "x")


def test_the_old_gamma_key_is_refused_with_the_new_name():
    from agents.evaluate import run
    from agents.train import TrainConfig, TrainConfigError
    from envs.config import ConfigError, refuse_renamed_overrides

    with pytest.raises(ConfigError, match="evaluate config key 'gamma' was renamed to 'draft_depth'"):
        run({"env": {"num_users": 4}, "schedulers": ["balance"], "rounds": 1, "seed": 0, "gamma": 4})
    with pytest.raises(TrainConfigError, match="'gamma' was renamed to 'draft_depth'"):
        TrainConfig.from_dict({"env": {}, "agent": {}, "eval": {}, "logger": {}, "gamma": 4})
    for arg in ("gamma=5", "+gamma=5", "++gamma=5"):
        with pytest.raises(ConfigError, match="draft_depth"):
            refuse_renamed_overrides(["env.num_users=4", arg], "serve")
    refuse_renamed_overrides(["agent.gamma=0.9", "draft_depth=3", "env.max_gamma=4"], "train")  # not the old key


def test_serve_config_refuses_gamma_and_resolves_draft_depth():
    from runtime.serve import config_from_hydra
    from runtime.serve_config import ServeConfig

    with pytest.raises(ValueError, match="'gamma' was renamed to 'draft_depth'"):
        config_from_hydra({"scheduler": "balance", "gamma": 4})
    assert ServeConfig(profile="cpu_specsched-pair").validate().draft_depth == 4
    with pytest.raises(ValueError, match="serve config 'draft_depth'"):
        ServeConfig(profile="cpu_specsched-pair", draft_depth=0).validate()


def test_evaluate_command_line_refuses_gamma():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "agents.evaluate", "gamma=4", "rounds=1"], capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "draft_depth" in res.stderr


# ---------------------------------------------------------------- rounds from measured requests
def test_round_from_requests_matches_from_arrays_given_the_same_link_times():
    from envs.workload import Round

    cfg = EnvConfig(num_users=3)
    ref = Round.from_arrays(cfg, [5, 60, 7], [9, 3, 40], [1.0, 2.0, 0.5], [0.7, 0.8, 0.95], [10.0, 100.0, 200.0])
    rnd = Round.from_requests([5, 60, 7], [9, 3, 40], [1.0, 2.0, 0.5], [0.7, 0.8, 0.95], ref.uplink_s, ref.downlink_s)
    for name in ("input_tokens", "output_tokens", "deadline_s", "alpha", "uplink_s", "downlink_s", "realized_output_tokens", "realized_alpha", "realized_downlink_s", "slack_s"):
        assert np.array_equal(getattr(rnd, name), getattr(ref, name)), name
    assert np.isnan(rnd.distance_m).all() and rnd.has_edge is None
    zero = Round.from_requests([5], [9], [1.0], [0.7], 0.0, 0.0)  # one value for all requests
    assert zero.uplink_s.tolist() == [0.0] and zero.slack_s.tolist() == [1.0]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("input_tokens", [0, 3], r"input_tokens must be integers >= 1, got 0 \(request 0\)"),
    ("input_tokens", [1.5, 3], "input_tokens must be integers >= 1"),
    ("input_tokens", [], "input_tokens must be a 1-D array of at least one request"),
    ("input_tokens", 4, "input_tokens must be a 1-D array of at least one request"),
    ("output_tokens", [3], r"output_tokens must hold one value per request \(2, as input_tokens\)"),
    ("output_tokens", [3, -1], r"output_tokens must be integers >= 1, got -1 \(request 1\)"),
    ("deadline_s", [1.0, 0.0], r"deadline_s must be finite seconds > 0, got 0.0 \(request 1\)"),
    ("deadline_s", [np.inf, 1.0], "deadline_s must be finite seconds > 0"),
    ("alpha", [0.5, 1.2], r"alpha must be in \[0, 1\], got 1.2"),
    ("alpha", ["x", "y"], r"alpha must be in \[0, 1\]"),
    ("uplink_s", -0.1, "uplink_s must be finite seconds >= 0"),
    ("uplink_s", [0.0, 0.0, 0.0], r"uplink_s must hold one value per request \(2"),
    ("downlink_s", [0.0, np.nan], "downlink_s must be finite seconds >= 0"),
])
def test_round_from_requests_names_the_bad_field(field, value, message):
    from envs.workload import Round

    args = {"input_tokens": [5, 6], "output_tokens": [7, 8], "deadline_s": [1.0, 2.0], "alpha": [0.7, 0.8], "uplink_s": 0.0, "downlink_s": [0.0, 0.01]}
    with pytest.raises(ValueError, match=message):
        Round.from_requests(**{**args, field: value})


# ---------------------------------------------------------------- profiles: a name or a path, loaded once
def test_profile_by_name_and_by_path_is_the_same_cached_object():
    from envs.profile import PROFILE_DIR, load_profile, profile_path

    by_name = load_profile("cpu_specsched-pair")
    path = PROFILE_DIR / "cpu_specsched-pair.yaml"
    assert profile_path("cpu_specsched-pair") == path and profile_path(path) == path
    assert load_profile(path) is by_name and load_profile(str(path)) is by_name and load_profile("cpu_specsched-pair") is by_name
    assert by_name.name == "cpu_specsched-pair"


def test_an_edited_profile_file_is_read_again(tmp_path):
    import os

    from envs.profile import PROFILE_DIR, load_profile

    path = tmp_path / "mine.yaml"
    text = (PROFILE_DIR / "rtx4090_llama2-7b_tinyllama-1.1b.yaml").read_text()
    path.write_text(text)
    first = load_profile(path)
    assert load_profile(path) is first and first.name == "mine"
    assert "memory_bytes:" in text
    doubled = text.replace("memory_bytes:", "memory_bytes: 2.0e+10 #", 1)
    path.write_text(doubled)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a later modification time
    second = load_profile(path)
    assert second is not first and second.device.memory_bytes == 2.0e10 != first.device.memory_bytes


def test_an_unknown_profile_names_the_available_ones(tmp_path):
    from envs.profile import ProfileError, load_profile

    with pytest.raises(ProfileError, match=r"profile 'nosuch' not found; available: \[.*cpu_specsched-pair"):
        load_profile("nosuch")
    with pytest.raises(ProfileError, match="not found"):
        load_profile(tmp_path / "absent.yaml")


@pytest.mark.parametrize("app", ["train", "evaluate", "serve"])
@pytest.mark.parametrize("choice", ["h100_llama2-13b_llama2-7b", "envs/profiles/cpu1_specsched-pair.yaml"])
def test_app_configs_carry_the_profile_as_a_name_or_path(app, choice):
    """`profile=NAME|PATH` is a plain value (not a Hydra group that pastes the table into the config)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from envs.profile import load_profile

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        raw = OmegaConf.to_container(compose(config_name=app, overrides=[f"profile={choice}"]), resolve=True)
    assert raw["profile"] == choice
    if app != "serve":
        assert raw["env"]["profile"] == choice
    assert load_profile(choice).name
