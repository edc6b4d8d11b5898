"""What one split (SpecEdge) simulation setting is: draft shapes, primitive latencies, the setting.

The inputs of the discrete-event simulation in ``envs.split_des`` -- :class:`DraftShape` (what a
client drafts, sends and may get accepted), :class:`SplitPrimitives` (the pass times and network the
simulation is built from) and :class:`DesConfig` (clients, cohorts, proactive drafting, run length)
-- with their validation (:class:`DesConfigError` names the field and its allowed range).

Kept apart from the simulation driver so that a setting can be built and checked (from a profile,
or from the closed form's tree shapes in ``experiments.specedge_des_check``) without simpy, the
optional ``sim`` dependency the driver runs on; the meaning of every switch is documented with the
simulation, in ``envs.split_des``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from envs.profile import Profile

PROACTIVE_INTERRUPTS = ("step", "immediate")
PROACTIVE_GAINS = ("time", "tokens")


class DesConfigError(ValueError):
    """A simulation setting is out of range; the message names the field and the allowed range."""


@dataclass(frozen=True)
class DraftShape:
    """What one client drafts, sends and may get accepted per iteration.

    ``pass_widths``: tokens forwarded by each draft pass on the edge, in order; ``verify_tokens``:
    tokens per client in the server's verify pass (the drafts plus the root / previous bonus);
    ``level_accept``: probability that level ``d`` (1-based) is accepted given levels ``< d`` were;
    ``level_nodes``: nodes drafted per level (pass ``i`` attends to the context plus every node
    drafted before it plus its own tokens; default: one node per pass); ``reuse_path_prob``: the
    probability, given that every level was accepted, that the accepted path is the one the edge
    extended proactively (its top path: 1 for a chain).
    """

    kind: str
    pass_widths: tuple[int, ...]
    verify_tokens: int
    level_accept: tuple[float, ...]
    level_nodes: tuple[int, ...] | None = None
    reuse_path_prob: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("chain", "tree"):
            raise DesConfigError(f"draft shape field 'kind' must be 'chain' or 'tree', got {self.kind!r}")
        if len(self.pass_widths) < 1 or any(int(w) != w or w < 1 for w in self.pass_widths):
            raise DesConfigError(f"draft shape field 'pass_widths' must be a non-empty tuple of integers >= 1, got {self.pass_widths!r}")
        if len(self.level_accept) < 1 or any(not 0.0 <= p <= 1.0 for p in self.level_accept):
            raise DesConfigError(f"draft shape field 'level_accept' must be a non-empty tuple of probabilities in [0, 1], got {self.level_accept!r}")
        if self.level_nodes is not None and (len(self.level_nodes) != len(self.pass_widths) or any(int(n) != n or n < 1 for n in self.level_nodes)):
            raise DesConfigError(f"draft shape field 'level_nodes' must be null or one integer >= 1 per pass ({len(self.pass_widths)}), got {self.level_nodes!r}")
        if not 0.0 <= self.reuse_path_prob <= 1.0:
            raise DesConfigError(f"draft shape field 'reuse_path_prob' must be in [0, 1], got {self.reuse_path_prob!r}")
        if int(self.verify_tokens) != self.verify_tokens or self.verify_tokens < len(self.level_accept) + 1:
            raise DesConfigError(f"draft shape field 'verify_tokens' must be an integer >= depth + 1 = {len(self.level_accept) + 1}, got {self.verify_tokens!r}")

    @classmethod
    def chain(cls, depth: int, alpha: float) -> DraftShape:
        """A chain of ``depth`` drafts: ``depth`` one-token passes, ``depth + 1`` verified tokens."""
        if int(depth) != depth or depth < 1:
            raise DesConfigError(f"chain depth must be an integer >= 1, got {depth!r}")
        return cls("chain", (1,) * int(depth), int(depth) + 1, (float(alpha),) * int(depth))

    @property
    def depth(self) -> int:
        return len(self.level_accept)

    def expected_tokens(self) -> float:
        """Expected tokens gained per iteration: ``1 + sum_d prod_{i <= d} level_accept[i]``."""
        return 1.0 + float(np.cumprod(self.level_accept).sum())

    def all_accepted(self) -> float:
        """Probability that every level is accepted."""
        return float(np.prod(self.level_accept))


@dataclass(frozen=True)
class SplitPrimitives:
    """The primitive latencies the simulation is built from (seconds, bytes).

    ``verify_s(b, q, c)``: one target pass on the server for ``b`` clients, ``q`` new tokens each,
    context ``c`` (including the ``q`` tokens). ``draft_pass_s(width, c)``: one draft pass on an
    edge device, batch 1, ``width`` tokens at context ``c``.
    """

    verify_s: Callable[[int, int, float], float]
    draft_pass_s: Callable[[int, float], float]
    rtt_s: float
    bandwidth_bytes_per_s: float = math.inf
    bytes_per_draft_token: float = 0.0  #: uplink bytes per verified token (id, position, parent, slot)
    bytes_per_reply_token: float = 0.0  #: downlink bytes per verified token (the target's sample)
    request_overhead_bytes: float = 0.0  #: framing bytes per message, each direction
    rtt_jitter_s: float = 0.0  #: standard deviation of each one-way delay

    @classmethod
    def from_profile(cls, profile: Profile, rtt_s: float | None = None, rtt_jitter_s: float = 0.0) -> SplitPrimitives:
        """The primitives of a profile with ``edge`` and ``network`` sections (RTT: the network's unless given).

        Verify passes are the profile's target ``tau_llm`` on its (server) device; draft passes the
        edge section's ``tau_draft`` at batch 1.
        """
        if profile.edge is None or profile.network is None:
            raise DesConfigError(f"profile {profile.name!r} has no 'edge' and 'network' sections; the split simulation needs both")
        net, tau_l, tau_d = profile.network, profile.tau_llm, profile.edge.tau_draft
        return cls(
            verify_s=lambda b, q, c: tau_l.tau1(b, q, c),
            draft_pass_s=lambda w, c: tau_d.tau1(1, w, c),
            rtt_s=net.rtt_s if rtt_s is None else float(rtt_s),
            bandwidth_bytes_per_s=net.bandwidth_bytes_per_s,
            bytes_per_draft_token=net.bytes_per_draft_token,
            bytes_per_reply_token=net.bytes_per_reply_token,
            request_overhead_bytes=net.request_overhead_bytes,
            rtt_jitter_s=float(rtt_jitter_s),
        )

    def __post_init__(self) -> None:
        for name in ("rtt_s", "bytes_per_draft_token", "bytes_per_reply_token", "request_overhead_bytes", "rtt_jitter_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise DesConfigError(f"split primitive field '{name}' must be a finite number >= 0, got {v!r}")
        if not self.bandwidth_bytes_per_s > 0:
            raise DesConfigError(f"split primitive field 'bandwidth_bytes_per_s' must be > 0, got {self.bandwidth_bytes_per_s!r}")


@dataclass(frozen=True)
class DesConfig:
    """One simulated setting (see the module docstring for each switch's meaning)."""

    num_clients: int
    shape: DraftShape
    cohorts: int = 2
    proactive: bool = True
    bonus_match: float = 1.0  #: probability that the edge's guessed bonus token is the target's
    proactive_interrupt: str = "step"
    prompt_tokens: int = 512
    output_tokens: int = 256
    batch_window_s: float = math.inf  #: longest the server waits for a cohort's stragglers
    iterations: int = 200  #: recorded iterations per client (after the warm-up)
    warmup_iterations: int = 20
    seed: int = 0
    proactive_gain: str = "time"  #: "time" (reuse saves passes) or "tokens" (reuse deepens the next tree)
    proactive_shape: DraftShape | None = None  #: "tokens": the passes drafted proactively (one per level)
    deepened: tuple[DraftShape, ...] = ()  #: "tokens": ``shape`` deepened by 1, 2, ... proactive levels

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise DesConfigError(f"simulation field '{name}' must be {allowed}, got {getattr(self, name)!r}")

        need(isinstance(self.num_clients, int) and self.num_clients >= 1, "num_clients", "an integer >= 1")
        need(self.cohorts in (1, 2), "cohorts", "1 or 2")
        need(self.cohorts <= self.num_clients, "cohorts", f"<= num_clients ({self.num_clients})")
        need(0.0 <= self.bonus_match <= 1.0, "bonus_match", "in [0, 1]")
        need(self.proactive_interrupt in PROACTIVE_INTERRUPTS, "proactive_interrupt", f"one of {list(PROACTIVE_INTERRUPTS)}")
        need(isinstance(self.prompt_tokens, int) and self.prompt_tokens >= 1, "prompt_tokens", "an integer >= 1")
        need(isinstance(self.output_tokens, int) and self.output_tokens >= 1, "output_tokens", "an integer >= 1")
        need(self.batch_window_s >= 0, "batch_window_s", ">= 0 seconds")
        need(isinstance(self.iterations, int) and self.iterations >= 1, "iterations", "an integer >= 1")
        need(isinstance(self.warmup_iterations, int) and self.warmup_iterations >= 0, "warmup_iterations", "an integer >= 0")
        need(self.proactive_gain in PROACTIVE_GAINS, "proactive_gain", f"one of {list(PROACTIVE_GAINS)}")
        if self.proactive_gain == "tokens":
            need(self.proactive_shape is not None, "proactive_shape", "a DraftShape when proactive_gain is 'tokens'")
            need(len(self.deepened) == len(self.proactive_shape.pass_widths), "deepened",
                 f"one DraftShape per proactive pass ({len(self.proactive_shape.pass_widths)})")
