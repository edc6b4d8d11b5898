"""The one cost model of the edge server, and the exact feasibility check built on it.

Everything that decides "can this plan run, and with which shares" lives here and is used by the
environment, every scheduler, the exact optimum and the live runtime (DESIGN.md §1).

Batch costs (full-GPU seconds; ``b`` users, longest input ``S``, longest output ``N``):

* AD: ``C_A = tau_L(b, S, S) + sum_{i=1..N-1} tau_L(b, 1, S + i)`` -- the prefill yields the first
  token, every later token is one decode pass.
* SD with draft depth ``gamma``: user k expects ``E_k = (1 - a_k^(gamma+1)) / (1 - a_k)`` tokens per
  iteration and needs ``J_k = ceil(O_k / E_k)`` iterations; the batch runs ``J = max J_k``.
  ``C_S = tau_L(b, S, S) + tau_S(b, S, S) + J * (gamma * tau_S(b, 1, c) + tau_L(b, gamma + 1, c + gamma))``.
  **Modelling choice:** each iteration is costed at the batch's mean context ``c = S + N / 2``
  (the padded KV grows from ``S`` to ``S + N`` over the ``J`` iterations). This is exact when
  ``tau`` is linear in the context -- true of memory-bound decoding, i.e. the roofline in every
  decode regime of the shipped profiles -- and keeps ``C_S`` O(1) for any latency source.

A measured profile may add the engines' host overhead (``envs.profile.EngineOverhead``):
``(N - 1) * o_A(b)`` to ``C_A`` and ``J * o_S(b, gamma)`` to ``C_S``.

Memory (bytes; ``kv_memory`` switch): LLM weights always, SLM weights iff SD has a user, and KV

* ``per_user`` (default): AD ``sum_A (S_A + O_k) kv_L``; SD ``sum_S (S_S + O_k + gamma)(kv_L + kv_S)``;
* ``padded``: AD ``b (S_A + N_A) kv_L``; SD ``b (S_S + N_S + gamma)(kv_L + kv_S)``.

``gamma`` extra SD tokens are the transient drafts held before rollback. The device reserve is
taken off ``Q`` first.

Alternative modelling choices (``envs.model_choices.ModelChoices``; defaults leave every number
above unchanged): the draft's KV at the target's size (``kv_S := kv_L``), the verify pass's
compute not overlapped (``+ J * F_L(b, gamma + 1, c + gamma) / (e * peak)`` in ``C_S``), a
per-SD-user workspace (``+ b * w`` in SD memory) and a fixed SD-mode overhead (added to ``W_S``).

Exact check (no search over z and lambda): with budgets ``beta_m = min_m (T_k - t_d,k) - max_m t_u,k``,
a plan is feasible iff the memory fits and every non-empty mode has ``beta_m > 0`` and
``C_A / beta_A + C_S / beta_S <= 1``. Removing a user never breaks feasibility.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from envs.actions import action_indices
from envs.config import EnvConfig
from envs.model_choices import ModelChoices
from envs.plan import AD, SD, Plan
from envs.profile import Profile, load_profile
from envs.workload import Round

EPS = 1e-9  #: float tolerance on the share and memory sums (the check is otherwise exact)


def expected_tokens_per_iteration(alpha, gamma):
    """``E = (1 - a^(g+1)) / (1 - a)``: accepted drafts plus the target's bonus/correction token."""
    a = np.asarray(alpha, dtype=float)
    g = np.asarray(gamma, dtype=float)
    near_one = a > 1.0 - 1e-9
    safe = np.where(near_one, 0.5, a)
    return np.where(near_one, g + 1.0, (1.0 - safe ** (g + 1.0)) / (1.0 - safe))


def sd_iterations(output_tokens, alpha, gamma):
    """``J_k = ceil(O_k / E_k)`` expected SD iterations to produce ``O_k`` tokens."""
    e = expected_tokens_per_iteration(alpha, gamma)
    return np.ceil(np.asarray(output_tokens, dtype=float) / e - 1e-9).astype(np.int64)


class CostModel:
    """Batch times, memory and the memory budget of one profile on one device.

    ``choices`` selects alternative modelling choices (``envs.model_choices``); the default is the
    first-principles model. Attributes a per-mode solver may price with: ``kv_l`` / ``kv_sd``
    (bytes per KV token of an AD / SD user), ``sd_user_extra_tokens`` (further bytes per SD user,
    in units of ``kv_sd``), ``w_s`` (bytes the SD mode holds once: SLM weights + overhead).
    """

    def __init__(self, profile: Profile, kv_memory: str = "per_user", choices: ModelChoices | None = None):
        if kv_memory not in ("per_user", "padded"):
            raise ValueError(f"kv_memory must be 'per_user' or 'padded', got {kv_memory!r}")
        choices = ModelChoices() if choices is None else choices
        self.profile = profile
        self.kv_memory = kv_memory
        self.choices = choices
        self.tau_l = profile.tau_llm
        self.tau_s = profile.tau_slm
        self.kv_l = profile.kv_llm_bytes
        draft_kv = profile.kv_llm_bytes if choices.draft_kv == "target" else profile.kv_slm_bytes
        self.kv_sd = profile.kv_llm_bytes + draft_kv
        self.w_l = profile.llm.weight_bytes
        self.w_s = profile.slm.weight_bytes + choices.sd_overhead_bytes if choices.sd_overhead_bytes else profile.slm.weight_bytes
        self.sd_user_bytes = float(choices.sd_user_workspace_bytes)
        self.sd_user_extra_tokens = self.sd_user_bytes / self.kv_sd  #: the per-SD-user workspace in KV tokens
        # seconds per verify FLOP when verification's compute is not hidden under weight streaming
        e = choices.verify_flops_efficiency
        self.verify_s_per_flop = None if e is None else 1.0 / (e * profile.device.flops_per_s)
        self.memory_bytes = profile.device.memory_bytes
        self.reserve_bytes = profile.device.reserve_bytes
        self.engine = profile.engine

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> CostModel:
        profile = load_profile(cfg.profile)
        if cfg.memory_bytes is not None:
            profile = profile.with_memory(cfg.memory_bytes)
        return cls(profile, cfg.kv_memory, cfg.model_choices)

    # ---------------------------------------------------------------- memory
    def memory_budget(self, sd_used):
        """KV bytes available to both modes together: ``Q - reserve - W_L - [SD used] W_S``."""
        return self.memory_bytes - self.reserve_bytes - self.w_l - np.asarray(sd_used, dtype=float) * self.w_s

    def ad_memory(self, b, s_max, n_max, sum_out):
        b = np.asarray(b, dtype=float)
        if self.kv_memory == "per_user":
            return (b * s_max + sum_out) * self.kv_l
        return b * (np.asarray(s_max, dtype=float) + n_max) * self.kv_l

    def sd_memory(self, b, s_max, n_max, sum_out, gamma):
        b = np.asarray(b, dtype=float)
        if self.kv_memory == "per_user":
            kv = (b * (np.asarray(s_max, dtype=float) + gamma) + sum_out) * self.kv_sd
        else:
            kv = b * (np.asarray(s_max, dtype=float) + n_max + gamma) * self.kv_sd
        return kv + b * self.sd_user_bytes if self.sd_user_bytes else kv

    # ---------------------------------------------------------------- time
    def ad_time(self, b, s_max, n_max):
        """``C_A`` in seconds on the whole GPU (0 for an empty batch)."""
        b = np.asarray(b, dtype=np.int64)
        s = np.maximum(np.asarray(s_max, dtype=np.int64), 1)
        n = np.asarray(n_max, dtype=np.int64)
        bb = np.maximum(b, 1)
        t = self.tau_l.tau(bb, s, s) + self.tau_l.decode_sum(bb, s, np.maximum(n - 1, 0))
        if self.engine is not None:
            t = t + np.maximum(n - 1, 0) * self.engine.ad(bb)
        return np.where(b > 0, t, 0.0)

    def sd_time(self, b, s_max, n_max, j_max, gamma):
        """``C_S`` in seconds on the whole GPU (0 for an empty batch)."""
        b = np.asarray(b, dtype=np.int64)
        bb = np.maximum(b, 1)
        s = np.maximum(np.asarray(s_max, dtype=float), 1.0)
        g = np.asarray(gamma, dtype=float)
        c = s + np.asarray(n_max, dtype=float) / 2.0
        prefill = self.tau_l.tau(bb, s, s) + self.tau_s.tau(bb, s, s)
        return np.where(b > 0, prefill + np.asarray(j_max, dtype=float) * self.sd_iteration_time(bb, c, g), 0.0)

    def sd_iteration_time(self, b, c, gamma):
        """Seconds of one SD iteration on the whole GPU: ``gamma`` draft steps and one verify pass.

        ``b`` sequences (>= 1) at mean context ``c`` (tokens); includes the measured engine overhead
        and, under ``verify_flops_efficiency``, the verify pass's compute not overlapped.
        """
        g = np.asarray(gamma, dtype=float)
        iteration = g * self.tau_s.tau(b, 1.0, c) + self.tau_l.tau(b, g + 1.0, c + g)
        if self.verify_s_per_flop is not None:
            iteration = iteration + self.profile.llm.flops(b, g + 1.0, c + g) * self.verify_s_per_flop
        if self.engine is not None:
            iteration = iteration + self.engine.sd(b, g)
        return iteration


    # ---------------------------------------------------------------- one point, no numpy
    # The environment's scalar step runs these: the same operations, in the same order, as the
    # array versions above (bit-identical results), at Python-float speed.
    def ad_time1(self, b: int, s_max: int, n_max: int) -> float:
        if b <= 0:
            return 0.0
        s = max(s_max, 1)
        t = self.tau_l.tau1(b, s, s) + self.tau_l.decode_sum1(b, s, max(n_max - 1, 0))
        if self.engine is not None:
            t = t + max(n_max - 1, 0) * float(self.engine.ad(b))
        return t

    def sd_time1(self, b: int, s_max: int, n_max: int, j_max: int, gamma: int) -> float:
        if b <= 0:
            return 0.0
        s = max(float(s_max), 1.0)
        g = float(gamma)
        c = s + float(n_max) / 2.0
        prefill = self.tau_l.tau1(b, s, s) + self.tau_s.tau1(b, s, s)
        iteration = g * self.tau_s.tau1(b, 1.0, c) + self.tau_l.tau1(b, g + 1.0, c + g)
        if self.verify_s_per_flop is not None:
            iteration = iteration + float(self.profile.llm.flops(float(b), g + 1.0, c + g)) * self.verify_s_per_flop
        if self.engine is not None:
            iteration = iteration + float(self.engine.sd(b, g))
        return prefill + float(j_max) * iteration

    def ad_memory1(self, b: int, s_max: int, n_max: int, sum_out: int) -> float:
        if self.kv_memory == "per_user":
            return (float(b) * s_max + sum_out) * self.kv_l
        return float(b) * (float(s_max) + n_max) * self.kv_l

    def sd_memory1(self, b: int, s_max: int, n_max: int, sum_out: int, gamma: int) -> float:
        if self.kv_memory == "per_user":
            kv = (float(b) * (float(s_max) + gamma) + sum_out) * self.kv_sd
        else:
            kv = float(b) * (float(s_max) + n_max + gamma) * self.kv_sd
        return kv + float(b) * self.sd_user_bytes if self.sd_user_bytes else kv

    def memory_budget1(self, sd_used: bool) -> float:
        return self.memory_bytes - self.reserve_bytes - self.w_l - float(sd_used) * self.w_s


def sd_iterations1(output_tokens: int, alpha: float, gamma: int) -> int:
    """:func:`sd_iterations` for one user, as a Python int."""
    g = float(gamma)
    e = g + 1.0 if alpha > 1.0 - 1e-9 else (1.0 - alpha ** (g + 1.0)) / (1.0 - alpha)
    return math.ceil(float(output_tokens) / e - 1e-9)


def _share1(time_s: float, b: int, u_max: float, slack_min: float) -> float:
    if b <= 0:
        return 0.0
    budget = slack_min - u_max
    return time_s / budget if budget > 0 else math.inf


class ScalarPlan:
    """:class:`PlanBuilder` for one round, in plain Python floats (the scalar env's hot path).

    Same state, same answers as ``PlanBuilder(cost, 1, G)`` (the vector-vs-scalar env test holds
    them to bit equality), an order of magnitude less overhead per user.
    """

    def __init__(self, cost: CostModel, max_gamma: int):
        self.cost = cost
        self.g_max = max_gamma
        self.reset()

    def reset(self) -> None:
        # index 0 = AD, 1 = SD
        self.b = [0, 0]
        self.s_max = [0, 0]
        self.n_max = [0, 0]
        self.u_max = [0.0, 0.0]
        self.slack_min = [math.inf, math.inf]
        self.sum_out = [0, 0]
        self.share = [0.0, 0.0]
        self.mem = [0.0, 0.0]
        self.j_max = 0
        self.gamma = 0
        self._prepared = None

    def prepare(self, inp: int, out: int, alpha: float, up: float, slack: float) -> list[bool]:
        c = self.cost
        b_a = self.b[0] + 1
        s_a = max(self.s_max[0], inp)
        n_a = max(self.n_max[0], out)
        u_a = max(self.u_max[0], up)
        sl_a = min(self.slack_min[0], slack)
        share_a = _share1(c.ad_time1(b_a, s_a, n_a), b_a, u_a, sl_a)
        mem_a = c.ad_memory1(b_a, s_a, n_a, self.sum_out[0] + out)
        ok_a = share_a + self.share[1] <= 1 + EPS and mem_a + self.mem[1] <= c.memory_budget1(self.b[1] > 0) * (1 + EPS)
        masks = [True, ok_a] + [False] * self.g_max
        b_s = self.b[1] + 1
        s_s = max(self.s_max[1], inp)
        n_s = max(self.n_max[1], out)
        u_s = max(self.u_max[1], up)
        sl_s = min(self.slack_min[1], slack)
        budget_sd = c.memory_budget1(True) * (1 + EPS)
        sd = {}
        depths = [self.gamma] if self.gamma > 0 else range(1, self.g_max + 1)
        for g in depths:
            j_s = max(self.j_max, sd_iterations1(out, alpha, g))
            share_s = _share1(c.sd_time1(b_s, s_s, n_s, j_s, g), b_s, u_s, sl_s)
            mem_s = c.sd_memory1(b_s, s_s, n_s, self.sum_out[1] + out, g)
            sd[g] = (j_s, share_s, mem_s)
            masks[1 + g] = self.share[0] + share_s <= 1 + EPS and self.mem[0] + mem_s <= budget_sd
        self._prepared = ((inp, out), (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, u_s, sl_s), sd, masks)
        return masks

    def apply(self, action: int) -> bool:
        if self._prepared is None:
            raise RuntimeError("ScalarPlan.apply called before prepare() for this user")
        (inp, out), cand_a, cand_s, sd, masks = self._prepared
        self._prepared = None
        if not (0 <= action < 2 + self.g_max) or not masks[action]:
            return False
        if action == 1:
            self.b[0], self.s_max[0], self.n_max[0], self.u_max[0], self.slack_min[0], self.share[0], self.mem[0] = cand_a
            self.sum_out[0] += out
        elif action >= 2:
            g = action - 1
            self.b[1], self.s_max[1], self.n_max[1], self.u_max[1], self.slack_min[1] = cand_s
            self.j_max, self.share[1], self.mem[1] = sd[g]
            self.sum_out[1] += out
            self.gamma = self.gamma or g
        return True

    def shares(self) -> tuple[float, float]:
        z, lam = shares_for(self.share[0], self.share[1], self.mem[0], self.mem[1], self.b[0], self.b[1])
        return float(z), float(lam)


@dataclass
class BatchStats:
    """Aggregates of one mode's batch; arrays broadcast over plans. Empty batch: b = 0."""

    b: np.ndarray
    s_max: np.ndarray  #: longest input (tokens)
    n_max: np.ndarray  #: longest predicted output (tokens)
    j_max: np.ndarray  #: most SD iterations (SD only)
    u_max: np.ndarray  #: slowest uplink (s)
    slack_min: np.ndarray  #: min over users of T_k - t_d,k (s)
    sum_out: np.ndarray  #: sum of predicted outputs (tokens)

    @classmethod
    def of(cls, rnd: Round, mask: np.ndarray, gamma) -> BatchStats:
        """Aggregates of the users where ``mask`` is true (``mask`` is (K,) or (P, K))."""
        m = np.asarray(mask, dtype=bool)
        j = sd_iterations(rnd.output_tokens, rnd.alpha, np.asarray(gamma)[..., None] if np.ndim(gamma) else gamma)

        def mx(x):
            return np.where(m, x, 0).max(axis=-1, initial=0)

        return cls(
            b=m.sum(axis=-1),
            s_max=mx(rnd.input_tokens),
            n_max=mx(rnd.output_tokens),
            j_max=mx(j),
            u_max=np.where(m, rnd.uplink_s, 0.0).max(axis=-1, initial=0.0),
            slack_min=np.where(m, rnd.slack_s, np.inf).min(axis=-1, initial=np.inf),
            sum_out=np.where(m, rnd.output_tokens, 0).sum(axis=-1),
        )


@dataclass
class FeasibilityReport:
    """Result of the exact check for one plan (or arrays of them, from :func:`check_plans`)."""

    feasible: np.ndarray
    ad_time_s: np.ndarray  #: C_A
    sd_time_s: np.ndarray  #: C_S
    ad_share_min: np.ndarray  #: C_A / beta_A (0 if AD empty, inf if its budget is <= 0)
    sd_share_min: np.ndarray
    ad_memory_bytes: np.ndarray
    sd_memory_bytes: np.ndarray
    memory_budget_bytes: np.ndarray
    z: np.ndarray  #: a valid AD compute share (see :func:`shares_for`)
    lam: np.ndarray  #: a valid AD memory share


def _share_needed(time_s, b, u_max, slack_min):
    budget = slack_min - u_max
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(budget > 0, time_s / np.where(budget > 0, budget, 1.0), np.inf)
    return np.where(b > 0, r, 0.0)


def shares_for(ad_share_min, sd_share_min, ad_mem, sd_mem, b_ad, b_sd):
    """A valid ``(z, lam)`` for a feasible plan: the slack left over is split in proportion.

    Any ``z`` in ``[C_A/beta_A, 1 - C_S/beta_S]`` works; proportional splitting gives both modes
    the same relative head-room against prediction error. An empty mode gets share 0.
    """
    ra, rs = np.asarray(ad_share_min, dtype=float), np.asarray(sd_share_min, dtype=float)
    ma, ms = np.asarray(ad_mem, dtype=float), np.asarray(sd_mem, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(b_sd == 0, 1.0, np.where(b_ad == 0, 0.0, ra / np.maximum(ra + rs, 1e-300)))
        lam = np.where(b_sd == 0, 1.0, np.where(b_ad == 0, 0.0, ma / np.maximum(ma + ms, 1e-300)))
    return z, lam


def check_plans(cost: CostModel, rnd: Round, modes, gamma) -> FeasibilityReport:
    """The exact check for one plan (``modes`` shape (K,)) or many (shape (P, K)) at once."""
    modes = np.asarray(modes)
    ad = BatchStats.of(rnd, modes == AD, gamma)
    sd = BatchStats.of(rnd, modes == SD, gamma)
    c_a = cost.ad_time(ad.b, ad.s_max, ad.n_max)
    c_s = cost.sd_time(sd.b, sd.s_max, sd.n_max, sd.j_max, gamma)
    r_a = _share_needed(c_a, ad.b, ad.u_max, ad.slack_min)
    r_s = _share_needed(c_s, sd.b, sd.u_max, sd.slack_min)
    m_a = cost.ad_memory(ad.b, ad.s_max, ad.n_max, ad.sum_out)
    m_s = np.where(sd.b > 0, cost.sd_memory(sd.b, sd.s_max, sd.n_max, sd.sum_out, gamma), 0.0)
    budget = cost.memory_budget(sd.b > 0)
    feasible = (r_a + r_s <= 1.0 + EPS) & (m_a + m_s <= budget * (1 + EPS)) & (budget >= 0)
    z, lam = shares_for(r_a, r_s, m_a, m_s, ad.b, sd.b)
    return FeasibilityReport(feasible, c_a, c_s, r_a, r_s, m_a, m_s, budget, z, lam)


def check_plan(cost: CostModel, rnd: Round, plan_or_modes, gamma: int | None = None) -> FeasibilityReport:
    """The exact check for one plan (a :class:`Plan` or a modes array with ``gamma``)."""
    if isinstance(plan_or_modes, Plan):
        return check_plans(cost, rnd, plan_or_modes.modes, plan_or_modes.gamma)
    return check_plans(cost, rnd, plan_or_modes, 4 if gamma is None else gamma)


def shares_respected(cost: CostModel, rnd: Round, plan: Plan) -> bool:
    """Whether the plan's own ``z`` and ``lam`` (not just some shares) make every batch fit."""
    rep = check_plans(cost, rnd, plan.modes, plan.gamma)
    b_a, b_s = plan.admitted_ad, plan.admitted_sd
    ok_time = (b_a == 0 or rep.ad_share_min <= plan.z * (1 + EPS)) and (b_s == 0 or rep.sd_share_min <= (1 - plan.z) * (1 + EPS))
    mem = rep.memory_budget_bytes
    ok_mem = rep.ad_memory_bytes <= plan.lam * mem * (1 + EPS) + 1e-6 and rep.sd_memory_bytes <= (1 - plan.lam) * mem * (1 + EPS) + 1e-6
    return bool(ok_time and ok_mem and mem >= 0)


class PlanBuilder:
    """Incremental exact check for ``N`` rounds at once: add users one at a time, O(1) each.

    Holds each mode's aggregates per round. :meth:`prepare` answers, for one candidate
    user per round, which of the ``2 + G`` actions (reject, AD, SD@1..G) keep the plan feasible;
    :meth:`apply` commits actions. The first SD admission fixes the round's draft depth.
    """

    def __init__(self, cost: CostModel, num_rounds: int, max_gamma: int):
        self.cost = cost
        self.n = num_rounds
        self.g_max = max_gamma
        self.gammas = np.arange(1, max_gamma + 1, dtype=np.int64)
        self.reset()

    def reset(self, which: np.ndarray | None = None) -> None:
        """Empty the plans (all rounds, or those where ``which`` is true)."""
        sel = slice(None) if which is None else np.asarray(which, dtype=bool)
        if which is None:
            n = self.n
            self.b = np.zeros((2, n), dtype=np.int64)  # row 0 = AD, row 1 = SD
            self.s_max = np.zeros((2, n), dtype=np.int64)
            self.n_max = np.zeros((2, n), dtype=np.int64)
            self.j_max = np.zeros(n, dtype=np.int64)
            self.u_max = np.zeros((2, n))
            self.slack_min = np.full((2, n), np.inf)
            self.sum_out = np.zeros((2, n), dtype=np.int64)
            self.share = np.zeros((2, n))  # C_m / beta_m
            self.mem = np.zeros((2, n))
            self.gamma = np.zeros(n, dtype=np.int64)  # 0 = not fixed yet
            self._prepared = None
            return
        for arr, val in ((self.b, 0), (self.s_max, 0), (self.n_max, 0), (self.u_max, 0.0), (self.slack_min, np.inf), (self.sum_out, 0), (self.share, 0.0), (self.mem, 0.0)):
            arr[:, sel] = val
        self.j_max[sel] = 0
        self.gamma[sel] = 0
        self._prepared = None

    def take(self, rows: np.ndarray) -> PlanBuilder:
        """A new builder holding copies of the given rounds' plans (rows may repeat): for search."""
        rows = np.asarray(rows, dtype=np.int64)
        new = PlanBuilder.__new__(PlanBuilder)
        new.cost, new.g_max, new.gammas, new.n = self.cost, self.g_max, self.gammas, len(rows)
        for name in ("b", "s_max", "n_max", "u_max", "slack_min", "sum_out", "share", "mem"):
            setattr(new, name, getattr(self, name)[:, rows])
        new.j_max = self.j_max[rows]
        new.gamma = self.gamma[rows]
        new._prepared = None
        return new

    def _candidates(self, inp, out, alpha, up, slack):
        """Aggregates, shares and memory if the user joined AD (N,) or SD@g (N, G)."""
        c = self.cost
        b_a = self.b[0] + 1
        s_a = np.maximum(self.s_max[0], inp)
        n_a = np.maximum(self.n_max[0], out)
        u_a = np.maximum(self.u_max[0], up)
        sl_a = np.minimum(self.slack_min[0], slack)
        share_a = _share_needed(c.ad_time(b_a, s_a, n_a), b_a, u_a, sl_a)
        mem_a = c.ad_memory(b_a, s_a, n_a, self.sum_out[0] + out)

        g = self.gammas[None, :]
        fixed = self.gamma[:, None]
        depth = np.where(fixed > 0, fixed, g)
        j_user = sd_iterations(out[:, None], alpha[:, None], depth)
        b_s = (self.b[1] + 1)[:, None]
        s_s = np.maximum(self.s_max[1], inp)[:, None]
        n_s = np.maximum(self.n_max[1], out)[:, None]
        j_s = np.maximum(self.j_max[:, None], j_user)
        u_s = np.maximum(self.u_max[1], up)[:, None]
        sl_s = np.minimum(self.slack_min[1], slack)[:, None]
        share_s = _share_needed(c.sd_time(b_s, s_s, n_s, j_s, depth), b_s, u_s, sl_s)
        mem_s = c.sd_memory(b_s, s_s, n_s, (self.sum_out[1] + out)[:, None], depth)
        allowed_depth = (fixed == 0) | (g == fixed)
        return (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, j_s, u_s, sl_s, share_s, mem_s), allowed_depth

    def prepare(self, inp, out, alpha, up, slack) -> np.ndarray:
        """Evaluate one candidate user per round; returns and caches the (N, 2 + G) bool masks.

        Columns: reject (always allowed), AD, SD@1..G. :meth:`apply` commits against the last
        prepared user, so each user's candidates are computed once.
        """
        user = tuple(np.asarray(v) for v in (inp, out, alpha, up, slack))
        cand_a, cand_s, allowed = self._candidates(*user)
        share_a, mem_a = cand_a[5], cand_a[6]
        share_s, mem_s = cand_s[6], cand_s[7]
        sd_used = self.b[1] > 0
        ok_a = (share_a + self.share[1] <= 1 + EPS) & (mem_a + self.mem[1] <= self.cost.memory_budget(sd_used) * (1 + EPS))
        budget_sd = self.cost.memory_budget(True)
        ok_s = (self.share[0][:, None] + share_s <= 1 + EPS) & (self.mem[0][:, None] + mem_s <= budget_sd * (1 + EPS)) & allowed
        masks = np.concatenate([np.ones((self.n, 1), dtype=bool), ok_a[:, None], ok_s], axis=1)
        self._prepared = (user, cand_a, cand_s, masks)
        return masks

    def apply(self, actions) -> np.ndarray:
        """Commit one action per round for the last prepared user; invalid actions act as reject.

        Returns the (N,) bool array of actions that were valid.
        """
        if self._prepared is None:
            raise RuntimeError("PlanBuilder.apply called before prepare() for this user")
        (inp, out, alpha, up, slack), cand_a, cand_s, masks = self._prepared
        self._prepared = None
        # the env's action rule: out-of-range and non-integral actions name no action (never truncated)
        actions = action_indices(actions, self.n, 2 + self.g_max)
        valid = (actions >= 0) & masks[np.arange(self.n), np.maximum(actions, 0)]
        to_ad = valid & (actions == 1)
        if to_ad.any():
            b_a, s_a, n_a, u_a, sl_a, share_a, mem_a = cand_a
            self.b[0] = np.where(to_ad, b_a, self.b[0])
            self.s_max[0] = np.where(to_ad, s_a, self.s_max[0])
            self.n_max[0] = np.where(to_ad, n_a, self.n_max[0])
            self.u_max[0] = np.where(to_ad, u_a, self.u_max[0])
            self.slack_min[0] = np.where(to_ad, sl_a, self.slack_min[0])
            self.sum_out[0] = np.where(to_ad, self.sum_out[0] + out, self.sum_out[0])
            self.share[0] = np.where(to_ad, share_a, self.share[0])
            self.mem[0] = np.where(to_ad, mem_a, self.mem[0])
        to_sd = valid & (actions >= 2)
        if to_sd.any():
            col = np.clip(actions - 2, 0, self.g_max - 1)
            rows = np.arange(self.n)
            b_s, s_s, n_s, j_s, u_s, sl_s, share_s, mem_s = (np.broadcast_to(x, (self.n, self.g_max))[rows, col] for x in cand_s)
            self.b[1] = np.where(to_sd, b_s, self.b[1])
            self.s_max[1] = np.where(to_sd, s_s, self.s_max[1])
            self.n_max[1] = np.where(to_sd, n_s, self.n_max[1])
            self.j_max = np.where(to_sd, j_s, self.j_max)
            self.u_max[1] = np.where(to_sd, u_s, self.u_max[1])
            self.slack_min[1] = np.where(to_sd, sl_s, self.slack_min[1])
            self.sum_out[1] = np.where(to_sd, self.sum_out[1] + out, self.sum_out[1])
            self.share[1] = np.where(to_sd, share_s, self.share[1])
            self.mem[1] = np.where(to_sd, mem_s, self.mem[1])
            self.gamma = np.where(to_sd & (self.gamma == 0), actions - 1, self.gamma)
        return valid

    def candidate_shares(self) -> tuple[np.ndarray, np.ndarray]:
        """Minimal compute shares of each batch if the last prepared user joined it.

        ``(ad_share (N,), sd_share (N, G))``: the AD batch's share with the user in AD, and the SD
        batch's share with the user in SD at each depth 1..G (the round's depth where it is fixed).
        """
        if self._prepared is None:
            raise RuntimeError("PlanBuilder.candidate_shares called before prepare() for this user")
        _, cand_a, cand_s, _ = self._prepared
        return cand_a[5], cand_s[6]

    def shares(self) -> tuple[np.ndarray, np.ndarray]:
        """A valid ``(z, lam)`` per round for the plans built so far."""
        return shares_for(self.share[0], self.share[1], self.mem[0], self.mem[1], self.b[0], self.b[1])
