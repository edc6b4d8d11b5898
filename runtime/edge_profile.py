"""The edge process's start from the system model: ``runtime.edge --profile NAME|PATH``.

The schedulers calibrate an ED user's depth with SpecEdge's rule,
:meth:`envs.split_cost.SplitCostModel.calibrated_depth` (the depth whose edge iteration -- drafting,
network -- best matches the server's verify pass). Given the same profile, every depth controller
of the edge process starts at that depth, for the client's RTT, and takes the acceptance it was
calibrated with as its prior (:class:`runtime.split.depth.DepthController`); the controller then
refines both from its own measurements.

Why the runtime calls ``envs`` here: the data flow of DESIGN.md is runtime -> profile -> envs ->
agents -> experiments for *measurements*, and the layering it enforces (``tests/test_layering.py``)
forbids only ``envs`` or ``agents`` importing ``runtime``; the live server already prices plans
with ``envs``' cost models (``runtime.admission``, ``runtime.split_rounds``). Calling the one rule
keeps one definition of it; re-deriving it here from the profile's tables would be a second copy
that could drift. With ``--placement on`` the depth comes from the server's plan instead (which
used the same rule or a scheduler's choice), so ``--profile`` is for the direct mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CalibratedStart:
    depth: int  #: the calibration rule's depth for this client's RTT
    alpha: float  #: the acceptance the rule was evaluated at (the controller's prior)
    profile: str  #: the profile's name
    rtt_s: float
    context_tokens: float
    verify_clients: int

    def as_dict(self) -> dict:
        return {"depth": self.depth, "alpha": self.alpha, "profile": self.profile, "rtt_s": self.rtt_s, "context_tokens": self.context_tokens,
                "verify_clients": self.verify_clients}


def calibrated_start(profile: str | Path, alpha: float, rtt_s: float, clients: int, context_tokens: float, max_depth: int) -> CalibratedStart:
    """The rule's depth for one client of ``clients`` (verify passes of one cohort: half of them,
    as :func:`agents.edge_first.calibrated_depths`), at mean context ``context_tokens`` (tokens).

    Raises ``ValueError`` naming the field for an out-of-range argument or a profile without the
    split sections (``edge``, ``network``), ``FileNotFoundError`` for an unknown profile."""
    from envs.profile import load_profile
    from envs.split_cost import SplitCostModel

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if rtt_s < 0 or clients < 1 or context_tokens < 1 or max_depth < 1:
        raise ValueError(f"need rtt_s >= 0 (got {rtt_s}), clients >= 1 (got {clients}), context_tokens >= 1 (got {context_tokens}), "
                         f"max_depth >= 1 (got {max_depth})")
    prof = load_profile(profile)
    model = SplitCostModel(prof)  # ValueError naming the missing sections
    cohort = max(1, -(-clients // 2))
    depth = model.calibrated_depth(alpha, float(context_tokens), rtt_s, verify_clients=cohort, max_depth=max_depth)
    return CalibratedStart(int(depth), alpha, prof.name, rtt_s, float(context_tokens), cohort)
