"""EdgeSchedule-v1: admit each user of a round to AD, SD, ED (SpecEdge split) or reject.

## Description

v0's task (``envs.edge_schedule``) with SpecEdge's split as a third mode. One server GPU hosts the
target (LLM) and a draft (SLM); some users (``edge_fraction``) also own an edge GPU (e.g. an RTX
4090) holding the draft and reach the server over their own network (``rtt_ms``). The agent sees
the users one at a time and decides: reject; **AD** (target alone); **SD@g** (draft and target on
the server, depth ``g``; the first SD admission fixes the round's depth, as in v0); **ED@g** (the
user's edge drafts a chain of depth ``g`` -- each ED user its own -- and the server verifies all ED
users in one batched pass per iteration, holding only the target's KV for them). AD, SD and ED
users form three batches sharing the GPU's compute and memory; ``envs.split_plan`` is the exact
check (formulas and modelling choices in its docstring, the closed form in ``envs.split_cost``).
The goal is to serve as many users as possible.

## Action Space

``Discrete(2 + 2G)`` (``G = max_gamma``, default 8):

| Num | Action |
|-----|--------|
| 0 | reject the current user |
| 1 | admit it to the AD batch |
| 1 + g | admit it to the SD batch with draft depth g (1 <= g <= G; the round's depth once set) |
| 1 + G + g | admit it to the ED batch, its edge drafting g tokens per iteration (1 <= g <= G) |

``action_masks()`` returns exactly the actions that keep the plan feasible (ED only for a user
with an edge whose draft and KV fit it). An action outside the mask -- or one naming no action --
is treated as reject and flagged in ``info["invalid_action"]``.

## Observation Space

``Box(0, 1, (23 + 2G + 10 * (1 + K_max),), float32)``, all normalised to ``[0, 1]``. User
features (10 each): v0's eight (input, predicted output, deadline, acceptance, slack, uplink, SD
tokens per iteration at depth G, presence) then has-an-edge and RTT / 0.1 s (clipped).

| Index | Observation |
|-------|-------------|
| 0-9 | the current user (10 user features) |
| 10-15 | AD batch: size / K, longest input / I_hi, longest output / O_hi, compute share needed, KV memory used / SD-case budget, tightest slack / T_hi |
| 16-21 | SD batch: the same six |
| 22-27 | ED batch: the same six (its slack is the tightest deadline: ED has no downlink) |
| 28 | SD depth / G (0 while SD is empty) |
| 29 | compute share AD would need with the current user added (clipped at 1) |
| 30 | progress: users decided / K |
| 31 - 32+2G | the action mask as 0/1 |
| then | the next ``K_max`` users, 10 user features each, zero-padded |

## Rewards

+1 per served user, paid as in v0 (``reward_timing``); an episode returns the number served.

## Starting State

A round from the config (``envs.workload.sample_round``; edge users and RTTs from their own child
stream) or ``reset(options={"round": Round})``. Users are presented in ``user_order``.

## Episode End

Terminated after the last user (``K`` steps); never truncated. The final ``info`` holds ``served``,
``admitted_ad``, ``admitted_sd``, ``admitted_ed``, ``rejected``, ``late``, ``gamma``, ``z``,
``ed_share``, ``lam``, ``modes`` and ``ed_depth`` (per user, the round's original order).

## Arguments

``gymnasium.make("EdgeSchedule-v1", num_users=12, profile="split_a100-40gb_llama2-7b_tinyllama-1.1b",
edge_fraction=0.5)``: any :class:`envs.config.EnvConfig` field, plus the split switches
``proactive`` (default True), ``bonus_match`` (None = the user's acceptance) and ``interrupt``
(``"step"`` or ``"immediate"``) of ``envs.split_cost.SplitOptions``. v1's defaults differ from
v0's in two fields: ``profile`` (a split profile, ``envs/profiles/split_*.yaml``) and
``edge_fraction`` (0.5). A profile without ``edge``/``network`` sections needs ``edge_fraction=0``;
with ``edge_fraction=0`` v1 serves exactly what v0 serves on the same rounds. ``completion``
applies to every user: ``"batch"`` (default) ends each at its batch's end, ``"own"`` each at its
own last token, ED users included (``envs.split_outcome.evaluate_split_plan``).

## Vectorized environment

``gymnasium.make_vec("EdgeSchedule-v1", num_envs=N, vectorization_mode="vector_entry_point")``
builds ``envs.edge_schedule_v1_vector.EdgeScheduleV1VectorEnv`` (numpy, autoreset ``NEXT_STEP``);
sub-env ``i`` seeded ``seed + i`` reproduces this env seeded ``seed + i``.

## Version History

* v1: adds ED@g (SpecEdge split) and the edge/RTT user features.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.actions import action_index
from envs.config import ConfigError, EnvConfig
from envs.cost_model import CostModel
from envs.edge_schedule import check_render_mode, reset_options
from envs.observation_rows import batch_features, observation_rows
from envs.plan import AD, ED, REJECT, SD, Plan
from envs.split_builder import SplitScalarPlan, ed_rows
from envs.split_cost import SplitCostModel, SplitOptions
from envs.split_final_batch import batchable
from envs.split_outcome import evaluate_split_plan, served_from_aggregates
from envs.split_plan import EdUsers, ed_users, shares_split
from envs.v1_user_features import USER_FEATURES, round_features
from envs.workload import Round, sample_round

V1_DEFAULTS = {"profile": "split_a100-40gb_llama2-7b_tinyllama-1.1b", "edge_fraction": 0.5}
SPLIT_SWITCHES = ("proactive", "bonus_match", "interrupt")
HEAD = USER_FEATURES + 3 * 6 + 3


def make_models(kwargs: dict[str, Any]) -> tuple[EnvConfig, CostModel, SplitCostModel | None, SplitOptions]:
    """The config, cost model, split model (None on a profile without edge/network sections) and the
    split switches of v1's keyword arguments (errors name the field)."""
    kwargs = dict(kwargs)
    switches = {k: kwargs.pop(k) for k in SPLIT_SWITCHES if k in kwargs}
    cfg = EnvConfig.from_kwargs(**{**V1_DEFAULTS, **kwargs})
    try:
        options = SplitOptions(**switches)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env config: {exc}") from None
    cost = CostModel.from_config(cfg)
    has_split = cost.profile.edge is not None and cost.profile.network is not None
    if cfg.edge_fraction > 0 and not has_split:
        raise ConfigError(f"env config field 'profile' must name a profile with edge and network sections when edge_fraction > 0 "
                          f"(e.g. {V1_DEFAULTS['profile']}), got {cfg.profile!r}")
    return cfg, cost, SplitCostModel(cost.profile, options) if has_split else None, options


def observation_size(cfg: EnvConfig) -> int:
    return HEAD + (2 + 2 * cfg.max_gamma) + USER_FEATURES * cfg.k_max


def final_info(cfg: EnvConfig, cost: CostModel, split: SplitCostModel | None, rnd: Round, order: np.ndarray, modes_presented: np.ndarray,
               depth_presented: np.ndarray, gamma: int, shares: tuple[float, float, float], rng: np.random.Generator, users: EdUsers | None = None,
               built: SplitScalarPlan | None = None) -> dict[str, Any]:
    """The last step's ``info`` (modes and depths in the round's original order). ``built``: the
    scalar plan that built it (the scalar env's), whose aggregates give the served count where they
    are the numbers ``evaluate_split_plan`` would take (``split_outcome.served_from_aggregates``: the
    terminal step's hot path); otherwise the plan is evaluated."""
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    depth = np.zeros(rnd.num_users, dtype=np.int64)
    modes[order], depth[order] = modes_presented, depth_presented
    z, ed_share, lam = shares
    # each mode counted once (Plan's admitted_* properties recount on every access)
    counts = np.bincount(modes, minlength=4).tolist()  # modes are REJECT, AD, SD, ED = 0..3
    n_ad, n_sd, n_ed = counts[AD], counts[SD], counts[ED]
    admitted = n_ad + n_sd + n_ed
    served = None
    # simulated acceptance draws from rng, and the aggregates' formula is the paper's outcome model
    # (batch completion, fixed shares) only: any other setting is evaluated (split_final_batch.batchable)
    if built is not None and batchable(cfg):
        served = served_from_aggregates(cost, rnd, modes, gamma, z, ed_share, built.b, built.s_max, built.n_max, built.u_max, built.ed)
    if served is None:
        plan = Plan(modes, gamma=max(gamma, 1), z=z, lam=lam, ed_depth=depth if n_ed else None, ed_share=ed_share)
        served = evaluate_split_plan(cost, split, rnd, plan, rng=rng, simulate_acceptance=cfg.simulate_acceptance, completion=cfg.completion,
                                     sharing=cfg.sharing, users=users, ed_completion=cfg.completion).served_count
    return {
        "served": served, "admitted_ad": n_ad, "admitted_sd": n_sd, "admitted_ed": n_ed,
        "rejected": rnd.num_users - admitted, "late": admitted - served, "gamma": gamma, "z": z,
        "ed_share": ed_share, "lam": lam, "modes": modes, "ed_depth": depth,
    }


class EdgeScheduleV1Env(gym.Env):
    """One round per episode, users decided one at a time (see the module docstring).

    Speed (issue #13: a step <= 3x a CartPole step): ``reset`` turns the round into what the steps
    read -- each user's :meth:`SplitScalarPlan.prepare` arguments as Python scalars (the ED constants
    of the edge users only: :func:`~envs.split_builder.ed_rows`), and :func:`observation_rows` (the
    user-dependent part of every observation, progress included) -- so a step is one ``prepare``
    (memoised pass times), a row copy and two slice assignments (the head, a float32 array, and the
    mask, converted once per distinct pattern: :meth:`_set_masks`); each mode's six batch features
    are recomputed only when that mode admits, the SD depth feature only when SD does (a reset writes
    the empty batches' features, computed once). The last step counts the served users from the
    builder's aggregates (``split_outcome.served_from_aggregates``) where they are the numbers the plan's
    evaluation would take. Every value is computed by the same operations as before
    (``tests/test_env_v1_golden.py`` pins 300 trajectories bit for bit,
    ``tests/test_env_v1_speed_paths.py`` the pieces).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        self.render_mode = check_render_mode(render_mode, self.metadata["render_modes"])
        self.cfg, self.cost, self.split, self._split_options = make_models(kwargs)
        g = self.cfg.max_gamma
        self.action_space = spaces.Discrete(2 + 2 * g)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(observation_size(self.cfg),), dtype=np.float32)
        self._plan = SplitScalarPlan(self.cost, g)
        self._round: Round | None = None
        self._n = 2 + 2 * g
        self._done = True
        self._next_cost: CostModel | None = None  # set_cost_model's model, waiting for the next reset
        self._mask_arrays: dict[tuple[bool, ...], tuple[np.ndarray, np.ndarray]] = {}
        # the observation's head but its last column: three batch rows, SD depth, AD share (progress t / K is in the rows)
        self._head = np.zeros(HEAD - 1 - USER_FEATURES, dtype=np.float32)
        self._set_masks([True] + [False] * (self._n - 1))
        self._budget = max(self.cost.memory_budget1(True), 1.0)
        self._obs_size = observation_size(self.cfg)
        # config scalars the per-step code reads (cached: attribute chains showed in the profile)
        self._g, self._k, self._k_max = g, self.cfg.num_users, self.cfg.k_max
        self._admission_reward = self.cfg.reward_timing == "admission"
        self._scales = (float(self.cfg.input_tokens[1]), float(self.cfg.output_tokens[1]), float(self.cfg.deadline_s[1]))
        # what every reset writes, computed once: progress t / K per row (numpy's division of exact integers
        # is Python's; float32 cast on assignment), and the head's batch rows (every batch empty: their
        # features do not depend on the cost model) and SD depth (none), cast to float32 as on assignment
        self._progress = np.arange(self._k + 1) / self._k
        self._empty_head = np.array([v for m in range(3) for v in self._batch_row(m)] + [0.0], dtype=np.float32)

    @property
    def round(self) -> Round | None:
        return self._round

    def set_cost_model(self, cost: CostModel) -> None:
        """Plan against another cost model (e.g. a scheduler's) from the next reset (a running episode
        ends on the model it started with); the split model follows its profile, with this env's
        switches (none when the profile has no edge/network sections: then no user is offered ED)."""
        self._next_cost = cost
        if self._done:
            self._use_cost_model()

    def _use_cost_model(self) -> None:
        cost, self._next_cost = self._next_cost, None
        has_split = cost.profile.edge is not None and cost.profile.network is not None
        self.cost = cost
        self.split = SplitCostModel(cost.profile, self._split_options) if has_split else None
        self._plan = SplitScalarPlan(cost, self.cfg.max_gamma)
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
        cfg, k = self.cfg, self.cfg.num_users
        self._round = rnd
        self._order = order = rnd.order(cfg.user_order)
        self._feats = round_features(rnd, order, cfg)
        # the user-dependent parts of every step's observation, built once per round (one row copy a step)
        self._rows = observation_rows(self._feats, self._k_max, self._obs_size, HEAD + self._n)
        self._rows[:, HEAD - 1] = self._progress  # in [0, 1]: no clip
        r = rnd if cfg.user_order == "arrival" else rnd.subset(order)
        has_ed = self.split is not None and rnd.has_edge is not None and bool(rnd.has_edge.any())
        # every user's ED constants only where the last step's evaluation reuses them (outside the paper's outcome
        # model: within it the plan's aggregates give the outcome, final_info), else only the edge users'
        self._ed = ed_users(self.split, rnd, cfg.max_gamma) if has_ed and not batchable(cfg) else None
        rows = ed_rows(self.split, rnd, cfg.max_gamma, self._ed) if has_ed else [None] * k
        ed_rows_presented = rows if r is rnd else [rows[i] for i in order.tolist()]  # the round's order -> presentation order
        # one tuple per user, in presentation order, of SplitScalarPlan.prepare's arguments as Python scalars
        self._users = list(zip(r.input_tokens.tolist(), r.output_tokens.tolist(), r.alpha.tolist(), r.uplink_s.tolist(), r.slack_s.tolist(),
                               r.deadline_s.tolist(), ed_rows_presented, strict=True))
        self._plan.reset()
        self._t = 0
        self._modes = np.zeros(k, dtype=np.int8)
        self._depth = np.zeros(k, dtype=np.int64)
        self._done = False
        self._set_masks(self._plan.prepare(*self._users[0]))
        self._head[:19] = self._empty_head
        return self._encode(), {}

    def action_masks(self) -> np.ndarray:
        """Bool (2 + 2G,): which actions keep the plan feasible for the current user."""
        return self._mask_bool.copy()

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset()")
        g = self._g
        # hot path (profiled): a plain int skips action_index's array round trip; same rule (range check)
        if type(action) is int:
            a = action if 0 <= action < self._n else -1
        else:
            a = action_index(action, self._n)
        valid = a >= 0 and self._plan.apply(a)
        t = self._t
        mode = REJECT if not valid or a == 0 else (AD if a == 1 else (SD if a <= 1 + g else ED))
        if mode != REJECT:  # only the admitting mode's batch features changed (and _modes starts all REJECT)
            self._modes[t] = mode
            m = mode - 1  # AD, SD, ED -> rows 0, 1, 2
            self._head[6 * m : 6 * m + 6] = self._batch_row(m)
            if mode == ED:
                self._depth[t] = a - 1 - g
            elif mode == SD:  # the SD depth feature changes only here
                v = self._plan.gamma / g
                self._head[18] = 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)
        reward = 1.0 if (mode != REJECT and self._admission_reward) else 0.0
        info: dict[str, Any] = {"invalid_action": not valid}
        self._t = t + 1
        terminated = self._t >= self._k
        if terminated:
            self._done = True
            p = self._plan
            shares = shares_split(*p.share, *p.mem, *p.b)
            info.update(final_info(self.cfg, self.cost, self.split, self._round, self._order, self._modes, self._depth, p.gamma, shares, self.np_random, self._ed, p))
            reward += -float(info["late"]) if self.cfg.reward_timing == "admission" else float(info["served"])
            self._set_masks([True] + [False] * (self._n - 1))
            return self._encode(), reward, terminated, False, info
        # the next user's masks and the observation: _set_masks and _encode inlined (the step's hot path)
        masks = self._masks = self._plan.prepare(*self._users[t + 1])
        arrays = self._mask_arrays.get(tuple(masks))
        if arrays is None:
            self._set_masks(masks)
        else:
            self._mask_bool, self._mask_f32 = arrays
        obs = self._rows[t + 1].copy()
        head = self._head
        v = self._plan.candidate_ad_share()
        head[19] = 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)
        obs[USER_FEATURES : HEAD - 1] = head
        obs[HEAD : HEAD + self._n] = self._mask_f32
        return obs, reward, False, False, info

    def _batch_row(self, m: int) -> list[float]:
        """Mode ``m``'s six batch features (they change only when ``m`` admits a user)."""
        return batch_features(self._plan, m, self._k, self._scales, self._budget)

    MASK_CACHE_MAX = 4096  #: distinct masks kept as arrays before the cache is emptied

    def _set_masks(self, masks: list[bool]) -> None:
        """Make ``masks`` the current user's, with its bool and float32 arrays: a round repeats few
        masks, so each pattern is converted once (a list-to-array conversion every step showed in the profile)."""
        self._masks = masks
        key = tuple(masks)
        arrays = self._mask_arrays.get(key)
        if arrays is None:
            if len(self._mask_arrays) >= self.MASK_CACHE_MAX:
                self._mask_arrays.clear()
            arrays = self._mask_arrays[key] = (np.array(masks, dtype=bool), np.array(masks, dtype=np.float32))
            for a in arrays:
                a.setflags(write=False)  # shared by every step with this mask: action_masks() hands out copies
        self._mask_bool, self._mask_f32 = arrays

    def _encode(self) -> np.ndarray:
        t, head = self._t, self._head
        obs = self._rows[t].copy()  # current user, progress and look-ahead (observation_rows, reset); head and mask below
        # the head: the three cached batch rows (_batch_row) and SD depth (step), then the AD share -- clipped to [0, 1]
        v = self._plan.candidate_ad_share() if t < self._k else 1.0
        head[19] = 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)
        obs[USER_FEATURES : HEAD - 1] = head
        obs[HEAD : HEAD + self._n] = self._mask_f32
        return obs

    def render(self) -> str | np.ndarray | None:
        if self.render_mode != "ansi":
            return None
        if self._round is None:  # before the first reset (gym.make's wrapper refuses this; the bare env answers it)
            return "no round yet: call reset()\n"
        p = self._plan
        lines = [f"user {self._t}/{self.cfg.num_users}  SD depth={p.gamma}"]
        for name, m in (("AD", 0), ("SD", 1), ("ED", 2)):
            lines.append(f"{name}: {p.b[m]} users, share needed {p.share[m]:.3f}, KV {p.mem[m] / 1e9:.2f} GB")
        lines.append("mask: " + "".join("1" if m else "0" for m in self._masks))
        return "\n".join(lines) + "\n"
