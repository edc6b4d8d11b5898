"""Load generator for ``runtime.serve placement=split``: rounds of edge users (gRPC placement,
:class:`runtime.split_placement.EdgeUser`) and HTTP users (OpenAI completions), a round at a time,
all of a round's users at once.

    python -m runtime.split_loadgen --url http://127.0.0.1:8011 --split 127.0.0.1:50051 --edge-users 2 --http-users 2 --rounds 5 --out runs/split_load.csv

Each user draws its ``max_tokens`` (``--tokens``), deadline (``--deadline-s``) and, for edge users,
RTT (``--rtt-ms``) from a seeded generator; prompts cycle through the pair's prompt lists. Every
request ends with the server's one outcome (served / late / rejected / error), recorded per request
(mode, ED depth, latency on the server's clock, wait before planning, tokens, and the acceptance the
run measured: the edge's iteration log for ED, the engine's counters for SD). Edge users draft with
this process's copy of the draft model (``--pair`` / ``--preset``; one torch thread by default).
With ``--rtt-report measured`` (default) each edge user reports the emulated RTT plus the stack time
it measured on its own round trips (:mod:`runtime.split.rtt_estimate`), seeded by one probe
generation per edge user before the first round (:func:`probe_links`); ``link`` reports the
emulated RTT alone. Each record keeps both (``rtt_s``: emulated; ``reported_rtt_s``: reported).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np

from runtime.split.rtt_estimate import RTT_REPORTS

if TYPE_CHECKING:
    from runtime.split_placement import EdgeUser
    from runtime.tokenizer import Tokenizer


def draw_round(rng: np.random.Generator, r: int, edge_users: int, http_users: int, tokens: tuple[int, int], deadline_s: tuple[float, float],
               rtt_ms: tuple[float, float], prompts: list[str], setting: str = "") -> list[dict]:
    """One round's users (dicts): kind (edge / http), prompt, max_tokens, deadline_s, rtt_s (s; 0 for HTTP)."""
    kinds = ["edge"] * edge_users + ["http"] * http_users
    users = []
    for u, kind in enumerate(kinds):
        users.append({"setting": setting, "round": r, "user": u, "kind": kind, "prompt": prompts[(r * len(kinds) + u) % len(prompts)],
                      "max_tokens": int(rng.integers(tokens[0], tokens[1] + 1)),
                      "deadline_s": float(rng.uniform(*deadline_s)),
                      "rtt_s": float(rng.uniform(*rtt_ms)) / 1e3 if kind == "edge" else 0.0})
    return users


#: per ED request, the mean over its iterations of each part of an iteration (ms), from the edge's log
ITERATION_PARTS = {"draft_ms": "draft_ms", "verify_ms": "server_compute_ms", "queue_ms": "queue_wait_ms", "network_ms": "network_ms"}


def iteration_means(iterations: list) -> dict[str, float]:
    """``{part: mean ms per iteration}`` of :data:`ITERATION_PARTS` (NaN without iterations): the edge's
    drafting before the send, the server's verify compute, its queue wait and the rest of the round
    trip. The first iteration carries the prompt's prefill on both sides, so it is in the means: the
    model's counterpart spreads its prefill terms likewise (``experiments.split_sim_vs_real``)."""
    return {name: (sum(getattr(it, field) for it in iterations) / len(iterations) if iterations else float("nan"))
            for name, field in ITERATION_PARTS.items()}


def probe_links(edges: list[EdgeUser], tok: Tokenizer, prompts: list[str], rtt_s: float) -> list[float]:
    """Every edge user's link probe at once (:meth:`EdgeUser.probe_link`, emulated RTT ``rtt_s``),
    before the first round, so the first requests report a measured round trip too; returns each
    user's stack time per round trip, ms. A probe that fails is reported on stderr and gives NaN:
    that user reports what it measured before the failure (nothing: the emulated RTT) until its
    first ED request measures more, and the run goes on."""
    stack_ms = [float("nan")] * len(edges)

    def probe(i: int) -> None:
        edges[i].rtt_s = rtt_s
        try:
            stack_ms[i] = 1e3 * edges[i].probe_link(tok.encode(prompts[i % len(prompts)]))
        except Exception as exc:  # noqa: BLE001 - one edge's failed probe must not end the run
            print(f"[probe] edge user {i}: the link probe failed ({type(exc).__name__}: {exc}); it reports what it has measured", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(len(edges))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stack_ms


def run_round(users: list[dict], edges: list[EdgeUser], url: str, tok: Tokenizer) -> None:
    """All users of a round at once (edge user ``i`` of the round on ``edges[i]``); fills each dict with what happened."""

    def edge(u: dict, i: int) -> None:
        user = edges[i]
        user.rtt_s = u["rtt_s"]
        ids = tok.encode(u["prompt"])
        res = user.request(ids, u["max_tokens"], u["deadline_s"], request_id=f"{u['setting']}-{u['round']}-{u['user']}")
        its = res.edge.iterations if res.edge else []
        u.update(reported_rtt_s=res.reported_rtt_s, prompt_tokens=len(ids), mode=res.mode, outcome=res.outcome, reason=res.reason,
                 latency_s=res.server_latency_s, wait_s=res.wait_s,
                 tokens=len(res.tokens), depth=res.depth, iterations=len(its), accepted=sum(log.accepted for log in its),
                 rejections=sum(log.accepted < log.depth for log in its), edge_latency_s=res.latency_s, **iteration_means(its))

    def http(u: dict) -> None:
        try:
            body = httpx.post(f"{url}/v1/completions", json={"prompt": u["prompt"], "max_tokens": u["max_tokens"], "deadline_s": u["deadline_s"]}, timeout=300).json()
        except (httpx.HTTPError, ValueError) as err:
            body = {"specsched": {"outcome": "error", "reason": f"{type(err).__name__}: {err}"}}
        s = body.get("specsched") or {}
        u.update(prompt_tokens=len(tok.encode(u["prompt"])), mode=s.get("mode", "-"), outcome=s.get("outcome", "error"), reason=s.get("reason", ""),
                 latency_s=s.get("latency_s"), wait_s=s.get("wait_s"), tokens=s.get("completion_tokens", 0), depth=0,
                 accepted=s.get("sd_accepted"), rejections=s.get("sd_rejections"))

    threads, i = [], 0
    for u in users:
        if u["kind"] == "edge":
            threads.append(threading.Thread(target=edge, args=(u, i)))
            i += 1
        else:
            threads.append(threading.Thread(target=http, args=(u,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from runtime.split.pair_args import add_pair_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--url", required=True, help="the server's HTTP address, e.g. http://127.0.0.1:8011")
    ap.add_argument("--split", required=True, help="the server's split.port as HOST:PORT")
    ap.add_argument("--rounds", type=int, default=3)
    add_round_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="per-request CSV")
    args = ap.parse_args(argv)
    check_ranges(ap, args)
    return args


def add_round_args(ap: argparse.ArgumentParser) -> None:
    """The shape of a round (users of each kind, tokens, deadlines, RTTs), shared with experiments.split_sim_vs_real."""
    ap.add_argument("--edge-users", type=int, default=2)
    ap.add_argument("--http-users", type=int, default=2)
    ap.add_argument("--tokens", type=int, nargs=2, default=[24, 64], help="max_tokens drawn uniformly in [lo, hi]")
    ap.add_argument("--deadline-s", type=float, nargs=2, default=[0.8, 3.0], help="deadlines drawn uniformly in [lo, hi] seconds")
    ap.add_argument("--rtt-ms", type=float, nargs=2, default=[5.0, 30.0], help="edge RTTs drawn uniformly in [lo, hi] ms")
    ap.add_argument("--rtt-report", choices=list(RTT_REPORTS), default="measured",
                    help="the RTT an edge user reports to the server: measured (default: the emulated RTT plus the stack time measured on "
                         "its own round trips, runtime.split.rtt_estimate; one probe per user first) or link (the emulated RTT alone)")


def check_ranges(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options shared with experiments.split_sim_vs_real, checked before anything starts."""
    for name, lo in (("rounds", 1), ("edge_users", 0), ("http_users", 0)):
        if getattr(args, name) < lo:
            ap.error(f"--{name.replace('_', '-')} must be >= {lo}, got {getattr(args, name)}")
    if args.edge_users + args.http_users < 1:
        ap.error("--edge-users + --http-users must be >= 1")
    if not (1 <= args.tokens[0] <= args.tokens[1] and 0 < args.deadline_s[0] <= args.deadline_s[1] and 0 <= args.rtt_ms[0] <= args.rtt_ms[1]):
        ap.error("--tokens, --deadline-s and --rtt-ms must be ranges lo <= hi (tokens >= 1, deadlines > 0, RTTs >= 0)")


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    from agents.artefacts import write_csv_atomic
    from runtime.pair import CODE_PROMPTS, PROSE_PROMPTS
    from runtime.split.pair_args import load_pair_from_args
    from runtime.split_placement import EdgeUser

    args = parse_args(argv)
    pair = load_pair_from_args(args)
    tok = pair.tokenizer
    rng = np.random.default_rng(args.seed)
    edges = [EdgeUser(args.split, pair.draft, eos_id=tok.eos_id, seed=i, rtt_report=args.rtt_report) for i in range(args.edge_users)]
    rows: list[dict] = []
    try:
        if args.rtt_report == "measured" and edges:
            stack = probe_links(edges, tok, CODE_PROMPTS + PROSE_PROMPTS, sum(args.rtt_ms) / 2e3)
            print("[probe] stack ms per round trip: " + ", ".join(f"{ms:.2f}" for ms in stack), flush=True)
        for r in range(args.rounds):
            users = draw_round(rng, r, args.edge_users, args.http_users, tuple(args.tokens), tuple(args.deadline_s), tuple(args.rtt_ms), CODE_PROMPTS + PROSE_PROMPTS)
            run_round(users, edges, args.url, tok)
            rows.extend(users)
            print(f"[round {r}] " + ", ".join(f"{u['kind']}:{u['mode']}/{u['outcome']}" for u in users), flush=True)
    finally:
        for e in edges:
            e.close()
    df = pd.DataFrame(rows)
    print(df.groupby(["kind", "outcome"]).size().to_string(), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(df.drop(columns=["prompt"]), args.out)


if __name__ == "__main__":
    main()
