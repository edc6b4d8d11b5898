"""The environments' docstrings state their observation sizes; the formulas must be the code's
(both were off by a few entries until stop 35: a newcomer's read found them)."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the environments)
from envs import edge_schedule, edge_schedule_v1


def _formula(doc: str) -> tuple[int, int, int]:
    """``(constant, per G, per user)`` of the docstring's ``Box(0, 1, (a + bG + c * (1 + K_max),), ...)``."""
    m = re.search(r"``Box\(0, 1, \((\d+) \+ (\d*)G \+ (\d+) \* \(1 \+ K_max\),\), float32\)``", doc)
    assert m, "the docstring's Box(...) formula is missing or in another form"
    return int(m.group(1)), int(m.group(2) or 1), int(m.group(3))


@pytest.mark.parametrize("env_id,module", [("EdgeSchedule-v0", edge_schedule), ("EdgeSchedule-v1", edge_schedule_v1)])
@pytest.mark.parametrize("num_users,max_users,max_gamma", [(5, None, 4), (12, None, 8), (10, 4, 6), (3, 7, 1)])
def test_observation_size_is_the_docstrings(env_id, module, num_users, max_users, max_gamma):
    a, b, c = _formula(module.__doc__)
    env = gym.make(env_id, num_users=num_users, max_users=max_users, max_gamma=max_gamma).unwrapped
    k_max = max_users or num_users
    assert env.observation_space.shape == (a + b * max_gamma + c * (1 + k_max),)
