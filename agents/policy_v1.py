"""A policy trained on EdgeSchedule-v1 as a :class:`~agents.scheduler.Scheduler` (AD, SD and ED users).

The v1 twin of :class:`agents.policy.PolicyScheduler`: the round is replayed through
``EdgeSchedule-v1`` user by user with the policy's deterministic action under the exact mask, and
the plan the environment built is returned -- modes, the SD depth, each ED user's own depth and the
three shares ``z``, ``ed_share``, ``lam``. The observation layout is the policy's own
(``policy.json``); the environment prices plans with the caller's cost model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agents.policy import OBSERVATION_FIELDS, algo_class, resolve_policy_path
from agents.scheduler import Scheduler
from envs.cost_model import CostModel
from envs.edge_schedule_v1 import EdgeScheduleV1Env
from envs.plan import DEFAULT_DRAFT_DEPTH, Plan
from envs.workload import Round

V1_ID = "EdgeSchedule-v1"
#: v1 fields that shape what the policy sees: the edge share and RTTs are round features, taken
#: from the round, but the env needs them valid for its own (unused) sampler
V1_FIELDS = ("edge_fraction", "rtt_ms", "rtt_distribution")


def env_id_of(meta: dict[str, Any]) -> str:
    """The environment a policy was trained on (policies without the key predate v1: v0)."""
    return str(meta.get("env_id", "EdgeSchedule-v0"))


class PolicyV1Scheduler(Scheduler):
    """A policy trained on EdgeSchedule-v1; its own ``max_gamma`` replaces the caller's."""

    name = "policy"

    def __init__(self, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None, path: str | Path = ""):
        model_path, meta = resolve_policy_path(path)
        if env_id_of(meta) != V1_ID:
            raise ValueError(f"policy {model_path} was trained on {env_id_of(meta)}, not {V1_ID}: use agents.policy.PolicyScheduler")
        trained = meta["env"]
        fields = {k: trained[k] for k in (*OBSERVATION_FIELDS, *V1_FIELDS) if k in trained}
        if fields.get("max_users") is None:
            fields["max_users"] = trained["num_users"]
        self._fields = fields
        self._profile = trained["profile"]
        super().__init__(cost, int(fields.get("max_gamma", max_gamma)), draft_depth=min(draft_depth, int(fields.get("max_gamma", max_gamma))), seed=seed)
        self.algo = meta["algo"]
        self.model = algo_class(self.algo).load(model_path, device="cpu")
        self.masked = self.algo == "maskable_ppo"
        from agents.masked_policy import MaskedArgmax

        self.net = MaskedArgmax(self.model, use_mask=self.masked).eval()  # the module the ONNX export traces
        self.env = self._make_env(trained["num_users"])

    def _make_env(self, num_users: int) -> EdgeScheduleV1Env:
        # built on the trained profile (a valid v1 config); the caller's cost model then prices the plan
        env = EdgeScheduleV1Env(num_users=num_users, profile=self._profile, **self._fields)
        env.set_cost_model(self.cost)
        return env

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The deterministic action; unmasked algorithms act without the mask."""
        import torch

        with torch.no_grad():  # the module ignores the mask of an unmasked algorithm itself (as the ONNX export does)
            return int(self.net(torch.as_tensor(obs[None]), torch.as_tensor(mask[None], dtype=torch.float32))[0])

    def decide(self, rnd: Round) -> Plan:
        if rnd.num_users != self.env.cfg.num_users:
            self.env = self._make_env(rnd.num_users)
        env = self.env
        obs, _ = env.reset(options={"round": rnd})
        while True:
            obs, _, term, trunc, info = env.step(self.act(obs, env.action_masks()))
            if term or trunc:
                break
        has_ed = int(info["admitted_ed"]) > 0
        return Plan(info["modes"], gamma=max(int(info["gamma"]), 1), z=float(info["z"]), lam=float(info["lam"]),
                    ed_depth=info["ed_depth"] if has_ed else None, ed_share=float(info["ed_share"]))
