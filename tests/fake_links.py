"""A verification link without a server, for edge-client tests that need no target model."""

import time
from concurrent.futures import Future
from types import SimpleNamespace


class AcceptAllLink:
    """Accepts every draft at once; the bonus token is always 7 (what the fake sessions draft, so
    proactive drafting always hits); ``compute_ms`` is the server time each reply reports."""

    def __init__(self, compute_ms: float = 0.0):
        self.compute_ms = compute_ms

    def submit(self, req):
        fut = Future()
        fut.set_result(SimpleNamespace(accepted=len(req.drafts), bonus=7, committed=req.committed + len(req.drafts) + 1, queue_wait_ms=0.0,
                                       compute_ms=self.compute_ms, arrived_at=time.time(), batch_size=1, cohort=0,
                                       prompts=int(bool(req.prompt))))
        return fut

    def release(self):
        pass
