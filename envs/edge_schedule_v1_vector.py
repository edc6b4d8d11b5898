"""The native numpy vector twin of EdgeSchedule-v1 (``vector_entry_point``): N rounds stepped together.

Same actions, masks, observations, rewards and final ``info`` as ``envs.edge_schedule_v1`` (module
docstring there); sub-env ``i`` seeded ``seed + i`` reproduces the scalar env seeded ``seed + i``.
``autoreset_mode`` is ``"next_step"`` (an ended sub-env resets on the next ``step``, whose action it
ignores). ``reset(options={"rounds": [Round, ...]})`` plays the given rounds first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from envs.actions import action_indices
from envs.edge_schedule_v1 import (
    HEAD,
    USER_FEATURES,
    final_info,
    make_models,
    observation_size,
    round_features,
)
from envs.edge_schedule_vector import vector_reset_inputs
from envs.plan import AD, ED, REJECT, SD
from envs.split_builder import SplitPlanBuilder
from envs.split_plan import EdUsers, ed_users, shares_split
from envs.workload import Round, sample_round

INFO_KEYS = ("served", "admitted_ad", "admitted_sd", "admitted_ed", "rejected", "late", "gamma", "z", "ed_share", "lam")


class _V1Rounds:
    """Per-round arrays in presentation order, stacked for N rounds."""

    def __init__(self, n: int, k: int, g: int, k_max: int):
        self.order = np.zeros((n, k), dtype=np.int64)
        self.inp = np.zeros((n, k), dtype=np.int64)
        self.out = np.zeros((n, k), dtype=np.int64)
        self.alpha, self.up, self.slack, self.deadline, self.prefill = (np.zeros((n, k)) for _ in range(5))
        self.ed_j = np.ones((n, k, g), dtype=np.int64)
        self.ed_x = np.zeros((n, k, g))
        self.ed_ok = np.zeros((n, k, g), dtype=bool)
        # users 0..k-1 then k_max + 1 rows of zeros: the current user at t = k and the look-ahead past
        # the round's end read zeros, so the look-ahead is one slice (no per-element gather and mask)
        self.feats = np.zeros((n, k + k_max + 1, USER_FEATURES), dtype=np.float32)
        self.rounds: list[Round | None] = [None] * n
        self.users: list[EdUsers | None] = [None] * n

    def load(self, i: int, rnd: Round, env: EdgeScheduleV1VectorEnv) -> None:
        cfg = env.cfg
        order = rnd.order(cfg.user_order)
        r = rnd.subset(order)
        self.rounds[i] = rnd
        self.order[i] = order
        self.inp[i], self.out[i], self.alpha[i] = r.input_tokens, r.output_tokens, r.alpha
        self.up[i], self.slack[i], self.deadline[i] = r.uplink_s, r.slack_s, r.deadline_s
        self.feats[i, : len(order)] = round_features(rnd, order, cfg)
        if env.split is not None and rnd.has_edge is not None and rnd.has_edge.any():
            users = self.users[i] = ed_users(env.split, rnd, cfg.max_gamma)  # the round's original order
            self.ed_j[i], self.ed_x[i], self.ed_ok[i], self.prefill[i] = users.iterations[order], users.edge_s[order], users.allowed[order], users.prefill_s[order]
        else:
            self.users[i] = None
            self.ed_j[i], self.ed_x[i], self.ed_ok[i], self.prefill[i] = 1, 0.0, False, 0.0

    def user(self, t: np.ndarray):
        rows = np.arange(len(t))
        tt = np.minimum(t, self.inp.shape[1] - 1)
        return (self.inp[rows, tt], self.out[rows, tt], self.alpha[rows, tt], self.up[rows, tt], self.slack[rows, tt], self.deadline[rows, tt],
                self.ed_j[rows, tt], self.ed_x[rows, tt], self.ed_ok[rows, tt], self.prefill[rows, tt])


class EdgeScheduleV1VectorEnv(VectorEnv):
    """``N`` EdgeSchedule-v1 rounds in numpy; ``action_masks()`` is (N, 2 + 2G)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 8, **kwargs: Any):
        kwargs.pop("render_mode", None)
        self.cfg, self.cost, self.split, _ = make_models(kwargs)
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:  # 2.5 or "3" is a mistake, not 2 or 3
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        self.num_envs = int(num_envs)
        g, k = self.cfg.max_gamma, self.cfg.num_users
        self._na = 2 + 2 * g
        self.single_action_space = spaces.Discrete(self._na)
        self.single_observation_space = spaces.Box(0.0, 1.0, shape=(observation_size(self.cfg),), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(np.full(self.num_envs, self._na))
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.num_envs, observation_size(self.cfg)), dtype=np.float32)
        self._builder = SplitPlanBuilder(self.cost, self.num_envs, g)
        self._data = _V1Rounds(self.num_envs, k, g, self.cfg.k_max)
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._modes = np.zeros((self.num_envs, k), dtype=np.int8)
        self._depth = np.zeros((self.num_envs, k), dtype=np.int64)
        self._rngs = [seeding.np_random(None)[0] for _ in range(self.num_envs)]
        self._needs_reset = np.ones(self.num_envs, dtype=bool)
        self._masks = np.ones((self.num_envs, self._na), dtype=bool)
        self._budget = max(float(self.cost.memory_budget(True)), 1.0)

    def _reset_envs(self, which: np.ndarray, rounds: list[Round] | None = None) -> None:
        for i in np.flatnonzero(which):
            self._data.load(i, rounds[i] if rounds is not None else sample_round(self._rngs[i], self.cfg), self)
        self._builder.reset(which)
        self._t[which] = 0
        self._modes[which] = REJECT
        self._depth[which] = 0
        self._needs_reset[which] = False

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        rngs, rounds = vector_reset_inputs(self.num_envs, self.cfg.num_users, seed, options)
        if rngs is not None:
            self._rngs = rngs
        self._reset_envs(np.ones(self.num_envs, dtype=bool), rounds)
        self._masks = self._builder.prepare(*self._data.user(self._t))
        return self._encode(), {}

    def action_masks(self) -> np.ndarray:
        return self._masks.copy()

    def step(self, actions):
        g, k = self.cfg.max_gamma, self.cfg.num_users
        actions = action_indices(actions, self.num_envs, self._na)
        resetting = self._needs_reset.copy()
        active = ~resetting
        valid = self._builder.apply(np.where(active, actions, 0))
        rows = np.flatnonzero(active)
        mode = np.where(~valid | (actions == 0), REJECT, np.where(actions == 1, AD, np.where(actions <= 1 + g, SD, ED))).astype(np.int8)
        self._modes[rows, self._t[rows]] = mode[rows]
        self._depth[rows, self._t[rows]] = np.where(mode[rows] == ED, actions[rows] - 1 - g, 0)
        rewards = np.where(active & (mode != REJECT) & (self.cfg.reward_timing == "admission"), 1.0, 0.0)
        self._t[active] += 1
        terminated = active & (self._t >= k)
        infos: dict[str, Any] = {"invalid_action": active & ~valid, "_invalid_action": active.copy()}
        if terminated.any():
            final = {key: np.zeros(self.num_envs) for key in INFO_KEYS}
            b = self._builder
            for i in np.flatnonzero(terminated):
                shares = shares_split(*(float(x) for x in b.share[:, i]), *(float(x) for x in b.mem[:, i]), *(int(x) for x in b.b[:, i]))
                fi = final_info(self.cfg, self.cost, self.split, self._data.rounds[i], self._data.order[i], self._modes[i], self._depth[i],
                                int(b.gamma[i]), shares, self._rngs[i], self._data.users[i])
                for key in INFO_KEYS:
                    final[key][i] = fi[key]
                rewards[i] += -fi["late"] if self.cfg.reward_timing == "admission" else fi["served"]
            for key in INFO_KEYS:
                infos[key] = final[key]
                infos[f"_{key}"] = terminated.copy()
        if resetting.any():
            self._reset_envs(resetting)
        self._masks = self._builder.prepare(*self._data.user(self._t))
        self._masks[terminated] = False
        self._masks[terminated, 0] = True
        self._needs_reset = terminated
        return self._encode(), rewards, terminated, np.zeros(self.num_envs, dtype=bool), infos

    def _encode(self) -> np.ndarray:
        """The observation table of ``envs.edge_schedule_v1`` for every sub-env."""
        cfg, b, data, t = self.cfg, self._builder, self._data, self._t
        n, k = data.inp.shape
        obs = np.zeros((n, observation_size(cfg)), dtype=np.float32)
        rows = np.arange(n)
        live = t < k
        obs[:, :USER_FEATURES] = data.feats[rows, t]  # t <= k; row k is zeros
        col = USER_FEATURES
        for m in (0, 1, 2):
            slack = np.where(np.isfinite(b.slack_min[m]), b.slack_min[m], cfg.deadline_s[1])
            for value in (b.b[m] / k, b.s_max[m] / cfg.input_tokens[1], b.n_max[m] / cfg.output_tokens[1], b.share[m], b.mem[m] / self._budget, slack / cfg.deadline_s[1]):
                obs[:, col] = value
                col += 1
        obs[:, col] = b.gamma / cfg.max_gamma
        obs[:, col + 1] = np.where(live, b.candidate_ad_share(), 1.0)
        obs[:, col + 2] = t / k
        np.clip(obs[:, :HEAD], 0.0, 1.0, out=obs[:, :HEAD])
        obs[:, HEAD : HEAD + self._na] = self._masks
        future = obs[:, HEAD + self._na :].reshape(n, cfg.k_max, USER_FEATURES)
        t0 = int(t[0])
        if (t == t0).all():  # sub-envs in step (training, benchmarks): one strided copy
            future[:] = data.feats[:, t0 + 1 : t0 + 1 + cfg.k_max]
        else:  # each sub-env its own window of users t+1 .. t+k_max (zero rows past the round's end)
            windows = np.lib.stride_tricks.sliding_window_view(data.feats, cfg.k_max, axis=1)  # (n, k + 2, features, k_max)
            future[:] = windows[rows, t + 1].transpose(0, 2, 1)
        return obs
