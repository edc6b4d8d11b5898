"""The one cost model of the edge server: batch times, memory and the memory budget of a profile.

The environment, every scheduler, the exact optimum and the live runtime price plans with it
(DESIGN.md §1); the exact check built on it is :mod:`envs.feasibility`, the incremental builders
:mod:`envs.plan_builder`.

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
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from envs.config import EnvConfig
from envs.model_choices import ModelChoices
from envs.profile import Profile, load_profile


def expected_tokens_per_iteration(alpha: ArrayLike, gamma: ArrayLike) -> np.ndarray:
    """``E = (1 - a^(g+1)) / (1 - a)``: accepted drafts plus the target's bonus/correction token."""
    a = np.asarray(alpha, dtype=float)
    g = np.asarray(gamma, dtype=float)
    near_one = a > 1.0 - 1e-9
    safe = np.where(near_one, 0.5, a)
    return np.where(near_one, g + 1.0, (1.0 - safe ** (g + 1.0)) / (1.0 - safe))


def sd_iterations(output_tokens: ArrayLike, alpha: ArrayLike, gamma: ArrayLike) -> np.ndarray:
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
    def memory_budget(self, sd_used: ArrayLike) -> np.ndarray:
        """KV bytes available to both modes together: ``Q - reserve - W_L - [SD used] W_S``."""
        return self.memory_bytes - self.reserve_bytes - self.w_l - np.asarray(sd_used, dtype=float) * self.w_s

    def ad_memory(self, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike, sum_out: ArrayLike) -> np.ndarray:
        """Bytes of KV an AD batch holds (arrays broadcast)."""
        b = np.asarray(b, dtype=float)
        if self.kv_memory == "per_user":
            return (b * s_max + sum_out) * self.kv_l
        return b * (np.asarray(s_max, dtype=float) + n_max) * self.kv_l

    def sd_memory(self, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike, sum_out: ArrayLike, gamma: ArrayLike) -> np.ndarray:
        """Bytes an SD batch holds: KV of both models and any per-user workspace (arrays broadcast)."""
        b = np.asarray(b, dtype=float)
        if self.kv_memory == "per_user":
            kv = (b * (np.asarray(s_max, dtype=float) + gamma) + sum_out) * self.kv_sd
        else:
            kv = b * (np.asarray(s_max, dtype=float) + n_max + gamma) * self.kv_sd
        return kv + b * self.sd_user_bytes if self.sd_user_bytes else kv

    # ---------------------------------------------------------------- time
    def ad_time(self, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike) -> np.ndarray:
        """``C_A`` in seconds on the whole GPU (0 for an empty batch)."""
        b = np.asarray(b, dtype=np.int64)
        s = np.maximum(np.asarray(s_max, dtype=np.int64), 1)
        n = np.asarray(n_max, dtype=np.int64)
        bb = np.maximum(b, 1)
        t = self.tau_l.tau(bb, s, s) + self.tau_l.decode_sum(bb, s, np.maximum(n - 1, 0))
        if self.engine is not None:
            t = t + np.maximum(n - 1, 0) * self.engine.ad(bb)
        return np.where(b > 0, t, 0.0)

    def sd_time(self, b: ArrayLike, s_max: ArrayLike, n_max: ArrayLike, j_max: ArrayLike, gamma: ArrayLike) -> np.ndarray:
        """``C_S`` in seconds on the whole GPU (0 for an empty batch)."""
        b = np.asarray(b, dtype=np.int64)
        bb = np.maximum(b, 1)
        s = np.maximum(np.asarray(s_max, dtype=float), 1.0)
        g = np.asarray(gamma, dtype=float)
        c = s + np.asarray(n_max, dtype=float) / 2.0
        prefill = self.tau_l.tau(bb, s, s) + self.tau_s.tau(bb, s, s)
        return np.where(b > 0, prefill + np.asarray(j_max, dtype=float) * self.sd_iteration_time(bb, c, g), 0.0)

    def sd_iteration_time(self, b: ArrayLike, c: ArrayLike, gamma: ArrayLike) -> np.ndarray:
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
        prefill, iteration = self.sd_parts1(b, s_max, n_max, gamma)
        return prefill + float(j_max) * iteration

    def sd_parts1(self, b: int, s_max: int, n_max: int, gamma: int) -> tuple[float, float]:
        """:meth:`sd_time1`'s prefill and per-iteration seconds (``b >= 1``): ``sd_time1 = prefill +
        float(j_max) * iteration``, so a caller can memoise them without ``j_max`` (envs.split_builder)."""
        s = max(float(s_max), 1.0)
        c = s + float(n_max) / 2.0
        prefill = self.tau_l.tau1(b, s, s) + self.tau_s.tau1(b, s, s)
        return prefill, self._sd_iterations1(b, (gamma,), c, self.tau_s.tau1(b, 1.0, c))[0]

    def sd_parts_all1(self, b: int, s_max: int, n_max: int, g_max: int) -> tuple[float, ...]:
        """``(prefill, iteration(1), ..., iteration(G))``: :meth:`sd_parts1` at every depth 1..G with
        the depth-free passes (both prefills, the draft's decode step) priced once, by the same
        operations, so the floats are sd_parts1's. A round prices every depth until its first SD
        admission fixes one (``envs.split_builder``): 2 + G passes instead of 4 G."""
        s = max(float(s_max), 1.0)
        c = s + float(n_max) / 2.0
        draft = self.tau_s.tau1(b, 1.0, c)
        prefill = self.tau_l.tau1(b, s, s) + self.tau_s.tau1(b, s, s)
        return (prefill, *self._sd_iterations1(b, range(1, g_max + 1), c, draft))

    def sd_parts_are_plain(self) -> bool:
        """Whether SD's parts are priced by this class's own methods (no subclass overrides them)
        with none of their optional terms (verify compute, engine overhead): then a caller may
        inline the same float operations (``envs.scalar_times``)."""
        cls = type(self)
        return (cls.sd_parts1 is CostModel.sd_parts1 and cls.sd_parts_all1 is CostModel.sd_parts_all1 and cls._sd_iterations1 is CostModel._sd_iterations1
                and self.verify_s_per_flop is None and self.engine is None)

    def _sd_iterations1(self, b: int, gammas, c: float, draft_step_s: float) -> list[float]:
        """One SD iteration's seconds at each depth of ``gammas`` and mean context ``c``: ``g`` draft
        steps of ``draft_step_s``, the verify pass, a non-overlapped verify's compute and the
        engine's host work (one loop: the v1 builder prices every depth on each new batch maximum)."""
        tau_l, per_flop, engine = self.tau_l.tau1, self.verify_s_per_flop, self.engine
        out = []
        for gamma in gammas:
            g = float(gamma)
            iteration = g * draft_step_s + tau_l(b, g + 1.0, c + g)
            if per_flop is not None:
                iteration = iteration + float(self.profile.llm.flops(float(b), g + 1.0, c + g)) * per_flop
            if engine is not None:
                iteration = iteration + float(engine.sd(b, g))
            out.append(iteration)
        return out

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

    def times_version(self) -> object:
        """A value that changes whenever this model's batch times change (None: they never do).

        The incremental builders (``envs.plan_builder.ScalarPlan``, ``envs.split_builder.SplitScalarPlan``)
        memoise times by their arguments for the plan's lifetime and forget them at a reset when this
        value moved: a subclass whose times follow live state (``runtime.calibration.CalibratedCostModel``)
        must say so here, or a long-lived scheduler would plan with stale times."""
        return None


def sd_iterations1(output_tokens: int, alpha: float, gamma: int) -> int:
    """:func:`sd_iterations` for one user, as a Python int."""
    g = float(gamma)
    e = g + 1.0 if alpha > 1.0 - 1e-9 else (1.0 - alpha ** (g + 1.0)) / (1.0 - alpha)
    return math.ceil(float(output_tokens) / e - 1e-9)
