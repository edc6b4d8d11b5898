"""EdgeSchedule-v0: admit the users of one round to AD, SD or reject, one user at a time.

## Description

An edge server with one GPU hosts a large model (LLM) and a small draft model (SLM). A round of
``K`` users arrives; each user asks for one completion with an input length, a predicted output
length, an end-to-end deadline and a predicted speculative-decoding acceptance rate, over its own
wireless link. The agent sees the users one at a time and decides for each: reject, serve it by
autoregressive decoding (AD, LLM alone), or by speculative decoding (SD, SLM drafts ``gamma``
tokens, LLM verifies) -- the first SD admission fixes the round's draft depth. AD and SD users form
two batches that run concurrently with compute shares ``z`` / ``1 - z`` and KV-memory shares
``lam`` / ``1 - lam``, chosen at the end so that every admitted user meets its deadline
(``envs.feasibility``). The goal is to serve as many users as possible (the BALANCE paper's task
throughput).

## Action Space

``Discrete(2 + G)`` (``G = max_gamma``, default 8):

| Num | Action |
|-----|--------|
| 0 | reject the current user |
| 1 | admit it to the AD batch |
| 1 + g | admit it to the SD batch with draft depth g (1 <= g <= G) |

``action_masks()`` (sb3-contrib convention, True = allowed) returns exactly the actions that keep
the plan feasible under the exact check; reject is always allowed. An action outside the mask is
accepted, **treated as reject**, and flagged with ``info["invalid_action"] = True`` -- and so is
one that names no action at all (negative, ``>= 2 + G``, non-integral such as 1.5, NaN).

## Observation Space

``Box(0, 1, (17 + G + 8 * (1 + K_max),), float32)``, every entry normalised to ``[0, 1]``.
User features (8 each): input / I_hi, predicted output / O_hi, deadline / T_hi, predicted
acceptance, slack (deadline - downlink) / T_hi, uplink time / 0.1 s (clipped), expected SD tokens
per iteration at the largest depth / (G + 1), and a presence flag.

| Index | Observation |
|-------|-------------|
| 0-7 | the current user (8 user features) |
| 8-13 | AD batch: size / K, longest input / I_hi, longest output / O_hi, compute share needed, KV memory used / SD-case budget, tightest slack / T_hi |
| 14-19 | SD batch: the same six |
| 20 | chosen draft depth / G (0 while SD is empty) |
| 21 | compute share AD would need with the current user added (clipped at 1) |
| 22 | progress: users decided / K |
| 23 - 24+G | the action mask as 0/1 (reject, AD, SD@1..G) |
| then | the next ``K_max`` users still to come (``max_users``, default K), in presentation order, 8 user features each, padded with zeros (presence 0) |

A fixed ``max_users`` makes the observation size independent of ``K``, so one policy can run
rounds of any size (it sees the next ``max_users`` users).

## Rewards

+1 for every served user. With ``reward_timing="admission"`` (default) the +1 is paid when the user
is admitted and taken back (-1) at the episode's end for an admitted user whose *realised* latency
misses its deadline (only possible when the config adds prediction error); with
``"episode_end"`` the whole reward is paid on the last step. Either way an episode returns the
number of users served. A user's realised latency follows the paper by default (it finishes at its
batch's end, each batch runs at its fixed share); ``completion="own"`` and
``sharing="work_conserving"`` model a server that streams each user's last token as soon as it is
produced and hands a finished batch's share to the other (``runtime.serve`` does both).

## Starting State

A round drawn from the config (``envs.workload.sample_round``) with ``self.np_random``, or the
round given in ``reset(options={"round": Round})`` (used to evaluate schedulers on the same
rounds). Users are presented in ``user_order`` (arrival, or ascending deadline, slack or predicted output).

## Episode End

Terminated after the last user of the round is decided (``K`` steps). Never truncated. The final
``info`` holds ``served``, ``admitted_ad``, ``admitted_sd``, ``rejected``, ``late``, ``gamma``,
``z``, ``lam`` and ``modes`` (per user, in the round's original order).

## Arguments

``gymnasium.make("EdgeSchedule-v0", **kwargs)`` with any field of :class:`envs.config.EnvConfig`,
e.g. ``num_users=12, profile="a100-40gb_llama2-13b_llama2-7b", alpha_cv=0.3``. Unknown or
out-of-range values raise ``ConfigError`` naming the field.

``render_mode`` (Gymnasium's convention, ``metadata["render_modes"]``): ``None`` (default),
``"ansi"`` (a text table: batches, mask, one line per user) or ``"rgb_array"`` (a 540 x 960 RGB
picture of the round's plan: users by mode, each admitted user's uplink / compute / downlink
against its deadline, the batches' compute and memory use; :mod:`envs.render`, needs matplotlib).
Rendering reads the state only: it never changes the episode or its random draws.

## Vectorized environment

``gymnasium.make_vec("EdgeSchedule-v0", num_envs=N, vectorization_mode="vector_entry_point")``
builds :class:`envs.edge_schedule_vector.EdgeScheduleVectorEnv`, which runs ``N`` rounds at once in numpy (autoreset
``NEXT_STEP``); sub-env ``i`` seeded with ``seed + i`` reproduces the scalar env seeded ``seed + i``.

## Version History

* v0: initial version.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.actions import action_index, action_indices  # noqa: F401 (re-exported: the env's action rule)
from envs.config import EnvConfig
from envs.cost_model import CostModel, expected_tokens_per_iteration
from envs.observation_rows import batch_features, observation_rows
from envs.outcome import evaluate_plan
from envs.plan import AD, REJECT, SD, Plan
from envs.plan_builder import ScalarPlan
from envs.render import PlanView, render_ansi, render_rgb
from envs.workload import Round, sample_round

USER_FEATURES = 8
BATCH_FEATURES = 6
UPLINK_SCALE_S = 0.1


def observation_size(cfg: EnvConfig) -> int:
    return USER_FEATURES + 2 * BATCH_FEATURES + 3 + (2 + cfg.max_gamma) + USER_FEATURES * cfg.k_max


def user_features(rnd: Round, order: np.ndarray, cfg: EnvConfig) -> np.ndarray:
    """(K, 8) normalised features of the round's users in presentation order."""
    # only the arrays the features read, gathered in presentation order (a reset's hot path:
    # Round.subset would gather all of the round's arrays); element-wise, so the same values
    alpha = rnd.alpha[order]
    e_max = expected_tokens_per_iteration(alpha, cfg.max_gamma) / (cfg.max_gamma + 1)
    f = np.stack(
        [
            rnd.input_tokens[order] / cfg.input_tokens[1],
            rnd.output_tokens[order] / cfg.output_tokens[1],
            rnd.deadline_s[order] / cfg.deadline_s[1],
            alpha,
            rnd.slack_s[order] / cfg.deadline_s[1],
            rnd.uplink_s[order] / UPLINK_SCALE_S,
            e_max,
            np.ones(len(alpha)),
        ],
        axis=1,
    )
    return np.clip(f, 0.0, 1.0).astype(np.float32)


class RoundArrays:
    """The per-round arrays a builder consumes, stacked for N rounds in presentation order (the scalar
    env holds one, the vector env ``N``)."""

    def __init__(self, n: int, k: int):
        self.order = np.zeros((n, k), dtype=np.int64)
        self.inp = np.zeros((n, k), dtype=np.int64)
        self.out = np.zeros((n, k), dtype=np.int64)
        self.alpha = np.zeros((n, k))
        self.up = np.zeros((n, k))
        self.slack = np.zeros((n, k))
        self.feats = np.zeros((n, k, USER_FEATURES), dtype=np.float32)
        self.rounds: list[Round | None] = [None] * n

    def load(self, i: int, rnd: Round, cfg: EnvConfig) -> None:
        order = rnd.order(cfg.user_order)
        self.rounds[i] = rnd
        self.order[i] = order
        self.inp[i] = rnd.input_tokens[order]
        self.out[i] = rnd.output_tokens[order]
        self.alpha[i] = rnd.alpha[order]
        self.up[i] = rnd.uplink_s[order]
        self.slack[i] = rnd.slack_s[order]
        self.feats[i] = user_features(rnd, order, cfg)

    def user(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        rows = np.arange(len(t))
        tt = np.minimum(t, self.inp.shape[1] - 1)
        return self.inp[rows, tt], self.out[rows, tt], self.alpha[rows, tt], self.up[rows, tt], self.slack[rows, tt]


def final_info(cfg: EnvConfig, cost: CostModel, gamma: int, z: float, lam: float, rnd: Round, order: np.ndarray, modes_presented: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    """The episode's end ``info``: the round's plan from the presented modes, evaluated (served, late, ...)."""
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    modes[order] = modes_presented
    plan = Plan(modes, gamma=max(gamma, 1), z=z, lam=lam)
    outcome = evaluate_plan(cost, rnd, plan, rng=rng, simulate_acceptance=cfg.simulate_acceptance, completion=cfg.completion, sharing=cfg.sharing)
    admitted = plan.admitted
    return {
        "served": outcome.served_count,
        "admitted_ad": plan.admitted_ad,
        "admitted_sd": plan.admitted_sd,
        "rejected": rnd.num_users - admitted,
        "late": admitted - outcome.served_count,
        "gamma": gamma,
        "z": z,
        "lam": lam,
        "modes": modes,
    }


def reset_options(options: dict | None, key: str) -> dict:
    """``reset(options=...)`` checked: None or a dict whose only key is ``key`` (a misspelt key would
    otherwise be ignored and a random round played instead of the given one)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"reset(options=...) must be None or a dict with the key {key!r}, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k != key)
    if unknown:
        raise ValueError(f"reset(options=...) knows only the key {key!r}, got {unknown}")
    return options

RENDER_MODES = ["ansi", "rgb_array"]


class RenderModeError(ValueError, TypeError):
    """A render mode the environment does not have. Also a TypeError because that is how Gymnasium
    tools detect an env without a mode: stable-baselines3's ``make_vec_env`` asks for
    ``render_mode="rgb_array"`` and falls back to none only on a TypeError (as a plain ValueError,
    ``make_vec_env("EdgeSchedule-v1")`` failed)."""


def check_render_mode(render_mode: str | None, modes: list[str] = RENDER_MODES) -> str | None:
    """``render_mode`` if it is one of ``modes`` (or None), else :class:`RenderModeError` naming the choices."""
    if render_mode is not None and render_mode not in modes:
        raise RenderModeError(f"render_mode must be one of {modes} or None, got {render_mode!r}")
    return render_mode


def draw(view: PlanView, render_mode: str, cost: CostModel, cfg: EnvConfig) -> str | np.ndarray:
    """One frame of ``view`` in ``render_mode`` (``ansi`` text or an ``rgb_array`` picture)."""
    if render_mode == "ansi":
        return render_ansi(view)
    return render_rgb(view, cost, completion=cfg.completion, sharing=cfg.sharing)


class EdgeScheduleEnv(gym.Env):
    """One round per episode, users decided one at a time (see the module docstring)."""

    metadata = {"render_modes": RENDER_MODES, "render_fps": 4}

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        self.cfg = EnvConfig.from_kwargs(**kwargs)
        self.render_mode = check_render_mode(render_mode)
        self.cost = CostModel.from_config(self.cfg)
        self.action_space = spaces.Discrete(2 + self.cfg.max_gamma)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(observation_size(self.cfg),), dtype=np.float32)
        self._plan = ScalarPlan(self.cost, self.cfg.max_gamma)
        self._data = RoundArrays(1, self.cfg.num_users)
        self._t = 0
        self._modes = np.zeros(self.cfg.num_users, dtype=np.int8)
        self._masks = [True] + [False] * (1 + self.cfg.max_gamma)
        self._done = True
        self._next_cost: CostModel | None = None  # set_cost_model's model, waiting for the next reset
        self._obs_size = observation_size(self.cfg)
        self._budget = max(self.cost.memory_budget1(True), 1.0)
        self._head = np.zeros(2 * BATCH_FEATURES + 1, dtype=np.float32)  #: the cached batch features and SD depth (_encode)
        self._rows = np.zeros((1, self._obs_size), dtype=np.float32)  #: set by reset (_observation_rows)
        self._scales = (float(self.cfg.input_tokens[1]), float(self.cfg.output_tokens[1]), float(self.cfg.deadline_s[1]))  #: batch_features' ranges

    @property
    def round(self) -> Round | None:
        """The current round (users in their original order)."""
        return self._data.rounds[0]

    def set_cost_model(self, cost: CostModel) -> None:
        """Plan against another cost model (e.g. a scheduler's profile or memory) from the next reset
        (a running episode ends on the model it started with)."""
        self._next_cost = cost
        if self._done:
            self._use_cost_model()

    def _use_cost_model(self) -> None:
        cost, self._next_cost = self._next_cost, None
        self.cost = cost
        self._plan = ScalarPlan(cost, self.cfg.max_gamma)
        self._budget = max(cost.memory_budget1(True), 1.0)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if self._next_cost is not None:  # set_cost_model during the last episode
            self._use_cost_model()
        rnd = reset_options(options, "round").get("round")
        if rnd is None:
            rnd = sample_round(self.np_random, self.cfg)
        elif not isinstance(rnd, Round) or rnd.num_users != self.cfg.num_users:
            raise ValueError(f"options['round'] must be a Round with num_users={self.cfg.num_users} users")
        self._data.load(0, rnd, self.cfg)
        d = self._data
        # per-user inputs as Python scalars: the step loop then touches no numpy
        self._users = list(zip(d.inp[0].tolist(), d.out[0].tolist(), d.alpha[0].tolist(), d.up[0].tolist(), d.slack[0].tolist(), strict=True))
        self._plan.reset()
        self._t = 0
        self._modes[:] = REJECT
        self._done = False
        self._masks = self._plan.prepare(*self._users[0])
        self._rows = self._observation_rows()
        for mode in (AD, SD):
            self._refresh_head(mode)
        return self._encode(), {}

    def action_masks(self) -> np.ndarray:
        """Bool (2 + G,): which actions keep the plan feasible for the current user."""
        return np.array(self._masks, dtype=bool)

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        a = action_index(action, 2 + self.cfg.max_gamma)
        valid = a >= 0 and self._plan.apply(a)
        t = self._t
        mode = REJECT if not valid or a == 0 else (AD if a == 1 else SD)
        self._modes[t] = mode
        if mode != REJECT:  # only the admitting mode's batch features (and SD's depth) change
            self._refresh_head(mode)
        reward = 1.0 if (mode != REJECT and self.cfg.reward_timing == "admission") else 0.0
        info: dict[str, Any] = {"invalid_action": not valid}
        self._t = t + 1
        terminated = self._t >= self.cfg.num_users
        if terminated:
            self._done = True
            z, lam = self._plan.shares()
            info.update(final_info(self.cfg, self.cost, self._plan.gamma, z, lam, self.round, self._data.order[0], self._modes, self.np_random))
            reward += -float(info["late"]) if self.cfg.reward_timing == "admission" else float(info["served"])
            self._masks = [True] + [False] * (1 + self.cfg.max_gamma)
        else:
            self._masks = self._plan.prepare(*self._users[self._t])
        return self._encode(), reward, terminated, False, info

    def _encode(self) -> np.ndarray:
        """The observation table of the module docstring (the same values as the vector env).

        Why cached: a policy deciding a K = 200 round steps 200 times, and building every
        observation from scratch (zeros, the head's Python loop, the look-ahead's copy) was a few
        percent of its decision time. The parts that depend on ``t`` alone -- the current user,
        the progress ``t / K`` and the look-ahead -- are one row of :meth:`_observation_rows`, built at
        reset; the batch features change only when their mode admits a user (:meth:`step`); so a
        step copies one row and writes the head and the mask."""
        t = self._t
        p = self._plan
        obs = self._rows[t].copy()
        obs[USER_FEATURES : USER_FEATURES + 2 * BATCH_FEATURES + 1] = self._head
        v = p.candidate_ad_share() if (t < self.cfg.num_users and p.is_prepared) else 1.0
        obs[USER_FEATURES + 2 * BATCH_FEATURES + 1] = 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)
        col = USER_FEATURES + 2 * BATCH_FEATURES + 3
        obs[col : col + len(self._masks)] = self._masks
        return obs

    def _observation_rows(self) -> np.ndarray:
        """(K + 1, obs) float32: row ``t`` holds step ``t``'s current user (zeros at ``t = K``), its
        progress ``t / K`` and the next ``K_max`` users (zero-padded past the round's end); the head
        and the mask are written per step (:meth:`_encode`)."""
        k = self.cfg.num_users
        head = USER_FEATURES + 2 * BATCH_FEATURES + 3
        rows = observation_rows(self._data.feats[0], self.cfg.k_max, self._obs_size, head + 2 + self.cfg.max_gamma)
        # Python's t / k and numpy's division of the same integers are one IEEE division: the same float
        rows[:, head - 1] = np.arange(k + 1) / k
        return rows

    def _refresh_head(self, mode: int) -> None:
        """Recompute the cached features ``mode`` (AD or SD) changed: its batch's, and SD's depth."""
        m = mode - 1  # AD, SD -> batch rows 0, 1
        self._head[BATCH_FEATURES * m : BATCH_FEATURES * (m + 1)] = batch_features(self._plan, m, self.cfg.num_users, self._scales, self._budget)
        if mode == SD:
            v = self._plan.gamma / self.cfg.max_gamma
            self._head[2 * BATCH_FEATURES] = 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)

    def render(self) -> str | np.ndarray | None:
        """``ansi``: a text table; ``rgb_array``: an (H, W, 3) uint8 picture of the plan (envs/render.py)."""
        if self.render_mode is None:
            return None
        p = self._plan
        z, lam = p.shares()
        view = PlanView(self.round, self._data.order[0].copy(), self._modes.copy(), self._t, p.gamma, z, lam,
                        (p.b[0], p.b[1]), (p.share[0], p.share[1]), (p.mem[0], p.mem[1]), self._budget, tuple(self._masks))
        return draw(view, self.render_mode, self.cost, self.cfg)
