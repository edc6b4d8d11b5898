"""Calibration of the cost model and the workload defaults, written to ``results/calibration.md``.

    python -m experiments.calibration [--rounds 20]

1. **Fig. 1 of the paper**: one request with 500 input tokens on the RTX 4090 profile
   (Llama-2-7B + TinyLlama-1.1B): SD vs AD end-to-end compute latency and GPU memory. The paper
   reports SD -39.1 % latency and +18.3 % memory. The paper does not give the output length or
   acceptance of that request; we show a grid and take output 256, alpha 0.8, gamma 4 as the
   headline.
2. **Workload defaults**: the paper's 1..1000-token ranges cannot let 70 % of K = 70 users fit the
   ~8.5 GB of KV left on a 24 GiB card (one 1000-token context of Llama-2-7B takes 0.5 GB), so the
   input/output ranges are calibrated so that BALANCE serves ~70 % at K = 70 (balance.md §4). This
   is a choice, so it is made on **validation** rounds (``envs.workload``'s streams): the test rounds
   every published table reports chose nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from agents.artefacts import require_writable, write_text_atomic
from agents.evaluate import evaluate_schedulers
from envs.config import EnvConfig
from envs.cost_model import CostModel, sd_iterations
from envs.profile import load_profile

RESULTS = Path(__file__).resolve().parent.parent / "results"


def fig1(profile: str = "rtx4090_llama2-7b_tinyllama-1.1b", inp: int = 500) -> tuple[pd.DataFrame, dict]:
    cost = CostModel(load_profile(profile))
    rows = []
    for out in (128, 256, 500):
        for alpha in (0.7, 0.8, 0.9):
            ad = float(cost.ad_time(1, inp, out))
            sd = float(cost.sd_time(1, inp, out, sd_iterations(out, alpha, 4), 4))
            rows.append({"output tokens": out, "alpha": alpha, "AD latency (s)": ad, "SD latency (s)": sd, "SD vs AD (%)": (sd / ad - 1) * 100})
    out = 256
    mem_ad = cost.w_l + cost.reserve_bytes + float(cost.ad_memory(1, inp, out, out))
    mem_sd = cost.w_l + cost.w_s + cost.reserve_bytes + float(cost.sd_memory(1, inp, out, out, 4))
    raw_ad = cost.w_l + float(cost.ad_memory(1, inp, out, out))
    raw_sd = cost.w_l + cost.w_s + float(cost.sd_memory(1, inp, out, out, 4))
    mem = {
        "AD memory (GB, with reserve)": mem_ad / 1e9,
        "SD memory (GB, with reserve)": mem_sd / 1e9,
        "SD vs AD memory (%, with reserve)": (mem_sd / mem_ad - 1) * 100,
        "SD vs AD memory (%, weights + KV only)": (raw_sd / raw_ad - 1) * 100,
    }
    return pd.DataFrame(rows), mem


def workload(rounds: int) -> pd.DataFrame:
    rows = []
    for imax, omax in [(1000, 1000), (1000, 100), (300, 300), (200, 200), (160, 160), (128, 128)]:
        cfg = EnvConfig(num_users=70, input_tokens=[1, imax], output_tokens=[1, omax])
        # a choice: validation rounds, never the test rounds the paper tables report (experiments.paper, seed 0)
        df = evaluate_schedulers(cfg, ["balance", "ad_only", "sd_only"], rounds=rounds, seed=0, split="validation")
        frac = (df.served / df.num_users).groupby(df.scheduler).mean()
        rows.append({"input range": f"1..{imax}", "output range": f"1..{omax}", **{f"{k} served": frac[k] for k in ("balance", "ad_only", "sd_only")}})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    require_writable(args.out, "--out", directory=True)
    start = time.perf_counter()
    lat, mem = fig1()
    wl = workload(args.rounds)
    head = lat[(lat["output tokens"] == 256) & np.isclose(lat["alpha"], 0.8)].iloc[0]
    text = "\n".join(
        [
            "# Calibration",
            "",
            "## Fig. 1: one request, 500 input tokens, RTX 4090, Llama-2-7B + TinyLlama-1.1B, gamma = 4",
            "",
            lat.to_markdown(index=False, floatfmt=".3f"),
            "",
            pd.DataFrame([mem]).T.rename(columns={0: "output 256"}).to_markdown(floatfmt=".2f"),
            "",
            f"Headline (output 256, alpha 0.8): SD {head['SD vs AD (%)']:+.1f} % latency (paper -39.1 %), "
            f"{mem['SD vs AD memory (%, with reserve)']:+.1f} % memory with the 1.5 GB reserve counted, "
            f"{mem['SD vs AD memory (%, weights + KV only)']:+.1f} % without (paper +18.3 %). The profile's efficiency "
            "factors (bandwidth 0.8, FLOP/s 0.6, 0.1 ms launch overhead per layer) were set from first principles, "
            "not fitted to this figure; the memory gap is left as is (the paper's measurement likely includes "
            "activation and allocator overheads of the second model that the model does not count).",
            "",
            f"## Workload: K = 70, BALANCE's served fraction by input/output range ({args.rounds} validation rounds, seed 0)",
            "",
            wl.to_markdown(index=False, floatfmt=".3f"),
            "",
            "Chosen defaults (conf/env/paper.yaml, envs/config.py): input and output 1..160 tokens, deadlines "
            "U[0.5, 13] s, alpha U[0.6, 0.95], gamma 4 -- BALANCE then serves ~70 % at K = 70 (paper: 70.4 %). "
            "The paper's second anchor (62.9 % at T_max = 1 s) cannot hold at the same time on this cost model: "
            "Llama-2-7B decodes ~50 tokens/s on an RTX 4090, so a 1 s deadline admits only outputs of a few dozen "
            "tokens (results/deadline.md).",
            "",
            f"Reproduce: `python -m experiments.calibration --rounds {args.rounds}` ({time.perf_counter() - start:.0f} s here).",
            "",
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "calibration.md", text)
    print(text)


if __name__ == "__main__":
    main()
