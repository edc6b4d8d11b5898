"""Cases shared by the builder tests (``test_plan_builder_mutants.py``, ``test_split_builder_mutants.py``):
a cost model that prices through one overridden method (a builder must go through the model's own
methods, not an inlined copy of the base class's formula) and the users a sampled round lacks."""

from __future__ import annotations

import numpy as np

from envs.cost_model import CostModel
from envs.workload import Round


class TwiceSdParts(CostModel):
    """SD twice as slow through ``sd_parts1`` alone (so ``sd_time1``; not ``sd_parts_all1``) and the exact
    check's ``sd_time``; x2 is exact in floats."""

    def sd_parts1(self, b, s_max, n_max, gamma):
        prefill, iteration = super().sd_parts1(b, s_max, n_max, gamma)
        return 2.0 * prefill, 2.0 * iteration

    def sd_time(self, b, s_max, n_max, j_max, gamma):
        return 2.0 * super().sd_time(b, s_max, n_max, j_max, gamma)


def add_special_users(rnd: Round, rng: np.random.Generator) -> Round:
    """``rnd`` (edited in place and returned) with three users certain to accept (alpha = 1, 60 output
    tokens: a multiple of every g + 1 up to 5) and two whose uplink uses up their whole slack (budget
    exactly 0) or more, at places ``rng`` picks."""
    for i in rng.choice(rnd.num_users, size=3, replace=False):
        rnd.alpha[i] = 1.0
        rnd.output_tokens[i] = 60
    zero, neg = rng.choice(rnd.num_users, size=2, replace=False)
    rnd.downlink_s[[zero, neg]] = 0.0  # slack = deadline
    rnd.deadline_s[zero] = rnd.uplink_s[zero]
    rnd.deadline_s[neg] = 0.5 * rnd.uplink_s[neg]
    return rnd
