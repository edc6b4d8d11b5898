"""EdgeSchedule-v0's vector twin: ``N`` rounds stepped together in numpy.

``gymnasium.make_vec("EdgeSchedule-v0", num_envs=N, vectorization_mode="vector_entry_point")``
builds :class:`EdgeScheduleVectorEnv`. Sub-env ``i`` seeded with ``seed + i`` reproduces the scalar
env (``envs.edge_schedule``, whose docstring defines the actions, observation and reward) seeded
``seed + i``, observation for observation. Separate from the scalar env because it is a second
implementation of the same table (the scalar env's cached rows are tested against this one,
built from scratch every step) and because the v1 vector env shares its reset checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from numpy.typing import ArrayLike

from envs.actions import action_indices
from envs.config import EnvConfig
from envs.cost_model import CostModel
from envs.edge_schedule import (
    BATCH_FEATURES,
    RENDER_MODES,
    USER_FEATURES,
    RoundArrays,
    check_render_mode,
    draw,
    final_info,
    observation_size,
    reset_options,
)
from envs.plan import AD, REJECT, SD
from envs.plan_builder import PlanBuilder
from envs.render import PlanView
from envs.workload import Round, sample_round


def encode_rounds(cfg: EnvConfig, cost: CostModel, builder: PlanBuilder, data: RoundArrays, t: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The observation of N rounds whose current user index is ``t`` (``envs.edge_schedule``'s table), built from scratch."""
    n, k = data.inp.shape
    k_max = cfg.k_max
    head = USER_FEATURES + 2 * BATCH_FEATURES + 3
    obs = np.zeros((n, observation_size(cfg)), dtype=np.float32)
    rows = np.arange(n)
    live = t < k
    obs[:, :USER_FEATURES] = data.feats[rows, np.minimum(t, k - 1)] * live[:, None]
    budget = max(float(cost.memory_budget(True)), 1.0)
    col = USER_FEATURES
    for m in (0, 1):
        slack = np.where(np.isfinite(builder.slack_min[m]), builder.slack_min[m], cfg.deadline_s[1])
        for value in (builder.b[m] / k, builder.s_max[m] / cfg.input_tokens[1], builder.n_max[m] / cfg.output_tokens[1], builder.share[m], builder.mem[m] / budget, slack / cfg.deadline_s[1]):
            obs[:, col] = value
            col += 1
    obs[:, col] = builder.gamma / cfg.max_gamma
    obs[:, col + 1] = np.where(live, builder.candidate_shares()[0], 1.0) if builder.is_prepared else 1.0
    obs[:, col + 2] = t / k
    np.clip(obs[:, :head], 0.0, 1.0, out=obs[:, :head])
    obs[:, head : head + masks.shape[1]] = masks
    future = obs[:, head + masks.shape[1] :].reshape(n, k_max, USER_FEATURES)
    t0 = int(t[0])
    if np.all(t == t0):  # the usual case: every round is at the same user
        m = max(0, min(k - t0 - 1, k_max))
        future[:, :m] = data.feats[:, t0 + 1 : t0 + 1 + m]
    else:
        idx = t[:, None] + 1 + np.arange(k_max)[None, :]
        present = idx < k
        future[:] = data.feats[rows[:, None], np.minimum(idx, k - 1)] * present[:, :, None]
    return obs


#: the most user slots (num_envs x num_users) a vector env holds: its per-slot state is tens of bytes
#: in several arrays, so this is already gigabytes; beyond it numpy's MemoryError would not name the field
MAX_USER_SLOTS = 1 << 27


def check_num_envs(num_envs: Any, num_users: int) -> int:
    """``num_envs`` as an int, or ValueError naming the field and its allowed range."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:  # 2.5 or "3" is a mistake, not 2 or 3
        raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
    top = max(1, MAX_USER_SLOTS // max(num_users, 1))
    if num_envs > top:
        raise ValueError(f"num_envs must be in [1, {top:,}] at num_users={num_users} (num_envs x num_users <= {MAX_USER_SLOTS:,}: memory), got {num_envs:,}")
    return int(num_envs)


def vector_reset_inputs(num_envs: int, num_users: int, seed: int | list[int] | None, options: dict | None) -> tuple[list[np.random.Generator] | None, list[Round] | None]:
    """A vector env's ``reset(seed=, options=)`` checked: one generator per sub-env (``seed + i``, or
    the given list; None without a seed) and the given ``options["rounds"]`` (None if absent)."""
    rngs = None
    if seed is not None:
        seeds = [seed + i for i in range(num_envs)] if isinstance(seed, int) else list(seed)
        if len(seeds) != num_envs:
            raise ValueError(f"reset(seed=...) needs {num_envs} seeds, got {len(seeds)}")
        rngs = [seeding.np_random(s)[0] for s in seeds]
    rounds = reset_options(options, "rounds").get("rounds")
    if rounds is not None and (isinstance(rounds, str | bytes) or not hasattr(rounds, "__len__") or len(rounds) != num_envs
                               or any(not isinstance(r, Round) or r.num_users != num_users for r in rounds)):
        raise ValueError(f"options['rounds'] must be a list of {num_envs} Rounds of {num_users} users")
    return rngs, rounds



class EdgeScheduleVectorEnv(VectorEnv):
    """``N`` independent rounds stepped together in numpy.

    Sub-env ``i`` draws its rounds from its own generator seeded with ``seed + i``, so it
    reproduces ``EdgeScheduleEnv`` reset with ``seed + i``. ``action_masks()`` returns (N, 2 + G).
    ``autoreset_mode`` is ``"next_step"`` (Gymnasium's default) or ``"same_step"`` (an ended
    sub-env resets inside the same ``step``; its last observation is in ``info["final_obs"]``).
    ``reset(options={"rounds": [Round, ...]})`` plays the given rounds (one per sub-env) first.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": RENDER_MODES, "render_fps": 4}

    def __init__(self, num_envs: int = 8, autoreset_mode: str = "next_step", render_mode: str | None = None, **kwargs: Any):
        self.render_mode = check_render_mode(render_mode)
        if autoreset_mode not in ("next_step", "same_step"):
            raise ValueError(f"autoreset_mode must be 'next_step' or 'same_step', got {autoreset_mode!r}")
        self._same_step = autoreset_mode == "same_step"
        self.metadata = {**self.metadata, "autoreset_mode": AutoresetMode.SAME_STEP if self._same_step else AutoresetMode.NEXT_STEP}
        self.cfg = EnvConfig.from_kwargs(**kwargs)
        self.num_envs = check_num_envs(num_envs, self.cfg.num_users)
        self.cost = CostModel.from_config(self.cfg)
        self.single_action_space = spaces.Discrete(2 + self.cfg.max_gamma)
        self.single_observation_space = spaces.Box(0.0, 1.0, shape=(observation_size(self.cfg),), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(np.full(self.num_envs, 2 + self.cfg.max_gamma))
        self.observation_space = spaces.Box(0.0, 1.0, shape=(self.num_envs, observation_size(self.cfg)), dtype=np.float32)
        self._builder = PlanBuilder(self.cost, self.num_envs, self.cfg.max_gamma)
        self._data = RoundArrays(self.num_envs, self.cfg.num_users)
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._modes = np.zeros((self.num_envs, self.cfg.num_users), dtype=np.int8)
        self._rngs = [seeding.np_random(None)[0] for _ in range(self.num_envs)]
        self._needs_reset = np.ones(self.num_envs, dtype=bool)
        self._masks = np.ones((self.num_envs, 2 + self.cfg.max_gamma), dtype=bool)

    def _reset_envs(self, which: np.ndarray, rounds: list[Round] | None = None) -> None:
        for i in np.flatnonzero(which):
            rnd = rounds[i] if rounds is not None else sample_round(self._rngs[i], self.cfg)
            self._data.load(i, rnd, self.cfg)
        self._builder.reset(which)
        self._t[which] = 0
        self._modes[which] = REJECT
        self._needs_reset[which] = False

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        rngs, rounds = vector_reset_inputs(self.num_envs, self.cfg.num_users, seed, options)
        if rngs is not None:
            self._rngs = rngs
        self._reset_envs(np.ones(self.num_envs, dtype=bool), rounds)
        self._masks = self._builder.prepare(*self._data.user(self._t))
        return encode_rounds(self.cfg, self.cost, self._builder, self._data, self._t, self._masks), {}

    def action_masks(self) -> np.ndarray:
        return self._masks.copy()

    def render(self) -> tuple | None:
        """One frame per sub-env (as the scalar env renders it), or None without a render mode."""
        if self.render_mode is None:
            return None
        b = self._builder
        z, lam = b.shares()
        budget = max(float(self.cost.memory_budget(True)), 1.0)
        frames = []
        for i in range(self.num_envs):
            view = PlanView(self._data.rounds[i], self._data.order[i].copy(), self._modes[i].copy(), int(self._t[i]), int(b.gamma[i]), float(z[i]), float(lam[i]),
                            (int(b.b[0, i]), int(b.b[1, i])), (float(b.share[0, i]), float(b.share[1, i])), (float(b.mem[0, i]), float(b.mem[1, i])), budget,
                            tuple(bool(m) for m in self._masks[i]))
            frames.append(draw(view, self.render_mode, self.cost, self.cfg))
        return tuple(frames)

    def step(self, actions: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        # -1 for an action outside Discrete(2 + G): the builder rejects it and it is flagged
        actions = action_indices(actions, self.num_envs, 2 + self.cfg.max_gamma)
        resetting = self._needs_reset.copy()
        active = ~resetting
        # sub-envs that ended last step reset now (their action is ignored: act as reject)
        valid = self._builder.apply(np.where(active, actions, 0))
        k = self.cfg.num_users
        rows = np.flatnonzero(active)
        mode = np.where(~valid | (actions == 0), REJECT, np.where(actions == 1, AD, SD)).astype(np.int8)
        self._modes[rows, self._t[rows]] = mode[rows]
        rewards = np.where(active & (mode != REJECT) & (self.cfg.reward_timing == "admission"), 1.0, 0.0)
        self._t[active] += 1
        terminated = active & (self._t >= k)
        infos: dict[str, Any] = {"invalid_action": active & ~valid, "_invalid_action": active.copy()}
        if terminated.any():
            keys = ("served", "admitted_ad", "admitted_sd", "rejected", "late", "gamma", "z", "lam")
            final = {key: np.zeros(self.num_envs) for key in keys}
            for i in np.flatnonzero(terminated):
                z, lam = self._builder.shares()
                fi = final_info(self.cfg, self.cost, int(self._builder.gamma[i]), float(z[i]), float(lam[i]), self._data.rounds[i], self._data.order[i], self._modes[i], self._rngs[i])
                for key in keys:
                    final[key][i] = fi[key]
                rewards[i] += -fi["late"] if self.cfg.reward_timing == "admission" else fi["served"]
            for key in keys:
                infos[key] = final[key]
                infos[f"_{key}"] = terminated.copy()
        if resetting.any():
            self._reset_envs(resetting)
        self._masks = self._builder.prepare(*self._data.user(self._t))
        # an ended sub-env only allows reject until it resets
        self._masks[terminated] = False
        self._masks[terminated, 0] = True
        obs = encode_rounds(self.cfg, self.cost, self._builder, self._data, self._t, self._masks)
        if self._same_step and terminated.any():
            infos["final_obs"] = obs.copy()
            infos["_final_obs"] = terminated.copy()
            self._reset_envs(terminated)
            self._masks = self._builder.prepare(*self._data.user(self._t))
            obs = encode_rounds(self.cfg, self.cost, self._builder, self._data, self._t, self._masks)
        else:
            # a copy: the caller owns the returned array (a rollout buffer keeping it saw it cleared by
            # the next step's autoreset, and editing it in place skipped that reset)
            self._needs_reset = terminated.copy()
        return obs, rewards, terminated, np.zeros(self.num_envs, dtype=bool), infos
