"""The split runtime's verification server: holds the target model, verifies the draft chains of
many edge clients in batches (pipeline-aware cohorts, a short batching window), over gRPC.

    python -m runtime.split_server --port 50051 --cohorts 2 --window-ms 5
    python -m runtime.split_server --pair PATH --device cuda --dtype float16 --host 0.0.0.0 --port 50051

It prints ``listening on HOST:PORT`` once the model is loaded and the port is open (``--port 0``
picks a free one), serves until SIGINT/SIGTERM or, with ``--idle-exit-s``, until no client has
been connected for that long (plus ``--startup-grace-s`` before the first client), and then writes ``--stats-out`` (JSON: batches, rows, tokens,
busy seconds, utilisation, batch sizes) atomically.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from agents.artefacts import write_text_atomic
from runtime.split.batcher import VerificationBatcher
from runtime.split.grpc_server import start_server
from runtime.split.pair_args import add_pair_args, load_pair_from_args
from runtime.split.verifier import BatchVerifier


def stats_dict(batcher: VerificationBatcher, streams: int) -> dict:
    st = batcher.stats
    span = (st.last_at - st.first_at) if st.first_at is not None and st.last_at is not None else 0.0
    return {"batches": st.batches, "rows": st.rows, "tokens": st.tokens, "busy_s": st.busy_s, "span_s": span,
            "utilisation": st.utilisation if span > 0 else None, "tokens_per_s": st.tokens / span if span > 0 else None,
            "mean_batch": st.rows / st.batches if st.batches else None, "streams": streams, "cohorts": batcher.cohorts,
            "verify_cpu_s": st.verify_cpu_s, "verify_timing": dict(batcher.verifier.timing)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--host", default="127.0.0.1", help="listen address (loopback by default)")
    ap.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    ap.add_argument("--cohorts", type=int, default=2)
    ap.add_argument("--window-ms", type=float, default=5.0, help="how long a batch waits for the rest of its cohort")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-depth", type=int, default=16, help="the deepest draft chain accepted")
    ap.add_argument("--max-clients", type=int, default=64)
    ap.add_argument("--idle-exit-s", type=float, default=None, help="stop once no client has been connected for this long")
    ap.add_argument("--startup-grace-s", type=float, default=120.0, help="with --idle-exit-s: extra time to wait for the first client")
    ap.add_argument("--stats-out", type=Path, default=None)
    args = ap.parse_args(argv)
    for name, value, low in (("--cohorts", args.cohorts, 1), ("--max-batch", args.max_batch, 1), ("--max-depth", args.max_depth, 1),
                             ("--max-clients", args.max_clients, 1)):
        if value < low:
            raise SystemExit(f"{name} must be >= {low}, got {value}")
    if args.window_ms < 0 or not 0 <= args.port <= 65535:
        raise SystemExit(f"--window-ms must be >= 0 (got {args.window_ms}) and --port in [0, 65535] (got {args.port})")
    if args.stats_out is not None:
        args.stats_out.parent.mkdir(parents=True, exist_ok=True)
    pair = load_pair_from_args(args)
    batcher = VerificationBatcher(BatchVerifier(pair.target, max_depth=args.max_depth), cohorts=args.cohorts,
                                  window_s=args.window_ms / 1e3, max_batch=args.max_batch)
    server, port, service = start_server(batcher, f"{args.host}:{args.port}", args.max_clients)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening on {args.host}:{port}", flush=True)
    idle_since, grace = time.monotonic(), args.startup_grace_s  # before the first client: the grace period
    while not stop.wait(0.2):
        if batcher.members:
            idle_since, grace = time.monotonic(), 0.0
        elif args.idle_exit_s is not None and time.monotonic() - idle_since > args.idle_exit_s + grace:
            break
    stats = stats_dict(batcher, service.streams_opened)  # final: written before stopping, which may wait for streams
    if args.stats_out is not None:
        write_text_atomic(args.stats_out, json.dumps(stats, indent=2))
    print(json.dumps(stats), flush=True)
    server.stop(grace=2.0).wait(5.0)
    batcher.stop()


if __name__ == "__main__":
    main()
