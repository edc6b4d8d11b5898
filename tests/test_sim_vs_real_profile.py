"""experiments.sim_vs_real: which profile it plans with, the by-mode gap decomposition, the CPU-hog run."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from envs.cost_model import CostModel
from envs.plan import AD, REJECT, SD, Plan
from envs.profile import load_profile
from experiments import sim_vs_real as svr
from experiments import sim_vs_real_report as svr_report
from experiments import sim_vs_real_simulate as svr_simulate

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--users", "0"], "--users must be an integer in [1, 64]"),
        (["--schedulers", "balance,nosuch"], "unknown ['nosuch']"),
        (["--profile", "cpu_specsched-pair", "--no-auto-profile"], "only apply to --profile auto"),
        (["--profile", "cpu_specsched-pair", "--remeasure-profile"], "only apply to --profile auto"),
        (["--no-auto-profile", "--remeasure-profile"], "contradicts"),
        (["--alpha", "1.5"], "--alpha must be in (0, 1)"),
        (["--pair", "/nonexistent/pair"], "--pair must be a built pair folder"),
    ],
)
def test_bad_options_fail_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit):
        svr.main(argv)
    assert message in capsys.readouterr().err


def _both(window=0.3):
    """Two AD requests: real compute 1.0 / 1.2 s with the first token after 0.4 / 0.5 s; simulated 0.8 / 1.0 s, prefill 0.3 s."""
    return pd.DataFrame({"mode": ["ad", "ad"], "sim_mode": ["ad", "ad"], "outcome": ["served", "late"], "wait_s": [0.3, 0.3], "plan_s": [0.0, 0.0],
                         "latency_s": [1.3, 1.5], "ttft_s": [0.7, 0.8], "sim_latency_s": [0.8 + window, 1.0 + window], "sim_prefill_s": [0.3, 0.3],
                         "sim_served": [True, True], "sim_measured_served": [True, True], "sim_measured_latency_s": [0.8 + window, 1.0 + window]})


def test_by_mode_splits_the_compute_gap_into_prefill_and_decode():
    (row,) = svr_report.compare_by_mode(_both(), "x", 0.3)
    assert row["compute p50 real (s)"] == pytest.approx(1.1) and row["compute p50 sim (s)"] == pytest.approx(0.9)
    assert row["prefill p50 real (s)"] == pytest.approx(0.45) and row["prefill error %"] == pytest.approx((0.3 - 0.45) / 0.45 * 100)
    assert row["decode p50 real (s)"] == pytest.approx(0.65) and row["decode p50 sim (s)"] == pytest.approx(0.6)
    summary = svr_report.compare(_both(), "x", 0.3)
    assert summary["AD compute p50 error %"] == pytest.approx((0.9 - 1.1) / 1.1 * 100) and "SD compute p50 error %" not in summary


def test_simulated_prefill_is_the_batch_first_step_on_the_whole_device():
    from envs.config import EnvConfig
    from envs.workload import Round

    prof = load_profile("cpu1_specsched-pair")
    cfg = EnvConfig(num_users=1, profile="cpu1_specsched-pair", input_tokens=[1, 1 << 20], output_tokens=[1, 1 << 20], deadline_s=[1e-6, 1e6], max_users=64)
    rnd = Round.from_arrays(cfg, np.array([100, 150, 80, 60]), np.array([10, 10, 10, 10]), np.full(4, 10.0), np.full(4, 0.9), np.full(4, cfg.min_distance_m))
    plan = Plan(modes=np.array([AD, AD, SD, REJECT]), gamma=4, z=0.25, lam=0.5)
    pre = svr_simulate.prefill_s(prof, rnd, plan, {"ad": 2.0, "sd": 1.0})
    assert pre[0] == pre[1] == pytest.approx(float(prof.tau_llm.tau(2, 150, 150)) * 2.0)  # not / z: the executor runs a step whole
    iteration = CostModel(prof).sd_iteration_time(1, 80, 4)
    assert iteration > 0 and pre[2] == pytest.approx(float(prof.tau_llm.tau(1, 80, 80)) + float(prof.tau_slm.tau(1, 80, 80)) + float(iteration))
    assert np.isnan(pre[3])
    alone = svr_simulate.prefill_s(prof, rnd, Plan(modes=np.array([AD, REJECT, REJECT, REJECT]), gamma=4, z=0.25, lam=0.5))
    assert alone[0] == pytest.approx(float(prof.tau_llm.tau(1, 100, 100)))  # one batch: the whole device


@pytest.mark.slow
def test_cpu_hog_run_end_to_end(pair, profile, tmp_path):
    res = subprocess.run(cwd=ROOT, args=[sys.executable, "-m", "experiments.sim_vs_real", "--schedulers", "ad_only", "--rounds", "1", "--users", "2", "--token-scale", "0.05",
                                         "--time-scale", "4", "--cpu-hog", "--pair", str(pair.path), "--profile", str(profile), "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    text = (tmp_path / "sim_vs_real_cpu_hog.md").read_text()
    assert "# Simulated vs real with a CPU hog" in text and "(forced;" in text and str(Path(profile).name) in text
    table = pd.read_csv(tmp_path / "sim_vs_real_cpu_hog.csv")
    assert sorted(set(table.calibration)) == ["off", "on"] and len(table) == 4
    assert "factor ad" in text and "prefill error %" in text, text  # long deadlines: served, so the by-mode rows exist
    assert not (tmp_path / "sim_vs_real.md").exists()  # the idle table is not overwritten by a hog run


def test_step_emulation_is_the_executors_rule(monkeypatch):
    """envs.step_sharing emulates runtime.executor.run_shared: the same step order and end times,
    checked against the executor itself on generators that advance a fake clock."""
    import runtime.executor
    from envs.step_sharing import run_whole_steps

    jobs = {"ad": ([0.4, 0.05, 0.05, 0.05], 0.3), "sd": ([0.1, 0.08, 0.08, 0.08, 0.08], 0.7)}
    clock = {"now": 0.0}
    ends: dict[str, list[float]] = {"ad": [], "sd": []}

    def steps(name):
        for d in jobs[name][0]:
            clock["now"] += d
            ends[name].append(clock["now"])
            if len(ends[name]) < len(jobs[name][0]):
                yield
        return name

    monkeypatch.setattr(runtime.executor.time, "perf_counter", lambda: clock["now"])
    runs = runtime.executor.run_shared({name: (steps(name), share) for name, (_, share) in jobs.items()})
    assert runs["ad"].device_s == pytest.approx(0.55)
    emulated = run_whole_steps(jobs)
    for name in jobs:
        assert emulated[name] == pytest.approx(ends[name])
    assert emulated["ad"][0] == pytest.approx(0.4) and emulated["sd"][0] == pytest.approx(0.5)  # the AD prefill is whole: SD waits for it


def test_granularity_rows_per_admitted_user():
    from experiments.sim_vs_real_steps import granularity, plan_rounds

    cost = CostModel(load_profile("cpu1_specsched-pair"))
    df = pd.DataFrame({"round": 0, "user": range(4), "prompt_tokens": [150, 140, 20, 30], "max_tokens": [10, 12, 40, 60], "deadline_s": [3.0, 3.0, 3.0, 3.0],
                       "mode": "ad", "latency_s": 1.0, "wait_s": 0.3, "plan_s": 0.0})
    planned = plan_rounds(df, cost, 0.3, 0.9)
    gran = granularity(planned, cost)
    assert len(gran) == int(np.isin(planned[0][3].modes, [AD, SD]).sum()) and (gran.steps_s > 0).all() and (gran.fluid_s > 0).all()
    assert gran.real_s.tolist() == pytest.approx([0.7] * len(gran))


def _round(inputs, outputs):
    from envs.config import EnvConfig
    from envs.workload import Round

    cfg = EnvConfig(num_users=1, profile="cpu1_specsched-pair", input_tokens=[1, 1 << 20], output_tokens=[1, 1 << 20], deadline_s=[1e-6, 1e6], max_users=64)
    k = len(inputs)
    return Round.from_arrays(cfg, np.array(inputs), np.array(outputs), np.full(k, 1.0), np.full(k, 0.8), np.full(k, cfg.min_distance_m))


@pytest.mark.parametrize("mode", [AD, SD])
def test_steps_sharing_is_the_environment_outcome_for_one_batch(mode):
    """With one batch there is nothing to share: the step emulation ends every user exactly when envs.outcome does."""
    from envs.outcome import evaluate_plan
    from runtime.calibration import CalibratedCostModel, StepCalibration

    cost = CostModel(load_profile("cpu1_specsched-pair"))
    rnd = _round([100, 150, 80], [10, 40, 25])
    plan = Plan(modes=np.array([mode, mode, mode]), gamma=4, z=1.0 if mode == AD else 0.0, lam=0.5)
    steps, fluid = evaluate_plan(cost, rnd, plan, completion="own", sharing="steps"), evaluate_plan(cost, rnd, plan, completion="own", sharing="work_conserving")
    assert steps.latency_s == pytest.approx(fluid.latency_s) and (steps.served == fluid.served).all()
    calibration = StepCalibration()
    for key in ("ad", "sd"):
        calibration.update(key, 2.0, 1.0)  # a calibrated cost model doubles the batch times: the steps follow
    doubled = evaluate_plan(CalibratedCostModel(cost, calibration), rnd, plan, completion="own", sharing="steps")
    assert doubled.latency_s - rnd.uplink_s.max() - rnd.downlink_s == pytest.approx(2 * (steps.latency_s - rnd.uplink_s.max() - rnd.downlink_s))


def test_steps_sharing_conserves_work_but_not_the_order():
    """Two batches: the round ends at the same time as in the fluid model (work-conserving), but the
    batch that runs behind a whole prefill step ends its first users later than at its fluid share."""
    from envs.outcome import evaluate_plan

    cost = CostModel(load_profile("cpu1_specsched-pair"))
    rnd = _round([160, 150, 20, 30], [5, 8, 40, 60])
    plan = Plan(modes=np.array([AD, AD, SD, SD]), gamma=4, z=0.3, lam=0.5)
    steps, fluid = evaluate_plan(cost, rnd, plan, completion="own", sharing="steps"), evaluate_plan(cost, rnd, plan, completion="own", sharing="work_conserving")
    assert max(steps.ad_batch_s, steps.sd_batch_s) == pytest.approx(max(fluid.ad_batch_s, fluid.sd_batch_s))
    assert steps.latency_s[2] > fluid.latency_s[2]  # SD's first user waits for AD's whole prefill
    with pytest.raises(ValueError, match="completion"):
        evaluate_plan(cost, rnd, plan, completion="nosuch", sharing="steps")


def test_from_csv_resimulates_without_a_server(tmp_path):
    """--from-csv re-simulates an earlier run's real rows (here: hand-made) with other simulator settings, writing beside the default report."""
    real = pd.DataFrame({"round": [0, 0, 0, 1, 1], "user": [0, 1, 2, 0, 1], "prompt_tokens": [120, 40, 90, 60, 150], "max_tokens": [20, 60, 10, 30, 40],
                         "deadline_s": [2.0, 3.0, 0.9, 4.0, 2.5], "status": 200, "mode": ["ad", "sd", "sd", "sd", "ad"], "outcome": "served", "reason": "",
                         "ttft_s": 0.4, "latency_s": 0.8, "output_tokens": 20, "server_latency_s": 0.79, "wait_s": 0.3, "plan_s": 0.01, "alpha_planned": 0.9,
                         "sim_served": True, "scheduler": "balance"})
    csv = tmp_path / "old.csv"
    real.to_csv(csv, index=False)
    svr.main(["--from-csv", str(csv), "--profile", "cpu1_specsched-pair", "--sharing", "work_conserving", "--schedulers", "balance", "--out", str(tmp_path)])
    text = (tmp_path / "sim_vs_real_sharing_work_conserving.md").read_text()
    assert "Re-simulated from the real rows" in text and "sharing `work_conserving`" in text and "--sharing work_conserving --from-csv" in text
    out = pd.read_csv(tmp_path / "sim_vs_real_sharing_work_conserving.csv")
    assert len(out) == 5 and out.sim_latency_s.notna().any() and not (tmp_path / "sim_vs_real.md").exists()
    with pytest.raises(SystemExit):
        svr.main(["--from-csv", str(csv), "--cpu-hog"])
