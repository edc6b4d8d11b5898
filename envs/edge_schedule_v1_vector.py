"""The native numpy vector twin of EdgeSchedule-v1 (``vector_entry_point``): N rounds stepped together.

Same actions, masks, observations, rewards and final ``info`` as ``envs.edge_schedule_v1`` (module
docstring there); sub-env ``i`` seeded ``seed + i`` reproduces the scalar env seeded ``seed + i``.
``autoreset_mode`` is ``"next_step"`` (an ended sub-env resets on the next ``step``, whose action it
ignores). ``reset(options={"rounds": [Round, ...]})`` plays the given rounds first.

Speed (issue #13): the sub-envs end their rounds on the same step, so their final infos
(``envs.split_final_batch``) and their next rounds (``envs.split_reset_batch``: each drawn from its
sub-env's own generator, then priced together) are computed for all of them at once, by the
one-round path's operations element by element (``tests/test_v1_reset_batch.py`` pins them bit for bit).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from numpy.typing import ArrayLike

from envs.actions import action_indices
from envs.edge_schedule_v1 import (
    HEAD,
    USER_FEATURES,
    final_info,
    make_models,
    observation_size,
)
from envs.edge_schedule_vector import check_num_envs, vector_reset_inputs
from envs.plan import AD, ED, REJECT, SD
from envs.split_builder import SplitPlanBuilder
from envs.split_final_batch import batchable, final_infos
from envs.split_plan import shares_split
from envs.split_reset_batch import V1Rounds, load_rounds, sample_rounds
from envs.workload import Round

INFO_KEYS = ("served", "admitted_ad", "admitted_sd", "admitted_ed", "rejected", "late", "gamma", "z", "ed_share", "lam")


class EdgeScheduleV1VectorEnv(VectorEnv):
    """``N`` EdgeSchedule-v1 rounds in numpy; ``action_masks()`` is (N, 2 + 2G)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 8, **kwargs: Any):
        render_mode = kwargs.pop("render_mode", None)  # gymnasium.make_vec passes None
        if render_mode is not None:
            raise ValueError(f"render_mode must be None: the v1 vector env has no render modes (render a scalar EdgeSchedule-v1), got {render_mode!r}")
        self.cfg, self.cost, self.split, _ = make_models(kwargs)
        self.num_envs = check_num_envs(num_envs, self.cfg.num_users)
        g, k = self.cfg.max_gamma, self.cfg.num_users
        self._na = 2 + 2 * g
        self.single_action_space = spaces.Discrete(self._na)
        self.single_observation_space = spaces.Box(0.0, 1.0, shape=(observation_size(self.cfg),), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(np.full(self.num_envs, self._na))
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.num_envs, observation_size(self.cfg)), dtype=np.float32)
        self._builder = SplitPlanBuilder(self.cost, self.num_envs, g)
        self._data = V1Rounds(self.num_envs, k, g, self.cfg.k_max)
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._modes = np.zeros((self.num_envs, k), dtype=np.int8)
        self._depth = np.zeros((self.num_envs, k), dtype=np.int64)
        self._rngs = [seeding.np_random(None)[0] for _ in range(self.num_envs)]
        self._needs_reset = np.ones(self.num_envs, dtype=bool)
        self._masks = np.ones((self.num_envs, self._na), dtype=bool)
        self._budget = max(float(self.cost.memory_budget(True)), 1.0)

    def _load_rounds(self, idx: np.ndarray, rounds: list[Round] | None) -> None:
        """Sub-envs ``idx`` start ``rounds`` (one per sub-env of the vector env) or rounds drawn from
        their own generators. All at once (``envs.split_reset_batch``, the vector env's hot spot): each
        draws from its own generator, the arithmetic runs on their users concatenated -- the same
        values as loading one round at a time."""
        if rounds is not None:
            load_rounds(self._data, idx, [rounds[i] for i in idx.tolist()], self.cfg, self.split)
        elif len(idx):
            sampled, big = sample_rounds([self._rngs[i] for i in idx.tolist()], self.cfg)
            load_rounds(self._data, idx, sampled, self.cfg, self.split, big)

    def _reset_envs(self, which: np.ndarray, rounds: list[Round] | None = None) -> None:
        self._load_rounds(np.flatnonzero(which), rounds)
        self._builder.reset(which)
        self._t[which] = 0
        self._modes[which] = REJECT
        self._depth[which] = 0
        self._needs_reset[which] = False

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        rngs, rounds = vector_reset_inputs(self.num_envs, self.cfg.num_users, seed, options)
        if rngs is not None:
            self._rngs = rngs
        self._reset_envs(np.ones(self.num_envs, dtype=bool), rounds)
        self._masks = self._builder.prepare(*self._data.user(self._t))
        return self._encode(), {}

    def action_masks(self) -> np.ndarray:
        return self._masks.copy()

    def step(self, actions: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
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
            final = self._final_infos(np.flatnonzero(terminated))
            rewards += -final["late"] if self.cfg.reward_timing == "admission" else final["served"]  # 0 where not terminated
            for key in INFO_KEYS:
                infos[key] = final[key]
                infos[f"_{key}"] = terminated.copy()
        if resetting.any():
            self._reset_envs(resetting)
        self._masks = self._builder.prepare(*self._data.user(self._t))
        self._masks[terminated] = False
        self._masks[terminated, 0] = True
        self._needs_reset = terminated.copy()  # a copy: _reset_envs clears it, and the caller keeps `terminated`
        return self._encode(), rewards, terminated, np.zeros(self.num_envs, dtype=bool), infos

    def _final_infos(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The final ``info`` numbers (INFO_KEYS, (N,), 0 outside ``idx``) of the sub-envs ``idx`` that
        ended their rounds: ``final_info``'s, all in one ``envs.split_final_batch.final_infos`` call
        where its outcome model applies, one ``final_info`` per round elsewhere."""
        b, data = self._builder, self._data
        final = {key: np.zeros(self.num_envs) for key in INFO_KEYS}
        rows = list(zip(b.share[:, idx].T.tolist(), b.mem[:, idx].T.tolist(), b.b[:, idx].T.tolist(), strict=True))
        shares = np.array([shares_split(*sh, *mm, *nb) for sh, mm, nb in rows]).reshape(len(idx), 3)
        one_by_one = np.ones(len(idx), dtype=bool)
        if batchable(self.cfg):
            rounds = [data.rounds[i] for i in idx.tolist()]
            realised = [np.stack([getattr(r, name) for r in rounds]) for name in ("realized_output_tokens", "realized_alpha", "realized_downlink_s")]
            if self.cfg.user_order != "arrival":  # the data's arrays are in presentation order
                realised = [np.take_along_axis(a, data.order[idx], axis=1) for a in realised]
            out, alpha, down = realised
            modes = self._modes[idx]
            # an ED user's constants were priced on the predictions: rounds realising other values re-price them (final_info)
            one_by_one = (modes == ED).any(axis=1) & ~((out == data.out[idx]).all(axis=1) & (alpha == data.alpha[idx]).all(axis=1))
            ok = ~one_by_one
            if ok.any():
                at = idx[ok]
                got = final_infos(self.cost, data.inp[at], out[ok], alpha[ok], data.up[at], down[ok], data.deadline[at], modes[ok], self._depth[at],
                                  b.gamma[at], shares[ok], data.ed_j[at], data.ed_x[at], data.prefill[at])
                for key in INFO_KEYS:
                    final[key][at] = got[key]
        for j in np.flatnonzero(one_by_one).tolist():
            i = int(idx[j])
            fi = final_info(self.cfg, self.cost, self.split, data.rounds[i], data.order[i], self._modes[i], self._depth[i],
                            int(b.gamma[i]), tuple(shares[j].tolist()), self._rngs[i], data.users[i])
            for key in INFO_KEYS:
                final[key][i] = fi[key]
        return final

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
