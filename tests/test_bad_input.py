"""Bad input is refused with a message naming the field, before any long work, leaving nothing behind.

The cases come from a red-team of the entry points: each failed here before the fix -- accepted
silently (an infinite Student-t nu gave negative output lengths), refused only after the work had
run (an unknown scheduler after the others' rounds, an unwritable output after the evaluation),
or refused after writing (``experiments.general`` rewrote ``--policies`` before checking ``--ks``).
"""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

import envs  # noqa: F401  (registers the environments)
from envs.config import ConfigError


# ------------------------------------------------------------------------------- env config
@pytest.mark.parametrize("kwargs, field", [
    ({"output_cv": 0.5, "output_tail_nu": math.inf}, "output_tail_nu"),
    ({"memory_bytes": math.inf}, "memory_bytes"),
    ({"cell_radius_m": 1e308}, "cell_radius_m"),  # its square overflowed at reset
    ({"cell_radius_m": True}, "cell_radius_m"),  # was blamed on min_distance_m
    ({"cell_radius_m": math.nan}, "cell_radius_m"),
    ({"uplink_psd_dbm_per_hz": 1e300}, "uplink_psd_dbm_per_hz"),
    ({"path_loss_slope_db": -1e6}, "path_loss_slope_db"),
    ({"path_loss_db_at_1km": 1e308}, "path_loss_db_at_1km"),
    ({"bits_per_token": 0.0}, "bits_per_token"),
])
def test_env_config_refuses_non_physical_values(kwargs, field):
    for env_id in ("EdgeSchedule-v0", "EdgeSchedule-v1"):
        with pytest.raises(ConfigError, match=f"'{field}' must be"):
            gym.make(env_id, num_users=5, **kwargs)


def test_a_finite_tail_still_draws_finite_outputs():
    env = gym.make("EdgeSchedule-v0", num_users=50, output_cv=0.5, output_tail_nu=3.0).unwrapped
    env.reset(seed=0)
    assert np.all(env.round.realized_output_tokens >= 1) and np.all(np.isfinite(env.round.realized_downlink_s))


# ------------------------------------------------------------------------------- reset options
@pytest.mark.parametrize("env_id", ["EdgeSchedule-v0", "EdgeSchedule-v1"])
def test_scalar_reset_options_are_checked(env_id):
    env = gym.make(env_id, num_users=5)
    with pytest.raises(ValueError, match="must be None or a dict"):
        env.reset(options=5)
    with pytest.raises(ValueError, match="knows only the key 'round'"):
        env.reset(options={"rounds": None})  # the vector env's key: a random round would be played instead
    with pytest.raises(ValueError, match=r"options\['round'\] must be a Round"):
        env.reset(options={"round": 3})
    env.reset(seed=0, options={})  # empty options are no options


@pytest.mark.parametrize("env_id", ["EdgeSchedule-v0", "EdgeSchedule-v1"])
def test_vector_reset_options_are_checked(env_id):
    venv = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", num_users=5)
    with pytest.raises(ValueError, match="must be a list of 2 Rounds"):
        venv.reset(options={"rounds": [1, 2]})
    with pytest.raises(ValueError, match="knows only the key 'rounds'"):
        venv.reset(options={"round": None})
    with pytest.raises(ValueError, match="must be None or a dict"):
        venv.reset(options=5)
    venv.reset(seed=0)


@pytest.mark.parametrize("env_id", ["EdgeSchedule-v0", "EdgeSchedule-v1"])
@pytest.mark.parametrize("num_envs", [10**9, 0, 2.5, True])
def test_vector_env_refuses_a_num_envs_out_of_range(env_id, num_envs):
    # 10**9 used to reach numpy as a MemoryError that named no field
    with pytest.raises(ValueError, match="num_envs must be"):
        gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", num_users=5)


def test_the_v1_vector_env_refuses_a_render_mode():
    with pytest.raises(ValueError, match="render_mode must be None"):
        gym.make_vec("EdgeSchedule-v1", num_envs=2, vectorization_mode="vector_entry_point", num_users=5, render_mode="ansi")


# ------------------------------------------------------------------------------- profiles
def _profile_file(tmp_path, edit) -> str:
    from envs.profile import profile_path

    data = yaml.safe_load(profile_path("split_a100-40gb_llama2-7b_tinyllama-1.1b").read_text())
    edit(data)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["network"].update(request_overhed_bytes=64), "network.request_overhed_bytes"),  # a typo fell back to the default 0
    (lambda d: d.update(bogus_section={}), "bogus_section"),
    (lambda d: d["llm"].update(layers=True), "'llm.layers' must be a number"),
    (lambda d: d["device"].update(reserve_bytes=d["device"]["memory_bytes"] * 2), "'device.reserve_bytes' must be < memory_bytes"),
    (lambda d: d["edge"]["device"].update(memroy_bytes=1), "edge.device.memroy_bytes"),
])
def test_profiles_refuse_unknown_keys_and_nonsense(tmp_path, edit, words):
    from envs.profile import ProfileError, load_profile

    with pytest.raises(ProfileError, match=words.replace(".", r"\.")):
        load_profile(_profile_file(tmp_path, edit))


def test_malformed_profile_yaml_is_a_profile_error_naming_the_file(tmp_path):
    from envs.profile import ProfileError, load_profile

    path = tmp_path / "broken.yaml"
    path.write_text("device: [unclosed\n")
    with pytest.raises(ProfileError, match="broken.yaml.*not valid YAML"):
        load_profile(str(path))


def test_every_shipped_profile_still_loads():
    from envs.profile import available_profiles, load_profile

    for name in available_profiles():
        load_profile(name)


# ------------------------------------------------------------------------------- output paths
def test_check_writable(tmp_path):
    from agents.artefacts import check_writable

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"--out: .* is a file"):
        check_writable(a_file / "out.csv", "--out")
    with pytest.raises(ValueError, match="--out must be a folder"):
        check_writable(a_file, "--out", directory=True)
    with pytest.raises(ValueError, match="output must name a file"):
        check_writable(tmp_path, "output")
    deep = tmp_path / "new" / "deeper" / "out.csv"
    assert check_writable(deep, "output") == deep
    assert not (tmp_path / "new").exists()  # nothing is created by the check
    assert list(tmp_path.iterdir()) == [a_file]  # its probe file is gone


# ------------------------------------------------------------------------------- agents.evaluate
def _evaluate_cfg(**over) -> dict:
    return {"env": {"num_users": 6}, "schedulers": ["balance"], "rounds": 2, "seed": 0, **over}


def test_evaluate_refuses_before_any_scheduler_runs(monkeypatch, tmp_path):
    import agents.evaluate as ev

    def ran(*args, **kwargs):
        raise AssertionError("a plan was evaluated before the bad input was refused")

    monkeypatch.setattr(ev, "evaluate_plan", ran)
    with pytest.raises(ValueError, match="unknown scheduler 'bogus'"):
        ev.run(_evaluate_cfg(schedulers=["balance", "bogus"]))
    with pytest.raises(FileNotFoundError, match="policy_path '/nonexistent/policy' does not exist"):
        ev.run(_evaluate_cfg(schedulers=["balance", "policy"], policy_path="/nonexistent/policy"))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="output: .* is a file"):
        ev.run(_evaluate_cfg(output=str(tmp_path / "a_file" / "out.csv")))
    with pytest.raises(ValueError, match="policy_path is set but schedulers"):
        ev.run(_evaluate_cfg(policy_path="policies/paper_k50"))  # it would be ignored
    for rounds in (2.7, "abc", True, 0):
        with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
            ev.run(_evaluate_cfg(rounds=rounds))


def test_evaluate_takes_one_scheduler_name_as_a_string():
    from agents.evaluate import run

    df, _ = run(_evaluate_cfg(schedulers="ad_only"))  # schedulers=ad_only on the command line
    assert set(df.scheduler) == {"ad_only"}


def test_a_broken_policy_json_names_its_file(tmp_path):
    from agents.policy import resolve_policy_path

    (tmp_path / "model.zip").write_bytes(b"")
    (tmp_path / "policy.json").write_text('{"env": ')
    with pytest.raises(ValueError, match="policy.json is not valid JSON"):
        resolve_policy_path(tmp_path)
    (tmp_path / "policy.json").write_text("{}")
    with pytest.raises(ValueError, match=r"policy.json lacks the key\(s\) \['env'\]"):
        resolve_policy_path(tmp_path)


# ------------------------------------------------------------------------------- experiments
def test_general_checks_its_arguments_before_touching_the_policy_folder(tmp_path):
    from experiments.general import main

    policies = tmp_path / "policies"
    for argv in (["--ks", "5000", "--rounds", "5"], ["--rounds=-3"], ["--ks", "abc"], ["--ks", "20,50", "--rounds", "5"],
                 ["--balance-only"], ["--balance-timing-rounds", "200"], ["--timing-rounds", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(["--runs", str(tmp_path / "runs"), "--policies", str(policies), "--results", str(tmp_path / "results"), *argv])
        assert exc.value.code == 2, argv
    assert not policies.exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("argv, words", [
    (["--rtts", "nan"], "--rtts must hold finite numbers"),
    (["--rtts", "inf"], "--rtts must hold finite numbers"),
    (["--quick", "--rtts", "5"], "--quick sets --rtts itself"),
])
def test_specedge_refuses_bad_arguments(tmp_path, argv, words):
    from experiments.specedge import main

    with pytest.raises(SystemExit, match=words):
        main(["--out", str(tmp_path / "out"), *argv])
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit, match="is a file"):
        main(["--out", str(tmp_path / "a_file" / "out"), "--quick"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, words", [
    (["--rtt-ms", "nan"], "--rtt-ms needs finite values"),
    (["--jitter-ms", "-5"], "--jitter-ms"),
    (["--bandwidth-mbps", "0"], "--bandwidth-mbps"),
    (["--timeout-s", "nan"], "--timeout-s"),
    (["--depth", "abc"], "--depth must be auto"),
    (["--device", "bogus"], "--device must be a torch device"),
    (["--dtype", "bogus"], "--dtype must be one of"),
    (["--baseline", "/nonexistent/baseline.csv"], "--baseline"),
])
def test_split_bench_refuses_bad_arguments_before_creating_its_folder(tmp_path, argv, words):
    from experiments.split_bench import parse_args

    with pytest.raises(SystemExit, match=words):
        parse_args(["--out", str(tmp_path / "out"), "--pin-cpus", "off", *argv])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, words", [
    (["--rtt-ms", "nan"], "--rtt-ms"),
    (["--bandwidth-mbps", "nan"], "--bandwidth-mbps"),
    (["--temperature", "nan"], "--temperature"),
    (["--jitter-ms", "inf"], "--jitter-ms"),
    (["--reply-timeout-s", "nan"], "--reply-timeout-s"),
    (["--connect-timeout-s=-5"], "--connect-timeout-s"),
    (["--gil-switch-ms", "nan"], r"--gil-switch-ms must lie in \[0.01, 100\]"),
    (["--gil-switch-ms", "0"], "--gil-switch-ms"),
])
def test_the_edge_refuses_non_finite_numbers(argv, words):
    from runtime.edge import parse_args

    with pytest.raises(SystemExit, match=words):
        parse_args(["--server", "127.0.0.1:50051", *argv])
    with pytest.raises(SystemExit, match="--server must be HOST:PORT"):
        parse_args(["--server", "notahostport"])


def test_device_and_dtype_are_checked_before_a_pair_loads():
    from runtime.pair import device_dtype_problem
    from runtime.serve_config import ServeConfig

    assert device_dtype_problem("cpu", "float32") is None
    assert "torch device" in device_dtype_problem("bogus", "float32")
    assert "--dtype" in device_dtype_problem("cpu", "float64x")
    with pytest.raises(ValueError, match="serve config 'device' must be a torch device"):
        ServeConfig(profile="cpu_specsched-pair", device="bogus").validate()


@pytest.mark.parametrize("over, words", [
    ({"seed": -1}, "'seed' must be an integer"),
    ({"url": "notaurl"}, "'url' must be an http"),
    ({"time_scale": math.inf}, "'time_scale' must be a finite number"),
    ({"round_gap_s": math.nan}, "'round_gap_s' must be a finite number"),
])
def test_loadgen_refuses_bad_config(over, words):
    from runtime.loadgen import validate

    cfg = {"env": {}, "url": "http://127.0.0.1:8011", "rounds": 1, "users": 2, "seed": 0, "time_scale": 1.0, "token_scale": 1.0,
           "max_tokens_cap": 64, "round_gap_s": 0.0, "timeout_s": 10.0, "stream": True, "wait_rounds": True}
    validate(cfg)
    with pytest.raises(ValueError, match=words):
        validate({**cfg, **over})


def test_help_runs_nothing(capsys):
    from agents.tune import main as tune_main
    from experiments.readme import main as readme_main

    assert tune_main(["--help"]) is None  # printed the usage, started no study
    assert "trials" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        readme_main(["--help"])  # printed the usage, rewrote no README
    assert exc.value.code == 0


# ------------------------------------------------------------------------------- training side
@pytest.mark.parametrize("over, field", [
    ({"eval": {"final_schedulers": ["balance", "bogus"]}}, "eval.final_schedulers"),  # was refused after training
    ({"agent": {"hyperparams": {"gamma": 2}}}, "agent.hyperparams.gamma"),  # was accepted
    ({"agent": {"hyperparams": {"learning_rate": math.nan}}}, "agent.hyperparams.learning_rate"),
    ({"agent": {"hyperparams": {"batch_size": 0}}}, "agent.hyperparams.batch_size"),
    ({"agent": {"hyperparams": {"n_steps": -4}}}, "agent.hyperparams.n_steps"),
    ({"seed": True}, "seed"),
])
def test_train_config_refuses_before_training(over, field):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from agents.train_config import TrainConfig, TrainConfigError

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parent.parent / "conf"), version_base="1.3"):
        raw = OmegaConf.to_container(compose(config_name="train"), resolve=True)
    TrainConfig.from_dict(raw)  # the defaults pass
    for key, value in over.items():
        if isinstance(value, dict):
            for sub, v in value.items():
                raw[key][sub] = {**raw[key][sub], **v} if isinstance(v, dict) else v
        else:
            raw[key] = value
    with pytest.raises(TrainConfigError, match=f"'{field}' must be"):
        TrainConfig.from_dict(raw)


def test_a_refused_train_config_is_one_line_and_leaves_no_run_folder(tmp_path):
    # Hydra made the run folder (.hydra/, an empty train.log) before the check, then printed a traceback
    import subprocess
    import sys

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agents.train", "logger=disabled", "agent.hyperparams.gamma=2", f"output_dir={out}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode != 0 and "'agent.hyperparams.gamma' must be" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists()
    keep = tmp_path / "mine"  # a folder with the user's own files is left as it is
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    r = subprocess.run(cmd[:-1] + [f"output_dir={keep}"], capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode != 0 and (keep / "notes.txt").read_text() == "mine"


def test_imitation_collect_checks_its_request_and_never_reuses_another_requests_plans(tmp_path):
    from agents.imitation import ImitationConfig, collect

    cfg = ImitationConfig()
    with pytest.raises(ValueError, match="one rounds count >= 1 per K"):
        collect(cfg, [0], [1], tmp_path / "a")
    with pytest.raises(ValueError, match="one rounds count >= 1 per K"):
        collect(cfg, [6], [1, 2], tmp_path / "a")  # wrote plans_k6.npz before failing, once
    assert not (tmp_path / "a").exists()
    collect(cfg, [6], [2], tmp_path / "b")
    collect(cfg, [6], [2], tmp_path / "b")  # the same request: the file is reused
    with pytest.raises(ValueError, match="holds plans of another request"):
        collect(cfg, [6], [3], tmp_path / "b")  # was silently reused: 2 rounds where 3 were asked for


def test_overload_checks_every_flag_before_building_a_pair(monkeypatch, tmp_path):
    import experiments.overload as overload

    def built(*args, **kwargs):
        raise AssertionError("a model pair was built before the bad flag was refused")

    monkeypatch.setattr(overload, "build_pair", built)
    for argv, words in ((["--scheduler", "bogus"], "'scheduler'"), (["--profile", "bogus"], "'profile'"), (["--time-scale", "-1"], "--time-scale"),
                        (["--threads", "0"], "--threads")):
        with pytest.raises(SystemExit, match=words):
            overload.main(["--users", "8", "--rounds", "1", "--burst", "0", "--hog", "0", "--out", str(tmp_path / "o"), *argv])


@pytest.mark.parametrize("module, argv, words", [
    ("experiments.main", ["--rounds", "1000000000000"], "--rounds must be an integer in"),
    ("experiments.paper", ["--seed=-1"], "--seed must be an integer"),
    ("experiments.learned", ["--train-timesteps=-5", "--train-seeds", "0"], "--train-timesteps must be >= 1"),
    ("experiments.optimality", ["--ks", "20", "--rounds", "1", "--time-limits", "nan", "--bound-steps", "0.02"], "--time-limits must be finite"),
])
def test_experiment_flags_are_refused_up_front(capsys, tmp_path, module, argv, words):
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "out")])
    assert exc.value.code != 0 and words in str(exc.value.code) + capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override,message", [("env.num_users=0", "'num_users' must be an integer in [1, 4096], got 0"),
                                              ("schedulers=[balance,balanse]", "unknown scheduler 'balanse'"),
                                              ("rounds=0", "rounds must be an integer >= 1, got 0")])
def test_a_refused_evaluate_config_is_one_line(tmp_path, override, message):
    """agents.evaluate refuses a bad key in one line naming it, as agents.train does (it printed a
    traceback of the Hydra app before the same message)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "agents.evaluate", override, "rounds=1" if not override.startswith("rounds") else "progress=false",
           f"hydra.run.dir={tmp_path / 'hydra'}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode != 0 and "agents.evaluate: error:" in r.stderr and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_evaluate_says_when_a_policy_observes_rounds_differently_from_the_env_config():
    """A policy's look-ahead and user order come from its policy.json: the evaluation says so when
    the caller's env config names others, and when a round is larger than the look-ahead."""
    import warnings

    from agents.evaluate import evaluate_schedulers
    from envs import EnvConfig

    path = Path(__file__).resolve().parents[1] / "policies" / "paper_k50"
    if not (path / "model.zip").is_file():
        pytest.skip("no shipped policies/paper_k50")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate_schedulers(EnvConfig(num_users=70, max_users=80, user_order="arrival"), ["policy"], rounds=1, policy_path=str(path))
    text = " | ".join(str(w.message) for w in caught)
    assert "max_users=64 (env: 80)" in text and "user_order='slack_desc' (env: 'arrival')" in text, text
    assert "rounds of 70 users exceed its look-ahead of 64" in text, text
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate_schedulers(EnvConfig(num_users=50, user_order="slack_desc"), ["policy"], rounds=1, policy_path=str(path))
    assert not [w for w in caught if "observes rounds" in str(w.message) or "look-ahead" in str(w.message)]
