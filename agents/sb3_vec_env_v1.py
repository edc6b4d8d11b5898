"""stable-baselines3's ``VecEnv`` over EdgeSchedule-v1's native vector twin (``envs.edge_schedule_v1_vector``).

The v0 adapter (``agents.sb3_vec_env``) relies on v0's ``autoreset_mode="same_step"``; v1's twin
autoresets on the next step only. Every v1 episode is exactly ``num_users`` steps long and all
sub-envs are reset together, so they all end on the same step: this adapter then resets them all
inside that step (SB3's same-step convention: ``infos[i]["terminal_observation"]``, Monitor-style
``infos[i]["episode"]``) by a plain ``reset()`` that continues each sub-env's train-stream
generator. Training rounds come from the **train** stream exactly as for v0
(``envs.workload.train_env_seeds``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn

from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
from envs.edge_schedule_v1_vector import INFO_KEYS, EdgeScheduleV1VectorEnv

if TYPE_CHECKING:
    from envs.edge_schedule_v1_vector import EdgeScheduleV1VectorEnv


class EdgeScheduleV1SB3VecEnv(EdgeScheduleSB3VecEnv):
    """``num_envs`` EdgeSchedule-v1 rounds for SB3; ``env_kwargs`` are v1's keyword arguments."""

    @staticmethod
    def make_vector_env(num_envs: int, env_kwargs: dict[str, Any]) -> EdgeScheduleV1VectorEnv:
        return EdgeScheduleV1VectorEnv(num_envs=num_envs, **env_kwargs)

    def step_wait(self) -> VecEnvStepReturn:
        obs, rewards, term, trunc, info = self.venv.step(self._actions)
        self._returns += rewards
        self._lengths += 1
        dones = term | trunc
        if dones.any() and not dones.all():  # cannot happen: equal-length episodes started together
            raise RuntimeError(f"EdgeSchedule-v1 sub-envs ended on different steps ({int(dones.sum())} of {self.num_envs}); the same-step reset needs all")
        invalid = info["invalid_action"]
        infos: list[dict[str, Any]] = [{"invalid_action": bool(invalid[i])} for i in range(self.num_envs)]
        if dones.all():
            for i in range(self.num_envs):
                d = infos[i]
                d["terminal_observation"] = obs[i]
                d["TimeLimit.truncated"] = False
                d["episode"] = {"r": float(self._returns[i]), "l": int(self._lengths[i]), "t": round(time.time() - self._t0, 6)}
                for key in INFO_KEYS:
                    d[key] = float(info[key][i])
            self._returns[:] = 0
            self._lengths[:] = 0
            obs, _ = self.venv.reset()  # seed=None: each sub-env's generator goes on (fresh train rounds)
        return obs, rewards.astype(np.float32), dones, infos
