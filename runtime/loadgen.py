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

Exactly one CSV row per request sent, **written and flushed as soon as it is answered**: prompt
tokens, output tokens, deadline, mode, outcome, reason, TTFT, latency, the server's timings, the
acceptance estimate its round was planned with and, for SD, the engine's iterations, accepted
drafts and rejections. Ctrl-C or SIGTERM stops sending; the requests still in flight get
``STOP_GRACE_S`` to be answered, and each one that is not gets a row of its own with outcome
``interrupted`` (no status, no latency: the server may still answer it, nobody listens). The
summary beside the CSV counts them apart: ``requests`` (every one sent) = ``answered`` +
``in_flight_at_stop``; served fraction, p50/p99 latency and tokens/s are of the answered ones. The
command exits non-zero when no request was answered or every answered one failed (outcome
``error``: the server unreachable, or 5xx).

``stream`` and ``wait_rounds`` must be true or false, ``url`` an ``http://HOST[:PORT]`` address
with a port in 1..65535 (what :mod:`runtime.lean_http` can send to): anything else is refused
before a request is sent.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.artefacts import check_writable
from envs.config import EnvConfig, is_number
from envs.workload import round_rng, sample_round
from runtime.admission import sent_header_value
from runtime.lean_http import post_json, url_problem

KNOWN = {"env", "url", "rounds", "users", "seed", "time_scale", "token_scale", "max_tokens_cap", "round_gap_s", "output", "timeout_s", "stream", "wait_rounds"}
COLUMNS = ["round", "user", "prompt_tokens", "max_tokens", "deadline_s", "status", "mode", "outcome", "reason", "ttft_s", "latency_s", "output_tokens",
           "server_latency_s", "sent_lead_s", "wait_s", "plan_s", "alpha_planned", "sd_iterations", "sd_accepted", "sd_rejections"]
SUMMARY_KEYS = ("sent_lead_s", "wait_s", "plan_s", "alpha_planned", "sd_iterations", "sd_accepted", "sd_rejections")
INTERRUPTED = "interrupted"  # the outcome of a request still in flight when the run was stopped
STOP_GRACE_S = 1.0  # on a stop, how long requests in flight may still be answered before they are recorded as interrupted


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


def interrupted_row(row: dict) -> dict:
    """The row of a request sent but not answered when the run was stopped: it was sent, so it is
    counted, with no status or latency (its answer, if the server still sends one, is not read)."""
    return {**row, "status": None, "mode": None, "outcome": INTERRUPTED, "reason": "the run was stopped before the answer came",
            "ttft_s": None, "latency_s": None, "output_tokens": None, "server_latency_s": None, **dict.fromkeys(SUMMARY_KEYS)}


class RowWriter:
    """The CSV, one flushed row per request as soon as it has its outcome (a killed run keeps what it had)."""

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


async def replay(cfg: dict, writer: RowWriter) -> bool:
    """Send the rounds, one row per request into ``writer``; returns whether the run was stopped
    (SIGINT / SIGTERM, caught here when on the main thread) before every round was answered."""
    from runtime.pair import corpus

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # the signal only sets an event, between two steps of the loop: raised as KeyboardInterrupt at
    # an arbitrary point it tore the request tasks down and lost the rows of every one in flight
    signals = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    in_flight: dict[tuple[int, int], dict] = {}  # (round, user) -> row, from the moment its clock starts until its row is written
    tasks: set[asyncio.Task] = set()
    try:
        env = EnvConfig.from_kwargs(**{**cfg["env"], "num_users": int(cfg["users"])})
        text, _ = corpus(max_files=200)

        async def request(payload: dict, row: dict) -> None:
            key = (row["round"], row["user"])
            in_flight[key] = row  # a request cancelled before this line was never sent: no row
            answered = await one_request(cfg["url"], payload, row, float(cfg["timeout_s"]))
            del in_flight[key]  # no await between this and the write: a stop finds it either in flight or written
            writer.add(answered)

        def send(r: int) -> list[asyncio.Task]:
            rnd = sample_round(round_rng(int(cfg["seed"]), r), env)
            rng = round_rng(int(cfg["seed"]), r, 2)
            sent = []
            for k in range(rnd.num_users):
                max_tokens = int(np.clip(round(rnd.output_tokens[k] * cfg["token_scale"]), 1, cfg["max_tokens_cap"]))
                deadline = float(rnd.deadline_s[k] * cfg["time_scale"])
                prompt = prompt_text(int(rnd.input_tokens[k]), rng, text)
                row = {"round": r, "user": k, "prompt_tokens": len(prompt.encode()), "max_tokens": max_tokens, "deadline_s": deadline}
                payload = {"prompt": prompt, "max_tokens": max_tokens, "deadline_s": deadline, "stream": cfg.get("stream", True)}
                task = asyncio.ensure_future(request(payload, row))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent.append(task)
            return sent

        async def answered(sent: list[asyncio.Task]) -> None:
            if sent:
                await asyncio.wait(sent)  # asyncio.wait, not gather: cancelling the driver leaves the requests running
            for task in sent:
                task.result()  # a row that could not be written (the disk) ends the run, as it did

        async def drive() -> None:
            if cfg.get("wait_rounds", True):
                for r in range(int(cfg["rounds"])):
                    await answered(send(r))
                    if cfg["round_gap_s"] > 0:
                        await asyncio.sleep(cfg["round_gap_s"])
            else:
                start, sent = loop.time(), []
                for r in range(int(cfg["rounds"])):
                    await asyncio.sleep(max(start + r * cfg["round_gap_s"] - loop.time(), 0))  # round r at r x gap, whatever is running
                    sent += send(r)
                await answered(sent)

        # a signal during the (synchronous) corpus load sets `stop` only once the loop has read its wakeup
        # pipe and then run the handler, two iterations later: a short real sleep lets both happen first
        await asyncio.sleep(0.05)
        if stop.is_set():  # stopped while the corpus loaded: nothing was sent
            return True
        driver = asyncio.ensure_future(drive())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({driver, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if driver.done():
            driver.result()  # raises what the driver raised
            return False
        driver.cancel()  # no further round is sent
        if tasks:  # bounded: a stop must not wait for a long request (timeout_s can be minutes)
            await asyncio.wait(set(tasks), timeout=STOP_GRACE_S)
        return True
    finally:
        # also reached when the driver raised or replay itself was cancelled (asyncio.run tearing
        # down after a KeyboardInterrupt): whatever is still in flight gets its one row, as interrupted
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # they close their connections
        for key in sorted(in_flight):
            writer.add(interrupted_row(in_flight.pop(key)))
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)  # remove_signal_handler resets to the default, not to what was there


def summarize(df: pd.DataFrame, wall_s: float) -> pd.DataFrame:
    if df.empty:
        df = pd.DataFrame(columns=COLUMNS)
    answered = df[df.outcome != INTERRUPTED]  # the fractions and percentiles are of requests with an outcome
    lat = pd.to_numeric(answered.latency_s[answered.outcome.isin(["served", "late"])], errors="coerce")
    ttft = pd.to_numeric(answered.ttft_s, errors="coerce").dropna()
    return pd.DataFrame([{
        "requests": len(df),  # every request sent: answered + in_flight_at_stop
        "answered": len(answered),
        "in_flight_at_stop": len(df) - len(answered),
        "served": int((answered.outcome == "served").sum()),
        "served_frac": float((answered.outcome == "served").mean()) if len(answered) else np.nan,
        "late": int((answered.outcome == "late").sum()),
        "rejected": int((answered.outcome == "rejected").sum()),
        "errors": int((answered.outcome == "error").sum()),
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
    # what runtime.lean_http cannot send to was accepted here, then failed on every request (https, port 99999)
    url = cfg.get("url")
    problem = url_problem(url)
    if problem:
        raise ValueError(f"loadgen 'url' must be an http://HOST:PORT address (port 1..65535; no https, credentials or query): {problem}, got {url!r}")
    for key in ("stream", "wait_rounds"):  # left out: true. A string was truthy: stream=no streamed
        if not isinstance(cfg.get(key, True), bool):
            raise ValueError(f"loadgen '{key}' must be true or false, got {cfg.get(key)!r}")
    if cfg.get("output"):
        check_writable(cfg["output"], "loadgen 'output'")



def _write_summary(path: Path, summary: pd.DataFrame) -> None:
    out = path.with_name(path.stem + "_summary.csv")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    summary.to_csv(tmp, index=False)
    tmp.replace(out)  # atomic: a reader never sees half a summary


def run(cfg: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replay the workload; returns (rows, summary), one row per request sent. Interrupted (Ctrl-C /
    SIGTERM), it keeps the answered rows, records those still in flight as ``interrupted`` and
    summarises all of them; ``summary.interrupted`` says so."""
    validate(cfg)
    writer = RowWriter(cfg.get("output"))
    start = time.monotonic()
    interrupted = False
    try:
        interrupted = asyncio.run(replay(cfg, writer))
    except KeyboardInterrupt:  # a signal before replay installed its handlers (its rows in flight are still written)
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

        def on_term(signum, frame):  # SIGTERM ends the run like Ctrl-C (while requests are sent, replay catches it itself)
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        _, summary = run(cfg)
        print(summary.to_markdown(index=False, floatfmt=".3g"))
        s = summary.iloc[0]
        if s.answered == 0 or s.errors == s.answered:
            raise SystemExit(f"every request failed ({int(s.errors)} of {int(s.answered)} answered, {int(s.in_flight_at_stop)} in flight at the stop)")

    app()


if __name__ == "__main__":
    main()
