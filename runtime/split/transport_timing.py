"""What the transport alone costs per verification round trip: the in-process link against gRPC on
loopback, with a verifier that answers at once (no model), so the time measured is the link's,
the batcher's and the threads' -- what ``split_bench``'s ``transport_overhead_ms`` holds beyond
the emulated WAN.

    python -m runtime.split.transport_timing --requests 500 --depth 8 --out DIR

For each link, one client sends ``--requests`` requests one after another (each waits for its
reply) and the round trip (submit to result, ms) of each is recorded; the process's CPU time over
all of them (client and server side are one process here) gives CPU ms per round trip. Writes
``DIR/transport_timing.json`` and ``DIR/transport_timing.md``. Timings need an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agents.artefacts import write_text_atomic
from runtime.split.batcher import VerificationBatcher
from runtime.split.grpc_server import start_server
from runtime.split.transport import GrpcLink, LocalLink
from runtime.split.verifier import Verdict, VerifyRequest

if TYPE_CHECKING:
    from runtime.split.transport import VerifierLink


class InstantVerifier:
    """Accepts every draft at once, with no model: a stand-in that leaves only the transport's cost."""

    def __init__(self):
        self.committed: dict[str, int] = {}

    def check(self, req: VerifyRequest) -> None:
        pass

    def release(self, client: str) -> bool:
        return self.committed.pop(client, None) is not None

    def verify(self, requests: list[VerifyRequest]) -> list[Verdict]:
        out = []
        for r in requests:
            n = r.committed + len(r.drafts) + 1
            self.committed[r.client] = n
            out.append(Verdict(len(r.drafts), 0, n))
        return out


def round_trips(link: VerifierLink, requests: int, depth: int, timeout_s: float = 10.0) -> tuple[list[float], float]:
    """Milliseconds of each of ``requests`` sequential round trips, and CPU ms per round trip."""
    committed, times = 4, []
    prompt = (1, 2, 3, 4)
    cpu0 = time.process_time()
    for k in range(requests):
        req = VerifyRequest("", tuple(range(5, 5 + depth)), prompt if k == 0 else (), committed)
        t0 = time.perf_counter()
        reply = link.submit(req).result(timeout=timeout_s)
        times.append(1e3 * (time.perf_counter() - t0))
        committed = reply.committed
    return times, 1e3 * (time.process_time() - cpu0) / requests


def measure(requests: int, depth: int) -> list[dict]:
    rows = []
    batcher = VerificationBatcher(InstantVerifier(), cohorts=1, window_s=0.0)
    server, port, _ = start_server(batcher, "127.0.0.1:0")
    try:
        for name, make in (("in-process", lambda: LocalLink(batcher)), ("grpc", lambda: GrpcLink(f"127.0.0.1:{port}"))):
            link = make()
            round_trips(link, 20, depth)  # warm-up (connection, first messages)
            times, cpu_ms = round_trips(link, requests, depth)
            link.close()
            rows.append({"link": name, "requests": requests, "depth": depth, "median_ms": statistics.median(times),
                         "mean_ms": statistics.fmean(times), "p90_ms": statistics.quantiles(times, n=10)[-1], "cpu_ms_per_round_trip": cpu_ms})
    finally:
        server.stop(grace=1.0).wait(5.0)
        batcher.stop()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=500, help="round trips per link (>= 10)")
    ap.add_argument("--depth", type=int, default=8, help="drafts per request (>= 0)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.requests < 10 or args.depth < 0:
        raise SystemExit(f"--requests must be >= 10 (got {args.requests}) and --depth >= 0 (got {args.depth})")
    rows = measure(args.requests, args.depth)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out / "transport_timing.json", json.dumps(rows, indent=2))
    header = "| link | median ms | mean ms | p90 ms | CPU ms per round trip |\n|:--|--:|--:|--:|--:|"
    lines = [f"| {r['link']} | {r['median_ms']:.3f} | {r['mean_ms']:.3f} | {r['p90_ms']:.3f} | {r['cpu_ms_per_round_trip']:.3f} |" for r in rows]
    cmd = "python -m runtime.split.transport_timing " + " ".join(argv if argv is not None else sys.argv[1:])
    md = f"Command: `{cmd}`; {args.requests} sequential round trips of {args.depth} drafts, a verifier that answers at once.\n\n{header}\n" + "\n".join(lines) + "\n"
    write_text_atomic(args.out / "transport_timing.md", md)
    print(md, flush=True)


if __name__ == "__main__":
    main()
