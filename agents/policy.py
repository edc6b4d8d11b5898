"""A trained stable-baselines3 policy as a :class:`~agents.scheduler.Scheduler`.

A policy folder holds ``model.zip`` (SB3) and ``policy.json`` (the algorithm and the environment
config it was trained with). The scheduler replays a round through ``EdgeSchedule-v0`` user by
user, taking the policy's deterministic action under the action mask, and returns the plan the
environment built. The observation layout (look-ahead ``max_users``, ``max_gamma``, user order,
normalisation ranges) is the policy's own, whatever round size it is asked to plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agents.plan_repair import POST_STEP_OPTIONS, improve_plan
from agents.scheduler import Scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.edge_schedule import EdgeScheduleEnv
from envs.plan import DEFAULT_DRAFT_DEPTH, Plan
from envs.workload import Round

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

#: fields of the env config that shape the observation: taken from the policy, not the caller
OBSERVATION_FIELDS = ("max_users", "max_gamma", "user_order", "input_tokens", "output_tokens", "deadline_s")
#: what policy.json's "post_step" may name (None: absent): agents.plan_repair.POST_STEP_OPTIONS
POST_STEPS = (None, *POST_STEP_OPTIONS)


ALGOS = ("dqn", "maskable_ppo", "ppo")  #: the SB3 algorithms a policy folder may hold


def algo_class(name: str) -> type[BaseAlgorithm]:
    """The stable-baselines3 class of algorithm ``name`` (one of ``ALGOS``)."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import DQN, PPO

    algos = dict(zip(ALGOS, (DQN, MaskablePPO, PPO), strict=True))
    if name not in algos:
        raise ValueError(f"unknown algorithm {name!r}; known: {list(ALGOS)}")
    return algos[name]


def resolve_policy_path(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``path`` is a folder or its ``model.zip``; returns the zip and the policy metadata."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"policy_path {str(path)!r} does not exist (give a policy folder or its model.zip)")
    folder = p if p.is_dir() else p.parent
    model = p if p.suffix == ".zip" else folder / "model.zip"
    meta_path = folder / "policy.json"
    if not model.is_file():
        raise FileNotFoundError(f"no policy model at {model}")
    if not meta_path.is_file():
        raise FileNotFoundError(f"no policy.json beside {model} (written by agents.train)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{meta_path} is not valid JSON ({exc})") from None
    missing = [key for key in ("env",) if key not in meta] if isinstance(meta, dict) else ["env"]
    if missing:
        raise ValueError(f"{meta_path} lacks the key(s) {missing} (policy.json as agents.train writes it)")
    return model, meta


class PolicyScheduler(Scheduler):
    """A trained policy; its own ``max_gamma`` (from ``policy.json``) replaces the caller's, and
    ``draft_depth`` is capped at it."""

    name = "policy"

    def __init__(self, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None, path: str | Path = ""):
        model_path, meta = resolve_policy_path(path)
        if meta.get("env_id", "EdgeSchedule-v0") != "EdgeSchedule-v0":  # its observation is another env's
            raise ValueError(f"policy {model_path} was trained on {meta['env_id']}: evaluate it on its own rounds (env.id={meta['env_id']}; agents.policy_v1)")
        trained = meta["env"]
        # the observation is the policy's own (look-ahead, depths, order, ranges); every other env
        # field is irrelevant to the plan: the env prices with the caller's cost model (below)
        overrides = {k: trained[k] for k in OBSERVATION_FIELDS if k in trained}
        if overrides.get("max_users") is None:
            overrides["max_users"] = trained["num_users"]
        cfg = EnvConfig(num_users=trained["num_users"], **overrides).validate()
        #: how the policy observes a round (from policy.json, not from the caller's env config)
        self.observation = {k: getattr(cfg, k) for k in ("max_users", "user_order")}
        super().__init__(cost, cfg.max_gamma, draft_depth=min(draft_depth, cfg.max_gamma), seed=seed)
        self.algo = meta["algo"]
        self.model = algo_class(self.algo).load(model_path, device="cpu")
        self.masked = self.algo == "maskable_ppo"
        from agents.masked_policy import MaskedArgmax

        # the same module the ONNX export traces: one forward pass, no SB3 predict() overhead
        self.net = MaskedArgmax(self.model, use_mask=self.masked).eval()
        from agents.set_policy_fast import CachedSetActor, supports

        # set policies: user encodings cached per round, numpy (agents/set_policy_fast.py; same actions)
        self.fast = CachedSetActor(self.model) if self.masked and supports(self.model) else None
        self.env = EdgeScheduleEnv(**cfg.to_dict())
        self.env.set_cost_model(cost)  # same cost model (and profile/memory) as the other schedulers
        #: policy.json's "post_step": "improve" runs agents.plan_repair.improve on the policy's plan
        #: (inside the timed decision), "improve_mixed" the same with the mixed re-pack
        #: (agents.mixed_repack); absent = the policy's plan as it is
        self.post_step = meta.get("post_step")
        if self.post_step not in POST_STEPS:
            raise ValueError(f"policy.json post_step must be absent or one of {POST_STEPS[1:]}, got {self.post_step!r}")

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        """The deterministic action; unmasked algorithms (PPO, DQN) act without the mask."""
        import torch

        if self.fast is not None:
            return self.fast.act(obs, mask)
        with torch.no_grad():  # the module ignores the mask of an unmasked algorithm itself (as the ONNX export does)
            return int(self.net(torch.as_tensor(obs[None]), torch.as_tensor(mask[None], dtype=torch.float32))[0])

    def decide(self, rnd: Round) -> Plan:
        env = self.env
        if rnd.num_users != env.cfg.num_users:
            env = self.env = EdgeScheduleEnv(**env.cfg.replace(num_users=rnd.num_users).to_dict())
            env.set_cost_model(self.cost)
        obs, _ = env.reset(options={"round": rnd})
        if self.fast is not None:
            self.fast.reset()
        while True:
            obs, _, term, trunc, info = env.step(self.act(obs, env.action_masks()))
            if term or trunc:
                break
        plan = Plan(info["modes"], gamma=max(int(info["gamma"]), 1), z=float(info["z"]), lam=float(info["lam"]))
        if self.post_step is not None:
            plan = improve_plan(self.cost, rnd, plan, self.max_gamma, **POST_STEP_OPTIONS[self.post_step]._asdict())
        return plan
