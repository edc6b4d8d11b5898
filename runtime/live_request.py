"""One request's life in the live server: what it asked for, what it produced, how it ended.

Every request ends with exactly one outcome: ``served`` (last token before its deadline), ``late``,
``rejected`` (with a reason: admission, deadline while queued, shutdown) or ``error`` (its round
failed, or shutdown ran out of time). Engine threads write the generation fields; the event loop
alone sets the outcome.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.textstream import TextStream

OUTCOMES = ("served", "late", "rejected", "error")


@dataclass
class LiveRequest:
    id: str
    prompt_ids: list[int]
    max_tokens: int
    deadline_s: float  #: seconds from arrival
    text: TextStream
    stream: bool = False
    temperature: float = 0.0  #: 0: greedy
    top_p: float = 1.0
    seed: int = 0  #: the request's own random stream (drawn by the server when the client gives none)
    arrival: float = field(default_factory=time.monotonic)  #: monotonic time the client sent it (its stamp) or it reached the app
    sent_lead_s: float = 0.0  #: seconds from the client's send stamp to the app (0: no stamp)
    mode: str = "-"
    first_token_at: float | None = None
    last_token_at: float | None = None
    completed_at: float | None = None  #: monotonic time of the last token (or of the decision)
    finish_reason: str | None = None  #: stop (stop sequence or end of sequence) or length
    round_start: float | None = None  #: monotonic time its round began planning
    planned_at: float | None = None
    alpha_planned: float | None = None  #: the acceptance estimate its round was planned with
    sd_iterations: int | None = None  #: the engine's counters for this row (SD only)
    sd_accepted: int | None = None
    sd_rejections: int | None = None
    alone_s: tuple[float, float] | None = None  #: the profile's time for it alone on the device, (AD, SD); set by the queue
    outcome: str | None = None
    reason: str = ""
    queue: asyncio.Queue | None = None  #: streamed text pieces, then None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def completion_tokens(self) -> int:
        return self.text.tokens

    def summary(self) -> dict[str, Any]:
        """SpecSched's extension in the last chunk / the response: outcome, reason and timings."""
        end = self.completed_at or time.monotonic()
        return {
            "outcome": self.outcome, "reason": self.reason, "mode": self.mode, "latency_s": end - self.arrival, "sent_lead_s": self.sent_lead_s,
            "ttft_s": (self.first_token_at - self.arrival) if self.first_token_at else None, "completion_tokens": self.completion_tokens,
            "deadline_s": self.deadline_s, "wait_s": (self.round_start - self.arrival) if self.round_start else None,
            "plan_s": (self.planned_at - self.round_start) if self.round_start and self.planned_at else None,
            "seed": self.seed if self.temperature > 0 else None, "alpha_planned": self.alpha_planned, "sd_iterations": self.sd_iterations, "sd_accepted": self.sd_accepted, "sd_rejections": self.sd_rejections,
        }
