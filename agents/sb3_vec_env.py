"""stable-baselines3's ``VecEnv`` over the native numpy vector env (no per-env Python objects).

SB3 does not use Gymnasium vector envs: it wants its own ``VecEnv`` with same-step autoreset,
``infos[i]["terminal_observation"]`` and Monitor-style ``infos[i]["episode"]``. This adapter gives
exactly that around :class:`envs.edge_schedule_vector.EdgeScheduleVectorEnv` (``autoreset_mode="same_step"``),
plus ``env_method("action_masks")`` for MaskablePPO.

Training rounds come from the **train** stream (``envs.workload.train_env_seeds``): ``seed(s)``
(which SB3 calls with the algorithm's seed) gives sub-env ``i`` the train-stream generator
``(s, i, stage, start_step)``, so no training round is ever a validation or test round. An env
that is never seeded draws a random train-stream seed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

from envs.config import EnvConfig
from envs.edge_schedule_vector import EdgeScheduleVectorEnv
from envs.workload import Round, train_env_seeds

FINAL_KEYS = ("served", "admitted_ad", "admitted_sd", "rejected", "late", "gamma", "z", "lam")


class EdgeScheduleSB3VecEnv(VecEnv):
    def __init__(self, num_envs: int, env_kwargs: dict[str, Any], stage: int = 0, start_step: int = 0):
        """``stage`` (curriculum stage) and ``start_step`` (timestep a resumed run starts at) select fresh train rounds."""
        self.venv = self.make_vector_env(num_envs, env_kwargs)
        super().__init__(num_envs, self.venv.single_observation_space, self.venv.single_action_space)
        self.stage = stage
        self.start_step = start_step
        self.seed(None)
        self._actions = np.zeros(num_envs, dtype=np.int64)
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._t0 = time.time()

    @staticmethod
    def make_vector_env(num_envs: int, env_kwargs: dict[str, Any]) -> EdgeScheduleVectorEnv:
        """The native vector env this adapter drives (subclasses drive another)."""
        return EdgeScheduleVectorEnv(num_envs=num_envs, autoreset_mode="same_step", **env_kwargs)

    @property
    def cfg(self) -> EnvConfig:
        """The environments' configuration (the vector env's)."""
        return self.venv.cfg

    def seed(self, seed: int | None = None) -> list[int]:
        """Seed sub-env ``i`` with train-stream generator ``(seed, i, stage, start_step)`` at the next reset."""
        if seed is None:
            seed = int(np.random.default_rng().integers(0, 2**32))
        self._seeds = train_env_seeds(int(seed), self.num_envs, self.stage, self.start_step)
        return list(self._seeds)

    def reset(self, rounds: Sequence[Round] | None = None) -> np.ndarray:
        seeds = list(self._seeds) if self._seeds[0] is not None else None
        obs, _ = self.venv.reset(seed=seeds, options={"rounds": rounds} if rounds is not None else None)
        self._reset_seeds()
        self._returns[:] = 0
        self._lengths[:] = 0
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)

    def step_wait(self) -> VecEnvStepReturn:
        obs, rewards, term, trunc, info = self.venv.step(self._actions)
        self._returns += rewards
        self._lengths += 1
        dones = term | trunc
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        invalid = info.get("invalid_action")
        for i in range(self.num_envs):
            if invalid is not None:
                infos[i]["invalid_action"] = bool(invalid[i])
        for i in np.flatnonzero(dones):
            d = infos[i]
            d["terminal_observation"] = info["final_obs"][i]
            d["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
            d["episode"] = {"r": float(self._returns[i]), "l": int(self._lengths[i]), "t": round(time.time() - self._t0, 6)}
            for key in FINAL_KEYS:
                d[key] = float(info[key][i])
            self._returns[i] = 0
            self._lengths[i] = 0
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        pass

    def action_masks(self) -> np.ndarray:
        return self.venv.action_masks()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self.venv, attr_name) for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self.venv, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list[Any]:
        idx = list(self._get_indices(indices))
        if method_name == "action_masks":
            masks = self.venv.action_masks()
            return [masks[i] for i in idx]
        result = getattr(self.venv, method_name)(*method_args, **method_kwargs)
        return [result for _ in idx]

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs
