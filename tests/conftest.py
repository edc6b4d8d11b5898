import os

import numpy as np
import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("MPLBACKEND", "Agg")

from envs import CostModel, EnvConfig, sample_round  # noqa: E402


@pytest.fixture(scope="session")
def cfg12() -> EnvConfig:
    return EnvConfig(num_users=12)


@pytest.fixture(scope="session")
def cost12(cfg12) -> CostModel:
    return CostModel.from_config(cfg12)


def rounds(cfg: EnvConfig, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [sample_round(rng, cfg) for _ in range(n)]


# the live-server tests (test_serve*.py) share one tiny model pair and its measured profile
@pytest.fixture(scope="session")
def pair():
    from live_server import tiny_pair

    return tiny_pair()


@pytest.fixture(scope="session")
def profile(pair, tmp_path_factory):
    from live_server import tiny_profile

    return tiny_profile(pair, tmp_path_factory.mktemp("profile"))
