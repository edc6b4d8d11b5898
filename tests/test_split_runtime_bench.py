"""Split runtime III: the benchmark's comparison rules and its entry point, and gpu_check.sh
without CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.split_bench import best_baseline, checks, parse_args

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


@pytest.mark.parametrize("args", [["--rtt-ms", "-1"], ["--proactive", "maybe"], ["--cohorts", "0"], ["--max-new-tokens", "1"]])
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
                          "--proactive", "on", "--cohorts", "1,2", "--clients", "2", "--requests", "1", "--max-new-tokens", "8"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    df = pd.read_csv(tmp_path / "split_bench.csv")
    assert len(df) == 2 and {"rtt_ms", "proactive", "cohorts", "throughput_ratio", "itl_ms", "server_utilisation"} <= set(df.columns)
    assert (df.throughput_ratio > 0).all() and (tmp_path / "split_bench.md").read_text().count("target") >= 2
