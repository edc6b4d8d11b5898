"""SpecSched's system model and Gymnasium environments.

Importing ``envs`` registers ``EdgeSchedule-v0`` (see :mod:`envs.edge_schedule`) and
``EdgeSchedule-v1`` (v0 plus SpecEdge's split mode ED; see :mod:`envs.edge_schedule_v1`).
"""

import warnings

import gymnasium as gym

from envs.config import ConfigError, EnvConfig
from envs.cost_model import CostModel
from envs.feasibility import check_plan, check_plans
from envs.outcome import Outcome, evaluate_plan
from envs.plan import AD, REJECT, SD, Plan
from envs.plan_builder import PlanBuilder
from envs.profile import Profile, ProfileError, available_profiles, load_profile
from envs.workload import Round, sample_round

ENV_ID = "EdgeSchedule-v0"

if ENV_ID not in gym.registry:
    gym.register(
        id=ENV_ID,
        entry_point="envs.edge_schedule:EdgeScheduleEnv",
        vector_entry_point="envs.edge_schedule_vector:EdgeScheduleVectorEnv",
    )

V1_ENV_ID = "EdgeSchedule-v1"
# v0 stays on purpose (trained policies use it): silence Gymnasium's "v0 is out of date" notice
warnings.filterwarnings("ignore", message=r".*The environment EdgeSchedule-v0 is out of date", category=DeprecationWarning)

if V1_ENV_ID not in gym.registry:
    gym.register(
        id=V1_ENV_ID,
        entry_point="envs.edge_schedule_v1:EdgeScheduleV1Env",
        vector_entry_point="envs.edge_schedule_v1_vector:EdgeScheduleV1VectorEnv",
    )

__all__ = [
    "AD", "ENV_ID", "V1_ENV_ID", "REJECT", "SD", "ConfigError", "CostModel", "EnvConfig", "Outcome", "Plan",
    "PlanBuilder", "Profile", "ProfileError", "Round", "available_profiles", "check_plan",
    "check_plans", "evaluate_plan", "load_profile", "sample_round",
]
