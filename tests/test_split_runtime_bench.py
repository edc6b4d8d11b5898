"""Split runtime III: the benchmark's comparison rules and its entry point, and gpu_check.sh
without CUDA."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.split_bench import parse_args
from experiments.split_bench_analysis import best_baseline, checks

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_best_baseline_is_the_fastest_within_the_itl():
    base = pd.DataFrame({"batch": [1, 4, 8], "gamma": [4, 4, 4], "tokens_per_s": [100.0, 300.0, 500.0], "itl_ms": [5.0, 8.0, 12.0]})
    ref, within = best_baseline(base, 10.0)
    assert within and ref.tokens_per_s == 300.0
    ref, within = best_baseline(base, 3.0)  # nothing is as fast: the lowest-ITL configuration, flagged
    assert not within and ref.batch == 1


def test_checks_name_every_target():
    df = pd.DataFrame({"rtt_ms": [5.0] * 4, "proactive": ["on", "on", "off", "off"], "cohorts": [1, 2, 1, 2],
                       "throughput_ratio": [1.0, 1.3, 0.9, 1.2], "itl_ms": [9.0, 8.0, 10.0, 9.0], "server_utilisation": [0.4, 0.8, 0.4, 0.7]})
    text = "\n".join(checks(df))
    assert "1.30x" in text and "10.0 % lower" in text and "2.00x" in text and "1.75x" in text
    assert "ITL >= 5 % lower in 2 of 2" in text
    assert "all cells at RTT 5 ms: >= 1.15x in 2 of 4\n" in text + "\n"  # no paired ratio, no client counts: nothing more
    assert ">= 1.5x in 2 of 2; the ceiling 1/u1 reaches 1.5x in 2 of them, and the target is met in 2 of those" in text
    capped = df.assign(server_utilisation=[0.8, 0.99, 0.5, 0.7])  # proactive on: ceiling 1.25x; off: 1.4x of a 2x ceiling
    assert ">= 1.5x in 0 of 2; the ceiling 1/u1 reaches 1.5x in 1 of them, and the target is met in 0 of those" in "\n".join(checks(capped))


@pytest.mark.parametrize("args", [["--rtt-ms", "-1"], ["--proactive", "maybe"], ["--cohorts", "0"], ["--max-new-tokens", "1"], ["--repeats", "0"],
                                  ["--clients", "8,8"], ["--rtt-ms", "5,5"], ["--sweep-clients", "2,2"]])
def test_bad_arguments_fail_fast(args, tmp_path):
    with pytest.raises(SystemExit):
        parse_args(["--out", str(tmp_path), *args])


def test_gpu_check_skips_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "skipped: no CUDA" in res.stdout


@pytest.mark.slow
def test_split_bench_end_to_end(pair, tmp_path):
    res = subprocess.run([sys.executable, "-m", "experiments.split_bench", "--out", str(tmp_path), "--preset", "tiny", "--rtt-ms", "5",
                          "--proactive", "on", "--cohorts", "1,2", "--clients", "2", "--requests", "1", "--max-new-tokens", "8", "--repeats", "2"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    df, runs = pd.read_csv(tmp_path / "split_bench.csv"), pd.read_csv(tmp_path / "split_bench_runs.csv")
    assert len(df) == 2 and {"rtt_ms", "proactive", "cohorts", "throughput_ratio", "itl_ms", "server_utilisation"} <= set(df.columns)
    assert len(runs) == 4 and sorted(runs.repeat) == [0, 0, 1, 1] and (df.repeats == 2).all()
    for _, cell in df.iterrows():  # a cell is the mean of its two runs
        mine = runs[runs.cohorts == cell.cohorts]
        assert cell.itl_ms == pytest.approx(mine.itl_ms.mean()) and cell.itl_ms_min == pytest.approx(mine.itl_ms.min())
    assert len(list((tmp_path / "runs").iterdir())) == 4
    assert (df.throughput_ratio > 0).all() and (tmp_path / "split_bench.md").read_text().count("target") >= 2
    sweeps = pd.read_csv(tmp_path / "baseline_sweeps.csv")  # before each repeat and after the last
    assert sorted(set(sweeps.sweep)) == [0, 1, 2] and (df.throughput_ratio_paired > 0).all()
    for _, cell in df.iterrows():  # the paired ratio is the mean of the cell's runs' ratios against their own sweeps
        assert cell.throughput_ratio_paired == pytest.approx(runs[runs.cohorts == cell.cohorts].throughput_ratio.mean())


def test_best_baseline_ranks_by_the_chosen_throughput():
    base = pd.DataFrame({"batch": [4, 8], "gamma": [4, 4], "tokens_per_s": [300.0, 200.0], "tokens_per_cpu_s": [310.0, 400.0], "itl_ms": [5.0, 6.0]})
    assert best_baseline(base, 10.0)[0].batch == 4
    assert best_baseline(base, 10.0, "tokens_per_cpu_s")[0].batch == 8


def test_cpu_sampler_reads_this_process_cpu_inside_a_window():
    import os
    import time

    from experiments.process_cpu import CpuSampler

    sampler = CpuSampler(os.getpid(), period_s=0.005)
    time.sleep(0.05)
    start, cpu0 = time.time(), time.process_time()
    while time.process_time() - cpu0 < 0.3:  # burn 0.3 s of CPU, however loaded the machine is
        sum(i * i for i in range(1000))
    end = time.time()
    time.sleep(0.05)
    sampler.stop()
    busy = sampler.between(start, end)
    assert busy is not None and 0.2 < busy < 0.5  # 0.3 s of CPU (10 ms ticks, the sampler's own)
    assert sampler.between(start - 60, end) is None  # a window the samples do not cover


def test_verify_timing_times_every_schedule(tmp_path):
    from tiny_models import tiny

    from runtime.split.verify_timing import SCHEDULES, run, summarise

    df = run(tiny(2, 32), batches=[1, 3], buckets=[1, 16], depth=3, start=5, stop=21, step=4, repeats=2)
    assert set(df.schedule) == set(SCHEDULES) and set(df.bucket) == {1, 16} and set(df.batch) == {1, 3}
    assert len(df) == 2 * 2 * (2 + 4 + 4) and (df.ms > 0).all()
    assert {(s["bucket"], s["batch"], s["schedule"]) for s in summarise(df)} == {(b, n, s) for b in (1, 16) for n in (1, 3) for s in SCHEDULES}


def test_cohort_alternation_counts_cohort_switches_between_batches():
    from experiments.split_bench_analysis import cohort_alternation

    def it(start, cohort):
        return {"arrived_at": start, "queue_wait_ms": 0.0, "cohort": cohort}

    taking_turns = [it(0.0, 0), it(0.0, 0), it(0.1, 1), it(0.2, 0), it(0.3, 1)]  # two rows in the first batch
    assert cohort_alternation(taking_turns) == 1.0
    assert cohort_alternation([it(0.0, 0), it(0.1, 0), it(0.2, 1)]) == 0.5
    assert cohort_alternation([it(0.0, 0)]) is None


def test_headline_is_the_best_ratio_at_the_first_rtt_and_checks_group_by_clients():
    from experiments.split_bench_analysis import best_split

    df = pd.DataFrame({"rtt_ms": [5.0, 5.0, 5.0, 5.0, 10.0], "clients": [8, 8, 32, 32, 32], "proactive": ["on", "off", "on", "off", "off"],
                       "cohorts": [2, 2, 2, 2, 2], "throughput_ratio": [0.9, 1.0, 1.1, 1.2, 3.0], "itl_ms": [10.0, 10.0, 20.0, 22.0, 30.0],
                       "server_utilisation": [0.5] * 5, "throughput": ["cpu"] * 5, "baseline_itl_ms": [9.0, 9.0, 19.0, 21.0, 29.0],
                       "baseline_batch": [8, 8, 32, 64, 64], "baseline_gamma": [4] * 5})
    best = best_split(df)
    assert best.clients == 32 and best.proactive == "off"  # the 3.0x at 10 ms is not the 5 ms headline
    text = "\n".join(checks(df))
    assert "1.20x" in text and "32 clients, 2 cohort(s), proactive off" in text
    assert "RTT 5 ms, 8 clients, 2 cohort(s): ITL 10.00 vs 10.00 ms" in text and "RTT 5 ms, 32 clients, 2 cohort(s): ITL 20.00 vs 22.00 ms" in text


def test_drafted_hit_rate_counts_only_iterations_that_drafted_ahead():
    from experiments.split_bench_analysis import drafted_hit_rate

    def it(rid, k, ms, hit):
        return {"request_id": rid, "iteration": k, "proactive_ms": ms, "proactive_hit": hit}

    logs = [it("a", 0, 1.0, True), it("a", 1, 0.0, False), it("a", 2, 1.0, False), it("a", 3, 1.0, False),  # the last iteration has no next block
            it("b", 0, 2.0, True), it("b", 1, 0.0, False)]
    assert drafted_hit_rate(logs) == 2 / 3
    assert drafted_hit_rate([it("a", 0, 0.0, False), it("a", 1, 0.0, False)]) is None


def test_verify_vs_engine_splits_cpu_per_token_into_its_parts(tmp_path):
    from types import SimpleNamespace

    from tiny_models import tiny_trio

    from runtime.split.verify_timing import vs_engine, vs_engine_table

    target, close, _ = tiny_trio()
    pair = SimpleNamespace(target=target, draft=close, tokenizer=SimpleNamespace(encode=lambda text: [1 + ord(c) % 30 for c in text[:9]]))
    df = vs_engine(pair, batches=[1, 2], depths=[2], max_new=4, repeats=1)
    assert set(df.side) == {"engine", "split"} and len(df) == 4
    assert (df.tokens == df.batch * 4).all()  # both sides emit every requested token
    assert (df[df.side == "split"].draft_ms_per_token == 0).all() and (df[df.side == "engine"].draft_ms_per_token > 0).all()
    assert (df.target_ms_per_token > 0).all() and (df.cpu_ms_per_token >= df.target_ms_per_token).all()
    table = vs_engine_table(df)
    assert list(table.batch) == [1, 2] and (table.engine_cpu_per_split_cpu > 0).all()


def test_cell_means_average_a_cells_repeats_and_keep_their_spread():
    import json

    from experiments.split_bench_analysis import cell_means

    def run(rtt, itl, util, repeat, hit=None, outcomes=None):
        return {"rtt_ms": rtt, "proactive": "on", "cohorts": 2, "clients": 8, "depth": "auto", "itl_ms": itl, "server_utilisation": util,
                "proactive_hit_rate_drafted": hit, "network_ms": float("nan") if repeat else 6.0, "outcomes": json.dumps(outcomes or {"length": 16}),
                "repeat": repeat}

    cells = cell_means([run(5.0, 10.0, 0.8, 0, 0.9), run(20.0, 7.0, 0.5, 0), run(5.0, 14.0, 0.6, 1, 0.7, {"length": 15, "error": 1})])
    assert [c["rtt_ms"] for c in cells] == [5.0, 20.0] and [c["repeats"] for c in cells] == [2, 1]
    five = cells[0]
    assert five["itl_ms"] == 12.0 and five["itl_ms_min"] == 10.0 and five["itl_ms_max"] == 14.0
    assert five["server_utilisation"] == pytest.approx(0.7) and five["server_utilisation_min"] == 0.6 and five["server_utilisation_max"] == 0.8
    assert five["proactive_hit_rate_drafted"] == pytest.approx(0.8) and five["network_ms"] == 6.0  # a NaN repeat does not poison the mean
    assert json.loads(five["outcomes"]) == {"length": 31, "error": 1} and "repeat" not in five
    assert cells[1]["proactive_hit_rate_drafted"] is None and cells[1]["itl_ms_min"] == cells[1]["itl_ms_max"] == 7.0


def test_cell_means_keep_every_grid_setting_apart_and_skip_missing_values_in_the_spread():
    import json

    import numpy as np

    from experiments.split_bench_analysis import CELL, cell_means

    base = {"rtt_ms": 5.0, "proactive": "on", "cohorts": 1, "clients": 8, "depth": "auto", "server_utilisation": 0.5, "outcomes": json.dumps({}),
            "within": True, "count": np.int64(4)}
    variants = [{}, {"proactive": "off"}, {"clients": 16}, {"cohorts": 2}, {"depth": "3"}, {"rtt_ms": 10.0}]
    rows = [{**base, **v, "itl_ms": 10.0, "repeat": 0} for v in variants]
    assert len(cell_means(rows)) == len(variants) == len(CELL) + 1  # every setting of the grid names its own cell
    nan_first = [{**base, "itl_ms": float("nan"), "within": False, "count": np.int64(2), "repeat": 0}, {**base, "itl_ms": 12.0, "repeat": 1}]
    for runs in (nan_first, nan_first[::-1]):  # a failed run's NaN, first or last, is left out of the mean and the spread alike
        cell, = cell_means(runs)
        assert cell["itl_ms"] == cell["itl_ms_min"] == cell["itl_ms_max"] == 12.0
        assert cell["within"] == 0.5 and cell["count"] == 3.0  # a bool: the share of True; numpy integers are numbers


def test_a_run_is_paired_with_the_sweeps_either_side_of_its_repeat():
    from experiments.split_bench_analysis import (
        compare,
        mean_sweep,
        paired_baseline,
        with_paired_ratio,
    )

    def sweep(speed):  # two configurations; the host's speed scales both
        return pd.DataFrame({"batch": [4, 8], "gamma": [4, 4], "tokens_per_s": [100.0 * speed, 150.0 * speed],
                             "tokens_per_cpu_s": [100.0 * speed, 150.0 * speed], "itl_ms": [5.0, 8.0]})

    sweeps = [sweep(1.0), sweep(2.0), sweep(3.0)]  # the host sped up over the grid
    assert paired_baseline(sweeps, 0).tokens_per_s.tolist() == [150.0, 225.0]  # mean of sweeps 0 and 1
    assert paired_baseline(sweeps, 1).tokens_per_s.tolist() == [250.0, 375.0]
    assert paired_baseline(sweeps[:1], 5).equals(sweeps[0])  # one given sweep pairs with every run
    with pytest.raises(ValueError, match="repeat 2"):
        paired_baseline(sweeps, 2)
    assert mean_sweep([s.assign(sweep=i) for i, s in enumerate(sweeps)]).tokens_per_s.tolist() == [200.0, 300.0]
    cell = {"rtt_ms": 5.0, "proactive": "on", "cohorts": 1, "clients": 8, "depth": "auto", "itl_ms": 10.0}
    runs = pd.DataFrame([compare({**cell, "server_tokens_per_cpu_s": 450.0, "server_tokens_per_busy_s": 450.0, "server_tokens_per_s": 450.0},
                                 paired_baseline(sweeps, r), "cpu") for r in (0, 1)])
    assert runs.throughput_ratio.tolist() == [2.0, 1.2]  # 450 / 225, 450 / 375: each against its own time
    cells = pd.DataFrame([compare({**cell, "server_tokens_per_cpu_s": 450.0, "server_tokens_per_busy_s": 450.0, "server_tokens_per_s": 450.0},
                                  mean_sweep(sweeps), "cpu")])
    out = with_paired_ratio(cells, runs)
    assert out.throughput_ratio.iloc[0] == 1.5  # against the mean of all sweeps
    assert out.throughput_ratio_paired.iloc[0] == pytest.approx(1.6)
    assert (out.throughput_ratio_paired_min.iloc[0], out.throughput_ratio_paired_max.iloc[0]) == (1.2, 2.0)
    text = "\n".join(checks(out.assign(baseline_itl_ms=8.0, baseline_batch=8, baseline_gamma=4, server_utilisation=0.5)))
    assert "paired in time" in text and "1.60x, runs 1.20-2.00x" in text and ">= 1.15x in 1 of 1 (1 by the paired ratio)" in text


@pytest.mark.parametrize("repeats, given", [(1, False), (3, False), (2, True)])
def test_main_sweeps_the_baseline_before_every_repeat_and_after_the_last(repeats, given, tmp_path, monkeypatch):
    import types

    import experiments.split_bench as sb
    import runtime.pair

    events: list[str] = []

    def sweep(speed):
        return pd.DataFrame({"batch": [2], "gamma": [4], "tokens_per_s": [100.0 * speed], "tokens_per_cpu_s": [100.0 * speed], "itl_ms": [1.0]})

    def fake_sweep(args, pair):
        events.append("sweep")
        return sweep(events.count("sweep"))  # the host gets faster with every sweep: 100, 200, 300 ... tok/s

    def fake_row(args, rtt, proactive, cohorts, clients, run):
        events.append("run")
        speed = 600.0
        return {"rtt_ms": rtt, "proactive": proactive, "cohorts": cohorts, "clients": clients, "depth": args.depth, "itl_ms": 5.0,
                "server_tokens_per_cpu_s": speed, "server_tokens_per_busy_s": speed, "server_tokens_per_s": speed, "server_utilisation": 0.5,
                "outcomes": json.dumps({"length": 2})}

    monkeypatch.setattr(runtime.pair, "build_pair", lambda **kw: tmp_path)
    monkeypatch.setattr(runtime.pair, "load_pair", lambda *a, **kw: types.SimpleNamespace())
    monkeypatch.setattr(sb, "baseline_sweep", fake_sweep)
    monkeypatch.setattr(sb, "split_run", lambda *a: {})
    monkeypatch.setattr(sb, "run_row", fake_row)
    given_args = []
    if given:
        sweep(10).to_csv(tmp_path / "given.csv", index=False)
        given_args = ["--baseline", str(tmp_path / "given.csv")]
    out = tmp_path / "out"
    sb.main(["--out", str(out), "--rtt-ms", "5", "--clients", "2", "--proactive", "on", "--cohorts", "1,2", "--repeats", str(repeats),
             "--pin-cpus", "off", *given_args])
    per_repeat = ["run", "run"]  # two cells
    expected = per_repeat * repeats if given else sum((["sweep", *per_repeat] for _ in range(repeats)), []) + ["sweep"]
    assert events == expected
    runs, cells = pd.read_csv(out / "split_bench_runs.csv"), pd.read_csv(out / "split_bench.csv")
    sweeps = pd.read_csv(out / "baseline_sweeps.csv")
    if given:
        assert (runs.baseline_tokens_per_s == 1000.0).all() and list(sweeps.sweep) == [0]
        assert (cells.throughput_ratio_paired == cells.throughput_ratio).all() and "not swept here" in (out / "split_bench.md").read_text()
    else:
        assert list(sweeps.sweep) == list(range(repeats + 1))
        # repeat r's runs against the mean of sweeps r and r + 1: (100 (r + 1) + 100 (r + 2)) / 2 tok/s
        assert runs.baseline_tokens_per_s.tolist() == [100.0 * r + 150.0 for r in range(repeats) for _ in per_repeat]
        assert cells.baseline_tokens_per_s.tolist() == [50.0 * (repeats + 2)] * 2  # the mean of all sweeps
        paired = sum(600.0 / (100.0 * r + 150.0) for r in range(repeats)) / repeats
        assert cells.throughput_ratio_paired.tolist() == pytest.approx([paired] * 2)
