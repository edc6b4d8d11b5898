"""A plan for one round: which users run in which mode, the draft depth and the resource shares."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

REJECT, AD, SD = 0, 1, 2
ED = 3  #: SpecEdge split: the user's edge GPU drafts, the server verifies (EdgeSchedule-v1, envs.split_plan)
MODE_NAMES = {REJECT: "reject", AD: "ad", SD: "sd", ED: "ed"}
#: the draft depth (tokens drafted per SD iteration) wherever none is configured: plans, schedulers,
#: the apps' ``draft_depth: null``
DEFAULT_DRAFT_DEPTH = 4


@dataclass
class Plan:
    """What a scheduler decides for a round.

    ``modes[k]`` is REJECT (0), AD (1) or SD (2) for user k; ``gamma`` the SD draft depth (tokens
    drafted per iteration); ``z`` the AD compute share (SD gets ``1 - z``); ``lam`` the AD share of
    the KV memory left after weights (SD gets ``1 - lam``); ``decision_s`` the wall-clock seconds
    the scheduler took to decide. ED users (SpecEdge split, ``envs.split_plan``) have their own
    draft depth ``ed_depth[k]`` and the ED verify batch the compute share ``ed_share`` (SD then
    gets ``1 - z - ed_share``); plans without ED users leave both at their defaults.
    """

    modes: np.ndarray
    gamma: int = DEFAULT_DRAFT_DEPTH
    z: float = 1.0
    lam: float = 1.0
    decision_s: float = 0.0
    extra: dict = field(default_factory=dict)
    ed_depth: np.ndarray | None = None  #: per user, the ED draft depth (0 where not ED); None = no ED user
    ed_share: float = 0.0

    def __post_init__(self) -> None:
        self.modes = np.asarray(self.modes, dtype=np.int8)
        if self.ed_depth is not None:
            self.ed_depth = np.asarray(self.ed_depth, dtype=np.int64)

    @property
    def admitted_ad(self) -> int:
        return int(np.count_nonzero(self.modes == AD))

    @property
    def admitted_sd(self) -> int:
        return int(np.count_nonzero(self.modes == SD))

    @property
    def admitted_ed(self) -> int:
        return int(np.count_nonzero(self.modes == ED))

    @property
    def admitted(self) -> int:
        return self.admitted_ad + self.admitted_sd + self.admitted_ed

    @classmethod
    def reject_all(cls, num_users: int, gamma: int = DEFAULT_DRAFT_DEPTH) -> Plan:
        return cls(np.zeros(num_users, dtype=np.int8), gamma=gamma, z=1.0, lam=1.0)
