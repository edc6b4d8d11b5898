"""The live server's metrics: Prometheus text at ``/metrics`` (prometheus-client), JSON at ``/stats``.

One registry per server (several servers can live in one process, as in the tests). Counters per
outcome, per rejection kind and per HTTP status (every response, 4xx / 500 / 503 included);
histograms of request latency, time to first token and inter-token latency; gauges of queue depth,
the calibration factor per mode, the acceptance estimate and the rejection answer margin.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from runtime.live_request import OUTCOMES

LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class ServeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.outcomes = Counter("specsched_requests", "Requests that ended, by outcome", ["outcome"], registry=r)
        self.rejections = Counter("specsched_rejections", "Rejected requests, by why (admission, deadline, shutdown)", ["kind"], registry=r)
        self.http = Counter("specsched_http_responses", "HTTP responses, by status code", ["status"], registry=r)
        self.latency = Histogram("specsched_request_latency_seconds", "Arrival to last token, served and late requests", buckets=LATENCY_BUCKETS_S, registry=r)
        self.ttft = Histogram("specsched_time_to_first_token_seconds", "Arrival to first generated token", buckets=LATENCY_BUCKETS_S, registry=r)
        self.itl = Histogram("specsched_inter_token_latency_seconds", "Time between a request's tokens (an SD iteration's tokens share its gap)", buckets=ITL_BUCKETS_S, registry=r)
        self.queue = Gauge("specsched_queue_depth", "Requests waiting for a round", registry=r)
        self.calibration = Gauge("specsched_calibration_factor", "Real / predicted step time per mode (planning scales the profile by it)", ["mode"], registry=r)
        self.answer_margin = Gauge("specsched_answer_margin_seconds", "How early the queue decides a rejection: learnt delay from decision to answer written (see runtime.admission)", registry=r)
        self.alpha = Gauge("specsched_acceptance_estimate", "SD acceptance estimate used for planning", registry=r)
        self.rounds = Counter("specsched_rounds", "Rounds planned", registry=r)
        self.faults = Counter("specsched_round_faults", "Rounds that failed with an exception", registry=r)
        self.tokens = Counter("specsched_generated_tokens", "Tokens handed to requests", registry=r)
        for o in OUTCOMES:
            self.outcomes.labels(o)  # present at 0, so sums over outcomes are complete from the start
        for mode in ("ad", "sd"):
            self.calibration.labels(mode).set(1.0)
        # the JSON view keeps its own plain numbers (prometheus-client values are not a public read API)
        self._lock = threading.Lock()
        self.counts: dict[str, Any] = {**dict.fromkeys(OUTCOMES, 0), "requests": 0, "rounds": 0, "faults": 0, "tokens": 0, "rejected_reasons": {}, "http": {}}
        self.latencies: list[float] = []
        self.started = time.monotonic()

    def outcome(self, outcome: str, reason: str, latency_s: float | None) -> None:
        self.outcomes.labels(outcome).inc()
        with self._lock:
            self.counts[outcome] += 1
            self.counts["requests"] += 1
            if outcome == "rejected":
                kind = reason.split(":", 1)[0]
                self.rejections.labels(kind).inc()
                self.counts["rejected_reasons"][reason] = self.counts["rejected_reasons"].get(reason, 0) + 1
            if latency_s is not None and outcome in ("served", "late"):
                self.latency.observe(latency_s)
                self.latencies.append(latency_s)

    def status(self, code: int) -> None:
        self.http.labels(str(code)).inc()
        with self._lock:
            self.counts["http"][str(code)] = self.counts["http"].get(str(code), 0) + 1

    def round_done(self) -> None:
        self.rounds.inc()
        with self._lock:
            self.counts["rounds"] += 1

    def fault(self) -> None:
        self.faults.inc()
        with self._lock:
            self.counts["faults"] += 1

    def generated(self, n: int) -> None:
        self.tokens.inc(n)
        with self._lock:
            self.counts["tokens"] += n

    def prometheus(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            lat = np.asarray(self.latencies)
            counts = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.counts.items()}
        up = time.monotonic() - self.started
        return {
            **counts,
            "latency_p50_s": float(np.percentile(lat, 50)) if lat.size else None,
            "latency_p99_s": float(np.percentile(lat, 99)) if lat.size else None,
            "tokens_per_s": counts["tokens"] / up if up > 0 else 0.0,
            "uptime_s": up,
        }
