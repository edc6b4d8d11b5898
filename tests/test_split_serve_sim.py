"""experiments.split_sim_vs_real's simulator side (experiments.split_sim_vs_real_simulate) and its checks (no server, no models), one
end-to-end run on the tiny pair (a live server and an edge user), and the edge process's placement
options."""

import os

import numpy as np
import pandas as pd
import pytest

from agents.ed_batch import split_model
from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.plan import ED
from envs.profile import load_profile
from envs.workload import Round
from experiments.split_sim_vs_real import parse_args
from experiments.split_sim_vs_real_simulate import compare, compare_parts, simulate

PROFILE = "split_cpu1_specsched-pair"


def live_rows(outcome="served", latency=1.0) -> pd.DataFrame:
    """One round as the live run records it: two edge users and one HTTP user."""
    return pd.DataFrame({
        "setting": "mix", "round": 0, "user": [0, 1, 2], "kind": ["edge", "edge", "http"], "prompt": "p", "prompt_tokens": [8, 12, 6],
        "max_tokens": [40, 30, 20], "deadline_s": [5.0, 5.0, 5.0], "rtt_s": [0.01, 0.02, 0.0], "mode": ["ed", "ed", "sd"], "outcome": outcome,
        "latency_s": latency, "wait_s": 0.3, "tokens": [40, 30, 20], "depth": [2, 2, 0], "accepted": [30, 20, 15], "rejections": [3, 4, 1],
        "scheduler": "edge_first", "alpha_server": 0.8,
    })


def test_simulate_plans_edge_users_in_ed_and_costs_them():
    both = simulate(live_rows(), "edge_first", PROFILE, 0.3, None)
    assert list(both.sim_mode) == ["ed", "ed", "sd"]  # the same v1 plan the live server made for this round
    assert (both.sim_depth[:2] >= 1).all() and both.sim_depth[2] == 0
    assert both.sim_served.all()
    ed = both[both.sim_mode == "ed"]
    assert (ed.sim_latency_s > 0.3).all()  # the round window plus the v1 model's ED latency
    # measured acceptance (here below the estimate for user 1) changes the ED batch's iterations
    assert not np.allclose(ed.sim_measured_latency_s, ed.sim_latency_s)


def test_simulated_ed_users_end_at_their_own_last_token_by_default():
    rows = live_rows()
    rows["max_tokens"] = [60, 10, 20]  # very different iteration counts: the short ED user ends well before the batch
    rows["tokens"] = [60, 10, 20]
    own = simulate(rows, "edge_first", PROFILE, 0.3, None)
    ed = own[own.sim_mode == "ed"]
    assert len(ed) == 2
    assert (ed.sim_latency_s <= ed.sim_batch_latency_s).all()
    assert ed.sim_latency_s.iloc[1] < ed.sim_batch_latency_s.iloc[1]
    assert ed.sim_batch_latency_s.nunique() == 1  # batch completion: both end together
    batch = simulate(rows, "edge_first", PROFILE, 0.3, None, completion="batch")
    np.testing.assert_array_equal(batch.sim_latency_s, batch.sim_batch_latency_s)
    np.testing.assert_array_equal(batch.sim_batch_latency_s, own.sim_batch_latency_s)
    table = compare(own)
    assert "p50 (sim, batch completion) (s)" in table.columns and "served (sim, batch completion)" in table.columns
    assert parse_args([]).completion == "own" and parse_args(["--completion", "batch"]).completion == "batch"


def test_simulated_sd_users_end_at_their_own_last_token_too():
    """AD/SD users of a round with ED users end at their own last token under ``own`` (as the server
    answers them), at their batch's end under ``batch``; ED users are untouched by that choice."""
    rows = pd.concat([live_rows(), live_rows().iloc[[2]].assign(user=3, max_tokens=60, tokens=60, prompt_tokens=9)], ignore_index=True)
    rows["max_tokens"] = rows["tokens"] = [40, 30, 8, 60]  # two HTTP users of very different lengths
    own = simulate(rows, "edge_first", PROFILE, 0.3, None)
    batch = simulate(rows, "edge_first", PROFILE, 0.3, None, completion="batch")
    http = (own.kind == "http").to_numpy()
    assert set(own.sim_mode[http]) == {"sd"} and (own.sim_mode[~http] == "ed").all()
    assert batch.sim_latency_s[http].nunique() == 1  # batch: both SD users end with their batch
    short, long_ = own.sim_latency_s[http].to_numpy()
    assert short < long_ and long_ == pytest.approx(batch.sim_latency_s[http].iloc[0], rel=1e-12)
    np.testing.assert_array_equal(own.sim_batch_latency_s, batch.sim_batch_latency_s)  # the batch-completion column is one model


def test_resimulate_rewrites_a_finished_run_without_a_live_part(tmp_path):
    """``--resimulate DIR`` plans and costs the run's rounds again and rewrites its report, keeping its
    live lines; the re-simulated columns are what ``simulate`` gives on the live records; without a
    Reproduce line the arguments given describe the run, with one the recorded options are used."""
    import experiments.split_sim_vs_real as svr

    live = live_rows()
    run = tmp_path / "run"
    run.mkdir()
    stale = simulate(live, "edge_first", PROFILE, 0.3, None, completion="batch").drop(columns=["prompt"])
    stale.to_csv(run / "requests.csv", index=False)
    (run / "summary.md").write_text("# old\n\nWall time of the live part: 9 s; load.\n")
    args = ["--schedulers", "edge_first", "--settings", "mix", "--rounds", "1", "--http-users", "1", "--window-s", "0.3", "--pin-cpus", "off",
            "--device-sharing", "os", "--rtt-report", "link"]
    with pytest.raises(SystemExit, match="rounds 1, the arguments say 24"):  # no record: the arguments must describe the run
        svr.main(["--schedulers", "edge_first", "--settings", "mix", "--http-users", "1", "--profile", PROFILE, "--resimulate", str(run)])
    with pytest.raises(SystemExit, match="http-users 1, the arguments say 2"):
        svr.main(["--schedulers", "edge_first", "--settings", "mix", "--rounds", "1", "--profile", PROFILE, "--resimulate", str(run)])
    svr.main([*args, "--profile", PROFILE, "--resimulate", str(run)])
    got = pd.read_csv(run / "requests.csv")
    want = simulate(live, "edge_first", PROFILE, 0.3, None)
    np.testing.assert_allclose(got.sim_latency_s, want.sim_latency_s, rtol=1e-12)
    assert not np.allclose(got.sim_latency_s, stale.sim_latency_s)  # the stale batch-completion figures were replaced
    text = (run / "summary.md").read_text()
    reproduce = ("Reproduce (the live run): `python -m experiments.split_sim_vs_real --schedulers edge_first --settings mix --rounds 1 --edge-users 2 "
                 f"--http-users 1 --tokens 24 64 --deadline-s 0.8 3 --rtt-ms 5 30 --window-s 0.3 --cohorts 2 --profile {PROFILE} --seed 0 --pin-cpus off --device-sharing os --rtt-report link`")
    assert "Wall time of the live part: 9 s" in text and reproduce in text and f"`python -m experiments.split_sim_vs_real --resimulate {run}`" in text
    assert (run / "profile.yaml").is_file() and set(pd.read_csv(run / "summary.csv").users) == {"ED users", "edge users", "everyone"}
    # again from the record alone (its Reproduce line and saved profile): the same figures and the same live lines
    svr.main(["--resimulate", str(run), "--out", str(tmp_path / "again")])
    np.testing.assert_allclose(pd.read_csv(tmp_path / "again" / "requests.csv").sim_latency_s, want.sim_latency_s, rtol=1e-12)
    assert reproduce in (tmp_path / "again" / "summary.md").read_text()
    # the simulator's own option may differ from the run's; a live option may not
    svr.main(["--resimulate", str(run), "--out", str(tmp_path / "batch"), "--completion", "batch"])
    np.testing.assert_allclose(pd.read_csv(tmp_path / "batch" / "requests.csv").sim_latency_s, stale.sim_latency_s, rtol=1e-12)


def test_resimulate_refuses_a_contradicting_live_option(tmp_path, capsys):
    (tmp_path / "requests.csv").write_text("setting\n")
    (tmp_path / "summary.md").write_text("Reproduce: `python -m experiments.split_sim_vs_real --rounds 8 --window-s 0.3 --profile split_cpu1_specsched-pair`\n")
    with pytest.raises(SystemExit):
        parse_args(["--resimulate", str(tmp_path), "--window-s", "0.5"])
    assert "has --window-s 0.3, the command line 0.5" in capsys.readouterr().err
    args = parse_args(["--resimulate", str(tmp_path)])
    # before --pin-cpus: unpinned; before --device-sharing: the verifier a free thread; before --rtt-report: the emulated RTT
    assert (args.rounds, args.window_s, args.pin_cpus, args.device_sharing, args.rtt_report, args.profile) == (
        8, 0.3, "off", "os", "link", "split_cpu1_specsched-pair")
    (tmp_path / "summary.md").write_text("Reproduce: `python -m experiments.split_sim_vs_real --rounds zero`\n")
    with pytest.raises(SystemExit):
        parse_args(["--resimulate", str(tmp_path)])
    assert "does not parse" in capsys.readouterr().err
    import experiments.split_sim_vs_real as svr

    (tmp_path / "summary.md").unlink()
    with pytest.raises(SystemExit, match="holds no requests"):
        svr.main(["--resimulate", str(tmp_path), "--profile", PROFILE])


@pytest.mark.parametrize("make, words", [(lambda d: None, "requests.csv does not exist"),
                                          (lambda d: (d / "requests.csv").write_text("setting\n"), "no profile.yaml")])
def test_resimulate_arguments_fail_first(make, words, tmp_path, capsys):
    make(tmp_path)
    with pytest.raises(SystemExit):
        parse_args(["--resimulate", str(tmp_path)])
    assert words in capsys.readouterr().err


def test_the_model_s_ed_iteration_parts_sit_beside_the_logged_ones():
    """``ed_iteration_parts``: the model's draft, network and verify terms of each ED user (NaN for the
    others), and ``compare_parts`` averages them beside the edges' logged parts."""
    from envs.draft_tree import DraftTree

    rows = live_rows().assign(draft_ms=[3.0, 4.0, np.nan], verify_ms=[20.0, 22.0, np.nan], queue_ms=[1.0, 1.0, np.nan], network_ms=[11.0, 21.0, np.nan])
    both = simulate(rows, "edge_first", PROFILE, 0.3, None)
    ed = (both.sim_mode == "ed").to_numpy()
    assert both.loc[ed, ["sim_draft_ms", "sim_network_ms", "sim_verify_ms"]].gt(0).all(axis=None)
    assert both.loc[~ed, ["sim_draft_ms", "sim_network_ms", "sim_verify_ms"]].isna().all(axis=None)
    cost = CostModel(load_profile(PROFILE))
    split = split_model(cost.profile)
    g = int(both.sim_depth.iloc[0])
    assert both.sim_network_ms.iloc[0] == pytest.approx(1e3 * split.network_s(DraftTree.chain(g), 0.01))  # the user's own RTT (10 ms)
    # by hand for user 0: its own iterations J at its depth (realised 40 tokens, the 0.8 estimate), the
    # prefills spread over them; the ED batch is users 0 and 1 (b = 2), q = max depth + 1, c = S + N / 2
    depths = both.sim_depth[ed].to_numpy()
    e = (1 - 0.8 ** (g + 1)) / (1 - 0.8)
    j = int(np.ceil(40 / e - 1e-9))
    q, s_max, n_max = float(depths.max() + 1), 12.0, 40.0
    # the plan as the simulator made it (the round as the server saw it: deadlines less the window)
    rnd = Round.from_requests(np.array([8, 12, 6]), np.array([40, 30, 20]), np.full(3, 4.7), np.full(3, 0.8), uplink_s=0.0, downlink_s=0.0)
    rnd.has_edge, rnd.rtt_s = np.array([True, True, False]), np.array([0.01, 0.02, 0.0])
    plan = make_scheduler("edge_first", cost, EnvConfig.max_gamma, seed=0).plan(rnd)
    assert list(plan.modes[:2]) == [ED, ED] and int(plan.ed_depth[0]) == g
    verify = 1e3 * (cost.tau_l.tau1(2, s_max, s_max) + j * cost.tau_l.tau1(2, q, s_max + n_max / 2 + q)) / (j * plan.ed_share)
    draft = 1e3 * (split.edge_prefill_s(8) + j * split.edge_draft_s(0.8, DraftTree.chain(g), 8 + 40 / 2)) / j
    assert both.sim_verify_ms.iloc[0] == pytest.approx(verify, rel=1e-9) and both.sim_draft_ms.iloc[0] == pytest.approx(draft, rel=1e-9)
    parts = compare_parts(both)
    assert parts.iloc[0]["draft ms (real)"] == 3.5 and parts.iloc[0]["network ms (sim)"] == pytest.approx(both.sim_network_ms[ed].mean())
    assert compare_parts(both.drop(columns=["draft_ms"])).empty  # a run recorded before the parts were kept


def test_iteration_means_average_the_edge_log():
    from runtime.split.edge_client import IterationLog
    from runtime.split_loadgen import iteration_means

    def log(draft, compute, queue, network):
        return IterationLog("r", 0, 4, 0.0, 0.0, 0.0, draft, 0.0, queue, compute, network, 1, 0, 4, 5, False)

    got = iteration_means([log(9.0, 30.0, 1.0, 12.0), log(1.0, 10.0, 3.0, 10.0)])  # the first iteration carries the prefills
    assert got == {"draft_ms": 5.0, "verify_ms": 20.0, "queue_ms": 2.0, "network_ms": 11.0}
    assert all(np.isnan(v) for v in iteration_means([]).values())


def test_tight_deadlines_are_rejected_in_the_simulator_too():
    rows = live_rows(outcome="rejected")
    rows["deadline_s"] = 0.31  # 10 ms left after the round window
    both = simulate(rows, "edge_first", PROFILE, 0.3, None)
    assert not both.sim_served.any()
    table = compare(both)
    everyone = table[table.users == "everyone"].iloc[0]
    assert everyone["served (real)"] == 0 and everyone["served (sim)"] == 0 and everyone["served error % (sim)"] == 0


def test_compare_reports_the_errors():
    both = simulate(live_rows(latency=2.0), "edge_first", PROFILE, 0.3, None)
    table = compare(both)
    assert list(table.users) == ["ED users", "edge users", "everyone"]
    ed = table[table.users == "ED users"].iloc[0]
    assert ed.requests == 2 and ed["served (real)"] == 2
    assert ed["p50 error % (sim)"] == pytest.approx((ed["p50 (sim) (s)"] - 2.0) / 2.0 * 100)
    assert ed["same modes (%)"] == 100


@pytest.mark.parametrize("argv, words", [
    (["--schedulers", "balance"], "--schedulers"),
    (["--settings", "ed,all"], "--settings"),
    (["--rounds", "0"], "--rounds"),
    (["--tokens", "10", "5"], "--tokens"),
    (["--alpha", "1.5"], "--alpha"),
    (["--completion", "token"], "--completion"),
    (["--profile", "no_such_profile"], "--profile"),
    (["--profile", "cpu1_specsched-pair"], "must name a split profile"),
    (["--profile", PROFILE, "--no-auto-profile"], "only apply to --profile auto"),
    (["--profile", PROFILE, "--remeasure-profile"], "only apply to --profile auto"),
    (["--remeasure-profile", "--no-auto-profile"], "contradicts"),
])
def test_bad_experiment_arguments_fail_first(argv, words, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert words in capsys.readouterr().err


def test_pinning_needs_two_cpus_except_to_resimulate(monkeypatch, tmp_path, capsys):
    import experiments.split_sim_vs_real as svr

    monkeypatch.setattr(svr, "available_cpus", lambda: {0})
    assert parse_args([]).pin_cpus == "off"  # the default on one CPU
    with pytest.raises(SystemExit):
        parse_args(["--pin-cpus", "on"])
    assert "needs 2 CPUs" in capsys.readouterr().err
    (tmp_path / "requests.csv").write_text("setting\n")
    (tmp_path / "summary.md").write_text("Reproduce: `python -m experiments.split_sim_vs_real --profile split_cpu1_specsched-pair --pin-cpus on`\n")
    assert parse_args(["--resimulate", str(tmp_path)]).pin_cpus == "on"  # describes the run; nothing is pinned


def test_edge_process_placement_options():
    from runtime.edge import parse_args as edge_args

    args = edge_args(["--server", "127.0.0.1:1", "--placement", "on", "--depth", "plan", "--deadline-s", "2"])
    assert args.placement == "on" and args.depth == "plan" and args.deadline_s == 2
    with pytest.raises(SystemExit, match="plan or auto"):
        edge_args(["--server", "127.0.0.1:1", "--placement", "on", "--depth", "3"])
    with pytest.raises(SystemExit, match="--deadline-s"):
        edge_args(["--server", "127.0.0.1:1", "--placement", "on", "--deadline-s", "0"])


def test_load_generator_draws_both_kinds_within_the_ranges():
    from runtime.split_loadgen import draw_round

    users = draw_round(np.random.default_rng(0), 3, 2, 1, (10, 20), (0.5, 1.0), (5.0, 30.0), ["a", "b", "c", "d"], "mix")
    assert [u["kind"] for u in users] == ["edge", "edge", "http"]
    assert all(10 <= u["max_tokens"] <= 20 and 0.5 <= u["deadline_s"] <= 1.0 for u in users)
    assert all(0.005 <= u["rtt_s"] <= 0.03 for u in users[:2]) and users[2]["rtt_s"] == 0.0
    again = draw_round(np.random.default_rng(0), 3, 2, 1, (10, 20), (0.5, 1.0), (5.0, 30.0), ["a", "b", "c", "d"], "mix")
    assert users == again  # seeded: every scheduler sees the same users


@pytest.mark.parametrize("argv, words", [
    (["--edge-users", "0", "--http-users", "0"], "must be >= 1"),
    (["--deadline-s", "0", "1"], "--deadline-s"),
    (["--rounds", "0"], "--rounds"),
])
def test_load_generator_arguments_fail_first(argv, words, capsys):
    from runtime.split_loadgen import parse_args as loadgen_args

    with pytest.raises(SystemExit):
        loadgen_args(["--url", "http://127.0.0.1:1", "--split", "127.0.0.1:2", *argv])
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("requested", ["path", "auto"])
def test_the_experiment_end_to_end_on_the_tiny_pair(requested, tmp_path, monkeypatch):
    """``main``: a live split server and one edge user for one round, then the same round simulated;
    the report, the CSVs and the profile both sides planned with are written. ``auto``: the profile
    machine_profile resolves (here a stand-in for the 2-minute calibration, which needs the full
    pair) is the one the server and the simulator get."""
    from live_server import tiny_pair
    from test_split_serve import split_tiny_profile

    import experiments.split_sim_vs_real as svr
    from envs.profile import load_profile
    from runtime.machine_profile import PlanningProfile

    pair = tiny_pair()
    profile = split_tiny_profile(pair, tmp_path)
    asked = {}
    if requested == "auto":
        def resolve(requested_profile, **kw):
            asked.update(kw, requested=requested_profile)
            return PlanningProfile(profile, "measured", profile, {"cpu_model": "test"}, load_profile(profile))

        monkeypatch.setattr(svr, "resolve_profile", resolve)
    out = tmp_path / "out"
    from runtime.cpu_pinning import available_cpus, process_cpus

    cpus = available_cpus()
    pinned = requested == "path" and len(cpus) >= 2  # the server on one CPU, the edges on another
    server_cpus, start = [], svr.start_server

    def started(*a, **kw):
        proc, url, address = start(*a, **kw)
        server_cpus.append(os.sched_getaffinity(proc.pid))
        return proc, url, address

    monkeypatch.setattr(svr, "start_server", started)
    svr.main(["--pair", str(pair.path), "--profile", str(profile) if requested == "path" else "auto", "--schedulers", "edge_first", "--settings", "ed",
              "--rounds", "1", "--edge-users", "1", "--tokens", "4", "8", "--deadline-s", "20", "30", "--rtt-ms", "1", "2", "--window-s", "0.1",
              "--out", str(out), "--pin-cpus", "on" if pinned else "off"])
    assert server_cpus == [{min(cpus)} if pinned else cpus]
    assert all(mask == cpus for mask in process_cpus())  # every thread of this process gets its CPUs back after the live part
    if requested == "auto":
        assert asked["requested"] == "auto" and asked["edge_here"] is True and asked["base"] == "split_cpu1_specsched-pair" and asked["auto"] is True
    rows = pd.read_csv(out / "requests.csv")
    assert len(rows) == 1 and rows["outcome"].iloc[0] == "served" and rows["mode"].iloc[0] == "ed" and rows["sim_mode"].iloc[0] == "ed"
    assert rows["reported_rtt_s"].iloc[0] > rows["rtt_s"].iloc[0]  # --rtt-report measured (default): probed before the round
    summary = pd.read_csv(out / "summary.csv")
    assert {"served (real)", "served (sim)", "p50 error % (sim)"} <= set(summary.columns)
    assert (out / "profile.yaml").read_text() == profile.read_text()
    text = (out / "summary.md").read_text()
    source = "forced" if requested == "path" else "measured"
    assert f"**Planning profile** ({source}" in text and f"--profile {profile if requested == 'path' else 'auto'}" in text
    assert ("`--pin-cpus on`" in text and text.count("--pin-cpus on") == 2) if pinned else "`--pin-cpus off`" in text
    assert "--rtt-report measured" in text and "Link probes (stack ms per round trip" in text and "edge_first " in text
    parts = pd.read_csv(out / "iteration_parts.csv")  # the edge's logged parts of its iterations beside the model's
    assert len(parts) == 1 and parts["ED users"].iloc[0] == 1 and "**ED iterations, part by part**" in text
    assert (parts[["draft ms (real)", "draft ms (sim)", "network ms (real)", "network ms (sim)", "verify ms (real)", "verify ms (sim, at the ED share)"]] > 0).all(axis=None)


def test_the_emulated_rtt_ablation_plans_with_the_links_delay_alone(tmp_path):
    """``--sim-rtt emulated`` (the simulator's option, allowed on a re-simulation): the same figures as
    the records without the reported round trip; the default plans with what the edges reported, and
    a reported RTT longer than the emulated one makes no simulated ED user faster."""
    import experiments.split_sim_vs_real as svr

    live = live_rows().assign(reported_rtt_s=lambda d: np.where(d.kind == "edge", d.rtt_s + 0.004, np.nan))
    reported = simulate(live, "edge_first", PROFILE, 0.3, None)
    emulated = simulate(live, "edge_first", PROFILE, 0.3, None, sim_rtt="emulated")
    np.testing.assert_array_equal(emulated.sim_latency_s, simulate(live.drop(columns="reported_rtt_s"), "edge_first", PROFILE, 0.3, None).sim_latency_s)
    ed = (reported.sim_mode == "ed") & (emulated.sim_mode == "ed") & (reported.sim_depth == emulated.sim_depth)
    assert ed.any() and (reported.sim_latency_s[ed] >= emulated.sim_latency_s[ed]).all()
    with pytest.raises(ValueError, match="sim_rtt"):
        simulate(live, "edge_first", PROFILE, 0.3, None, sim_rtt="link")
    run = tmp_path / "run"
    run.mkdir()
    reported.drop(columns=["prompt"]).to_csv(run / "requests.csv", index=False)
    (run / "summary.md").write_text(
        "Reproduce: `python -m experiments.split_sim_vs_real --schedulers edge_first --settings mix --rounds 1 --http-users 1 --window-s 0.3 "
        f"--profile {PROFILE} --pin-cpus off --device-sharing turns --rtt-report measured`\n")
    svr.main(["--resimulate", str(run), "--out", str(tmp_path / "ablation"), "--sim-rtt", "emulated"])
    got = pd.read_csv(tmp_path / "ablation" / "requests.csv")
    np.testing.assert_allclose(got.sim_latency_s, emulated.sim_latency_s, rtol=1e-12)
    text = (tmp_path / "ablation" / "summary.md").read_text()
    assert "**Ablation** (`--sim-rtt emulated`)" in text and f"--resimulate {run} --sim-rtt emulated --out {tmp_path / 'ablation'}" in text
