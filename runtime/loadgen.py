"""Load generator: replay rounds of the environment's workload against a live server.

    python -m runtime.loadgen url=http://127.0.0.1:8011 rounds=5 output=run.csv
    python -m runtime.loadgen env=small users=20 time_scale=0.5 output=run.csv

Round ``r`` draws users from the env config exactly as the simulator does (seed sequence
``(seed, r)``); each user becomes one streamed request, all of a round's requests sent together:
a prompt of the user's input length (cut from the standard library's source), ``max_tokens`` =
its output length x ``token_scale``, ``deadline_s`` = its deadline x ``time_scale`` (scale both to
the speed of the pair being served). One CSV row per request: prompt tokens, output tokens,
deadline, mode, outcome, TTFT, latency (and the acceptance estimate the round was planned with,
and each SD request's iterations, accepted drafts and rejections). The summary (served fraction, p50/p99 latency, tokens/s)
is printed and written beside the CSV.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.evaluate import round_rng
from envs.config import EnvConfig
from envs.workload import sample_round

KNOWN = {"env", "url", "rounds", "users", "seed", "time_scale", "token_scale", "max_tokens_cap", "round_gap_s", "output", "timeout_s", "stream"}


def prompt_text(n_bytes: int, rng: np.random.Generator, corpus: bytes) -> str:
    start = int(rng.integers(0, max(len(corpus) - n_bytes - 1, 1)))
    return corpus[start : start + n_bytes].decode("utf-8", errors="ignore") or "x"


async def one_request(client, url: str, payload: dict, row: dict) -> dict:
    start = time.monotonic()
    ttft = None
    final: dict[str, Any] = {}
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=payload) as resp:
            if resp.status_code != 200:
                body = json.loads(await resp.aread())
                return {**row, "outcome": "error", "reason": body.get("error", {}).get("message", str(resp.status_code)), "latency_s": time.monotonic() - start}
            if not payload.get("stream"):
                final = json.loads(await resp.aread()).get("specsched", {})
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event["choices"][0]["text"] and ttft is None:
                        ttft = time.monotonic() - start
                    final = event.get("specsched", final)
    except Exception as err:  # a dead server is a result too: record it, keep going
        return {**row, "outcome": "error", "reason": repr(err), "latency_s": time.monotonic() - start}
    tokens = final.get("completion_tokens", 0)
    extra = {key: final.get(key) for key in ("wait_s", "plan_s", "alpha_planned", "sd_iterations", "sd_accepted", "sd_rejections")}
    return {**row, "mode": final.get("mode"), "outcome": final.get("outcome"), "reason": final.get("reason", ""), "ttft_s": ttft, "latency_s": time.monotonic() - start, "output_tokens": tokens, "server_latency_s": final.get("latency_s"), **extra}


async def replay(cfg: dict) -> pd.DataFrame:
    import httpx

    from runtime.pair import corpus

    env = EnvConfig.from_kwargs(**{**cfg["env"], "num_users": int(cfg["users"])})
    text, _ = corpus(max_files=200)
    rows = []
    async with httpx.AsyncClient(timeout=float(cfg["timeout_s"])) as client:
        for r in range(int(cfg["rounds"])):
            rnd = sample_round(round_rng(int(cfg["seed"]), r), env)
            rng = round_rng(int(cfg["seed"]), r, 2)
            tasks = []
            for k in range(rnd.num_users):
                max_tokens = int(np.clip(round(rnd.output_tokens[k] * cfg["token_scale"]), 1, cfg["max_tokens_cap"]))
                deadline = float(rnd.deadline_s[k] * cfg["time_scale"])
                prompt = prompt_text(int(rnd.input_tokens[k]), rng, text)
                row = {"round": r, "user": k, "prompt_tokens": len(prompt.encode()), "max_tokens": max_tokens, "deadline_s": deadline}
                tasks.append(one_request(client, cfg["url"], {"prompt": prompt, "max_tokens": max_tokens, "deadline_s": deadline, "stream": bool(cfg.get("stream", True))}, row))
            rows += await asyncio.gather(*tasks)
            if cfg["round_gap_s"] > 0:
                await asyncio.sleep(cfg["round_gap_s"])
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame, wall_s: float) -> pd.DataFrame:
    lat = df.latency_s[df.outcome.isin(["served", "late"])]
    return pd.DataFrame([{
        "requests": len(df),
        "served_frac": float((df.outcome == "served").mean()),
        "late": int((df.outcome == "late").sum()),
        "rejected": int((df.outcome == "rejected").sum()),
        "errors": int((df.outcome == "error").sum()),
        "latency_p50_s": float(lat.quantile(0.5)) if len(lat) else np.nan,
        "latency_p99_s": float(lat.quantile(0.99)) if len(lat) else np.nan,
        "ttft_p50_s": float(df.ttft_s.dropna().quantile(0.5)) if "ttft_s" in df and df.ttft_s.notna().any() else np.nan,
        "tokens_per_s": float(df.get("output_tokens", pd.Series(dtype=float)).fillna(0).sum() / max(wall_s, 1e-9)),
    }])


def run(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    unknown = sorted(set(cfg) - KNOWN - {"profile"})
    if unknown:
        raise ValueError(f"unknown loadgen config key(s) {unknown}; known: {sorted(KNOWN)}")
    for key, lo in (("rounds", 1), ("users", 1)):
        if not isinstance(cfg[key], int) or cfg[key] < lo:
            raise ValueError(f"loadgen '{key}' must be an integer >= {lo}, got {cfg[key]!r}")
    for key in ("time_scale", "token_scale"):
        if not cfg[key] > 0:
            raise ValueError(f"loadgen '{key}' must be > 0, got {cfg[key]!r}")
    start = time.monotonic()
    df = asyncio.run(replay(cfg))
    summary = summarize(df, time.monotonic() - start)
    if cfg.get("output"):
        out = Path(cfg["output"])
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
        summary.to_csv(out.with_name(out.stem + "_summary.csv"), index=False)
    return df, summary


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="loadgen")
    def app(raw) -> None:
        cfg = OmegaConf.to_container(raw, resolve=True)
        cfg.pop("profile", None)
        _, summary = run(cfg)
        print(summary.to_markdown(index=False, floatfmt=".3g"))

    app()


if __name__ == "__main__":
    main()
