"""Load generator: replay rounds of the environment's workload against a live server.

    python -m runtime.loadgen url=http://127.0.0.1:8011 rounds=5 output=run.csv
    python -m runtime.loadgen env=small users=20 time_scale=0.5 output=run.csv
    python -m runtime.loadgen rounds=10 users=64 wait_rounds=false output=burst.csv   # a burst: every round at once

Round ``r`` draws users from the env config exactly as the simulator does (seed sequence
``(seed, r)``); each user becomes one request (streamed unless ``stream=false``), all of a round's
requests sent together: a prompt of the user's input length (cut from the standard library's
source), ``max_tokens`` = its output length x ``token_scale``, ``deadline_s`` = its deadline x
``time_scale`` (scale both to the speed of the pair being served). With ``wait_rounds=true`` a
round starts when the previous one is answered (plus ``round_gap_s``); with ``false`` round ``r``
starts at ``r x round_gap_s`` whatever is still running (0: a burst of every round at once).

Each request carries its send time (``X-Request-Start: t=<µs since the epoch>``, the moment its
latency clock starts), so the server counts its deadline from when it was sent.

One CSV row per request, **written and flushed as soon as it is answered**: prompt tokens, output
tokens, deadline, mode, outcome, reason, TTFT, latency, the server's timings, the acceptance
estimate its round was planned with and, for SD, the engine's iterations, accepted drafts and
rejections. Ctrl-C or SIGTERM stops sending, keeps every answered row and writes the summary of
those (served fraction, p50/p99 latency, tokens/s) beside the CSV. The command exits non-zero when
every request failed (outcome ``error``: the server unreachable, or 5xx).
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from agents.artefacts import check_writable
from envs.config import EnvConfig, is_number
from envs.workload import round_rng, sample_round
from runtime.admission import sent_header_value
from runtime.lean_http import post_json

KNOWN = {"env", "url", "rounds", "users", "seed", "time_scale", "token_scale", "max_tokens_cap", "round_gap_s", "output", "timeout_s", "stream", "wait_rounds"}
COLUMNS = ["round", "user", "prompt_tokens", "max_tokens", "deadline_s", "status", "mode", "outcome", "reason", "ttft_s", "latency_s", "output_tokens",
           "server_latency_s", "sent_lead_s", "wait_s", "plan_s", "alpha_planned", "sd_iterations", "sd_accepted", "sd_rejections"]
SUMMARY_KEYS = ("sent_lead_s", "wait_s", "plan_s", "alpha_planned", "sd_iterations", "sd_accepted", "sd_rejections")


def prompt_text(n_bytes: int, rng: np.random.Generator, corpus: bytes) -> str:
    start = int(rng.integers(0, max(len(corpus) - n_bytes - 1, 1)))
    return corpus[start : start + n_bytes].decode("utf-8", errors="ignore") or "x"


def _row(row: dict, start: float, status: int | None, final: dict, ttft: float | None, reason: str = "") -> dict:
    out = {**row, "status": status, "mode": final.get("mode"), "outcome": final.get("outcome") or "error", "reason": final.get("reason") or reason,
           "ttft_s": ttft, "latency_s": time.monotonic() - start, "output_tokens": final.get("completion_tokens", 0), "server_latency_s": final.get("latency_s")}
    out.update({key: final.get(key) for key in SUMMARY_KEYS})
    return out


async def one_request(url: str, payload: dict, row: dict, timeout_s: float) -> dict:
    """Send one request (its own connection, :mod:`runtime.lean_http`); the row always has an
    outcome (``error`` when no server outcome came back). The request carries its send time
    (``X-Request-Start``), the moment its client clock starts: the server counts its deadline from
    there, not from when it got round to reading it."""
    start = time.monotonic()
    stamp = {"X-Request-Start": sent_header_value(time.time())}
    ttft = None
    final: dict[str, Any] = {}
    try:
        async with asyncio.timeout(timeout_s), post_json(url, "/v1/completions", payload, stamp) as resp:
            if resp.status != 200:  # 429 rejected / 500 error carry the server's outcome; 4xx / 503 do not
                body = json.loads(await resp.read())
                message = body.get("error", {}).get("message", str(resp.status))
                return _row(row, start, resp.status, body.get("specsched") or {}, None, f"HTTP {resp.status}: {message}")
            if not payload.get("stream"):
                final = json.loads(await resp.read()).get("specsched", {})
            else:
                async for line in resp.lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event["choices"] and event["choices"][0].get("text") and ttft is None:
                        ttft = time.monotonic() - start
                    final = event.get("specsched", final)
            return _row(row, start, resp.status, final, ttft, "" if final else "stream ended without an outcome")
    except Exception as err:  # a dead server is a result too: record it, keep going
        return _row(row, start, None, {}, ttft, repr(err))


class RowWriter:
    """The CSV, one flushed row per answered request (a killed run keeps what it had)."""

    def __init__(self, path: str | Path | None):
        self.rows: list[dict] = []
        self.path = Path(path) if path else None
        self._fh = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("w", newline="")
            self._csv = csv.DictWriter(self._fh, fieldnames=COLUMNS, extrasaction="ignore")
            self._csv.writeheader()
            self._fh.flush()

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self._fh:
            self._csv.writerow(row)
            self._fh.flush()

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None


async def replay(cfg: dict, writer: RowWriter) -> None:
    from runtime.pair import corpus

    env = EnvConfig.from_kwargs(**{**cfg["env"], "num_users": int(cfg["users"])})
    text, _ = corpus(max_files=200)
    wait = bool(cfg.get("wait_rounds", True))

    async def send(r: int) -> None:
        rnd = sample_round(round_rng(int(cfg["seed"]), r), env)
        rng = round_rng(int(cfg["seed"]), r, 2)
        tasks = []
        for k in range(rnd.num_users):
            max_tokens = int(np.clip(round(rnd.output_tokens[k] * cfg["token_scale"]), 1, cfg["max_tokens_cap"]))
            deadline = float(rnd.deadline_s[k] * cfg["time_scale"])
            prompt = prompt_text(int(rnd.input_tokens[k]), rng, text)
            row = {"round": r, "user": k, "prompt_tokens": len(prompt.encode()), "max_tokens": max_tokens, "deadline_s": deadline}
            payload = {"prompt": prompt, "max_tokens": max_tokens, "deadline_s": deadline, "stream": bool(cfg.get("stream", True))}
            tasks.append(asyncio.ensure_future(one_request(cfg["url"], payload, row, float(cfg["timeout_s"]))))
        for done in asyncio.as_completed(tasks):
            writer.add(await done)

    if wait:
        for r in range(int(cfg["rounds"])):
            await send(r)
            if cfg["round_gap_s"] > 0:
                await asyncio.sleep(cfg["round_gap_s"])
    else:
        async def later(r: int) -> None:
            await asyncio.sleep(r * cfg["round_gap_s"])
            await send(r)

        await asyncio.gather(*[later(r) for r in range(int(cfg["rounds"]))])


def summarize(df: pd.DataFrame, wall_s: float) -> pd.DataFrame:
    if df.empty:
        df = pd.DataFrame(columns=COLUMNS)
    lat = df.latency_s[df.outcome.isin(["served", "late"])]
    ttft = pd.to_numeric(df.ttft_s, errors="coerce").dropna()
    return pd.DataFrame([{
        "requests": len(df),
        "served_frac": float((df.outcome == "served").mean()) if len(df) else np.nan,
        "late": int((df.outcome == "late").sum()),
        "rejected": int((df.outcome == "rejected").sum()),
        "errors": int((df.outcome == "error").sum()),
        "latency_p50_s": float(lat.quantile(0.5)) if len(lat) else np.nan,
        "latency_p99_s": float(lat.quantile(0.99)) if len(lat) else np.nan,
        "ttft_p50_s": float(ttft.quantile(0.5)) if len(ttft) else np.nan,
        "tokens_per_s": float(pd.to_numeric(df.output_tokens, errors="coerce").fillna(0).sum() / max(wall_s, 1e-9)),
    }])


def validate(cfg: dict) -> None:
    unknown = sorted(set(cfg) - KNOWN - {"profile"})
    if unknown:
        raise ValueError(f"unknown loadgen config key(s) {unknown}; known: {sorted(KNOWN)}")
    for key, lo in (("rounds", 1), ("users", 1), ("max_tokens_cap", 1)):
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] < lo:
            raise ValueError(f"loadgen '{key}' must be an integer >= {lo}, got {cfg.get(key)!r}")
    seed = cfg.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"loadgen 'seed' must be an integer in [0, 2**32), got {seed!r}")
    # finite: an infinite time scale sent infinite deadlines, an infinite gap waited forever
    for key in ("time_scale", "token_scale", "timeout_s"):
        if not is_number(cfg.get(key)) or not 0 < cfg[key] < math.inf:
            raise ValueError(f"loadgen '{key}' must be a finite number > 0, got {cfg.get(key)!r}")
    if not is_number(cfg.get("round_gap_s")) or not 0 <= cfg["round_gap_s"] < math.inf:
        raise ValueError(f"loadgen 'round_gap_s' must be a finite number >= 0, got {cfg.get('round_gap_s')!r}")
    url = cfg.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"loadgen 'url' must be an http(s)://HOST[:PORT] address, got {url!r}")
    if cfg.get("output"):
        check_writable(cfg["output"], "loadgen 'output'")



def _write_summary(path: Path, summary: pd.DataFrame) -> None:
    out = path.with_name(path.stem + "_summary.csv")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    summary.to_csv(tmp, index=False)
    tmp.replace(out)  # atomic: a reader never sees half a summary


def run(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replay the workload; returns (rows, summary). Interrupted (Ctrl-C / SIGTERM), it keeps the
    answered rows and summarises those; ``summary.interrupted`` says so."""
    validate(cfg)
    writer = RowWriter(cfg.get("output"))
    start = time.monotonic()
    interrupted = False
    try:
        asyncio.run(replay(cfg, writer))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        writer.close()
    df = pd.DataFrame(writer.rows, columns=COLUMNS) if writer.rows else pd.DataFrame(columns=COLUMNS)
    summary = summarize(df, time.monotonic() - start).assign(interrupted=interrupted)
    if cfg.get("output"):
        _write_summary(Path(cfg["output"]), summary)
    return df, summary


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="loadgen")
    def app(raw) -> None:
        cfg = OmegaConf.to_container(raw, resolve=True)
        cfg.pop("profile", None)

        def on_term(signum, frame):  # SIGTERM ends the run like Ctrl-C: answered rows are kept
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        _, summary = run(cfg)
        print(summary.to_markdown(index=False, floatfmt=".3g"))
        s = summary.iloc[0]
        if s.requests == 0 or s.errors == s.requests:
            raise SystemExit(f"every request failed ({int(s.errors)} of {int(s.requests)})")

    app()


if __name__ == "__main__":
    main()
