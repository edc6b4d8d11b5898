"""A plan for one round: which users run in which mode, the draft depth and the resource shares."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

REJECT, AD, SD = 0, 1, 2
MODE_NAMES = {REJECT: "reject", AD: "ad", SD: "sd"}


@dataclass
class Plan:
    """What a scheduler decides for a round.

    ``modes[k]`` is REJECT (0), AD (1) or SD (2) for user k; ``gamma`` the SD draft depth (tokens
    drafted per iteration); ``z`` the AD compute share (SD gets ``1 - z``); ``lam`` the AD share of
    the KV memory left after weights (SD gets ``1 - lam``); ``decision_s`` the wall-clock seconds
    the scheduler took to decide.
    """

    modes: np.ndarray
    gamma: int = 4
    z: float = 1.0
    lam: float = 1.0
    decision_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.modes = np.asarray(self.modes, dtype=np.int8)

    @property
    def admitted_ad(self) -> int:
        return int(np.count_nonzero(self.modes == AD))

    @property
    def admitted_sd(self) -> int:
        return int(np.count_nonzero(self.modes == SD))

    @property
    def admitted(self) -> int:
        return self.admitted_ad + self.admitted_sd

    @classmethod
    def reject_all(cls, num_users: int, gamma: int = 4) -> Plan:
        return cls(np.zeros(num_users, dtype=np.int8), gamma=gamma, z=1.0, lam=1.0)
