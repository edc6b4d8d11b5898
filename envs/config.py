"""The environment's configuration: workload, wireless channel, prediction error and model switches.

One flat dataclass so that ``gymnasium.make("EdgeSchedule-v0", num_users=12)`` and Hydra's
``env.num_users=12`` address the same field. Ranges are ``[low, high]`` pairs drawn uniformly
(integers inclusive). Defaults are the BALANCE paper's setting (``shared/reference/balance.md`` §4).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs.model_choices import ModelChoices, choice_problem
from envs.plan import DEFAULT_DRAFT_DEPTH

MAX_USERS_LIMIT = 4096
KV_MEMORY_MODELS = ("per_user", "padded")
USER_ORDERS = ("arrival", "deadline", "slack", "output", "slack_desc")
COMPLETIONS = ("batch", "own")
SHARINGS = ("fixed", "work_conserving")
REWARD_TIMINGS = ("admission", "episode_end")
RTT_DISTRIBUTIONS = ("uniform", "loguniform")
#: the radio fields' allowed ranges (a cell up to 100 km, power spectral densities and path losses
#: of any real link, bandwidths up to 1 THz); fields in POSITIVE_CHANNEL_FIELDS must also be > 0
CHANNEL_RANGES = {
    "cell_radius_m": (0.0, 1.0e5),
    "uplink_bandwidth_hz": (0.0, 1.0e12),
    "downlink_bandwidth_hz": (0.0, 1.0e12),
    "bits_per_token": (0.0, 1.0e6),
    "uplink_psd_dbm_per_hz": (-300.0, 100.0),
    "downlink_psd_dbm_per_hz": (-300.0, 100.0),
    "noise_psd_dbm_per_hz": (-300.0, 100.0),
    "path_loss_db_at_1km": (0.0, 500.0),
    "path_loss_slope_db": (0.0, 200.0),
}
POSITIVE_CHANNEL_FIELDS = ("cell_radius_m", "uplink_bandwidth_hz", "downlink_bandwidth_hz", "bits_per_token")


def is_number(v: Any) -> bool:
    """A real number that is not a bool (``True`` is an int to Python, never a radius); NaN fails every comparison."""
    return isinstance(v, int | float) and not isinstance(v, bool)


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field and the allowed values."""


def _pair(default: tuple[float, float]):
    return field(default_factory=lambda: list(default))


@dataclass
class EnvConfig:
    # --- round size and hardware -------------------------------------------------------------
    num_users: int = 50  #: K, users per round
    max_users: int | None = None  #: K_max, users the observation looks ahead (padded); default num_users
    profile: str = "rtx4090_llama2-7b_tinyllama-1.1b"  #: file in envs/profiles/ (no .yaml) or a path
    memory_bytes: float | None = None  #: override the device memory Q (memory sweeps)
    max_gamma: int = 8  #: G, the largest draft depth; actions are reject, AD, SD@1..G
    # --- workload (per user, uniform) ---------------------------------------------------------
    input_tokens: list = _pair((1, 160))  #: calibrated: BALANCE serves ~70 % at K = 70 (see results/calibration.md)
    output_tokens: list = _pair((1, 160))
    deadline_s: list = _pair((0.5, 13.0))
    alpha: list = _pair((0.6, 0.95))  #: predicted per-token SD acceptance
    # --- wireless channel -----------------------------------------------------------------------
    cell_radius_m: float = 250.0
    min_distance_m: float = 10.0
    uplink_bandwidth_hz: float = 1.0e6
    downlink_bandwidth_hz: float = 2.0e6
    uplink_psd_dbm_per_hz: float = -50.0
    downlink_psd_dbm_per_hz: float = -29.0
    noise_psd_dbm_per_hz: float = -174.0
    path_loss_db_at_1km: float = 128.1  #: PL(d) = a + b * log10(d / 1 km)
    path_loss_slope_db: float = 37.6
    bits_per_token: float = 32.0
    # --- predicted vs realised ------------------------------------------------------------------
    alpha_cv: float = 0.0  #: realised acceptance ~ Beta(mean = predicted, CV = alpha_cv)
    output_cv: float = 0.0  #: realised output ~ predicted * exp(s * t_nu), CV of the log-normal = output_cv
    output_tail_nu: float | None = None  #: Student-t degrees of freedom of the output error; None = normal
    simulate_acceptance: bool = False  #: draw SD acceptance token by token instead of using expectations
    # --- model switches ---------------------------------------------------------------------------
    kv_memory: str = "per_user"  #: 'per_user' (own output) or 'padded' (batch max output) KV accounting
    user_order: str = "arrival"  #: order users are presented to the env: arrival, deadline, slack, output (ascending) or slack_desc (loosest first)
    completion: str = "batch"  #: realised finish of a user: 'batch' (its batch's end, the paper) or 'own' (its own last token)
    sharing: str = "fixed"  #: realised compute sharing: 'fixed' (C / share, the paper) or 'work_conserving' (a finished batch's share goes to the other)
    reward_timing: str = "admission"  #: 'admission': +1 on admit, -1 at the end per late user; 'episode_end'
    # --- cost-model choices studied against the paper (envs/model_choices.py; defaults = first principles)
    draft_kv: str = "own"  #: 'own' (the draft's KV at its own size) or 'target' (at the target's size)
    verify_flops_efficiency: float | None = None  #: null = roofline verify; e in (0, 1]: + its compute at e * peak, not overlapped
    sd_user_workspace_bytes: float = 0.0  #: bytes each SD user holds beyond its KV (verify-pass workspace)
    sd_overhead_bytes: float = 0.0  #: bytes the SD mode holds once beyond the SLM weights
    # --- SpecEdge split (EdgeSchedule-v1; drawn from a separate child stream, so v0 rounds are unchanged)
    edge_fraction: float = 0.0  #: share of users with their own edge GPU (may run ED: edge drafts, server verifies)
    rtt_ms: list = _pair((15.0, 15.0))  #: each user's edge-server round trip, drawn from [low, high]
    rtt_distribution: str = "uniform"  #: 'uniform' or 'loguniform' over rtt_ms

    def __post_init__(self) -> None:
        self.validate()

    # Validation is explicit (not just type hints) because Hydra and gymnasium.make pass raw values.
    def validate(self) -> EnvConfig:
        def bad(name: str, allowed: str, got: Any) -> ConfigError:
            return ConfigError(f"env config field '{name}' must be {allowed}, got {got!r}")

        if not isinstance(self.num_users, int) or isinstance(self.num_users, bool) or not 1 <= self.num_users <= MAX_USERS_LIMIT:
            raise bad("num_users", f"an integer in [1, {MAX_USERS_LIMIT}]", self.num_users)
        if self.max_users is not None and (not isinstance(self.max_users, int) or isinstance(self.max_users, bool) or not 1 <= self.max_users <= MAX_USERS_LIMIT):
            raise bad("max_users", f"null or an integer in [1, {MAX_USERS_LIMIT}]", self.max_users)
        if not isinstance(self.profile, str) or not self.profile:
            raise bad("profile", "the name of a file in envs/profiles/ without .yaml", self.profile)
        if self.memory_bytes is not None and not (is_number(self.memory_bytes) and 0 < self.memory_bytes < math.inf):
            raise bad("memory_bytes", "null or a finite number > 0", self.memory_bytes)
        if not isinstance(self.max_gamma, int) or isinstance(self.max_gamma, bool) or not 1 <= self.max_gamma <= 32:
            raise bad("max_gamma", "an integer in [1, 32]", self.max_gamma)
        self.input_tokens = self._range("input_tokens", self.input_tokens, 1, 1 << 20, integer=True)
        self.output_tokens = self._range("output_tokens", self.output_tokens, 1, 1 << 20, integer=True)
        self.deadline_s = self._range("deadline_s", self.deadline_s, 1e-6, 1e6)
        self.alpha = self._range("alpha", self.alpha, 0.0, 1.0)
        # physical ranges, not just finiteness: a radius of 1e308 m overflowed its square at reset,
        # and a PSD of 1e300 dBm/Hz or a path loss of 1e308 dB silently rejected every user
        for name, (lo, hi) in CHANNEL_RANGES.items():
            v = getattr(self, name)
            if not (is_number(v) and lo <= v <= hi) or (name in POSITIVE_CHANNEL_FIELDS and not v > 0):
                interval = f"({lo:g}, {hi:g}]" if name in POSITIVE_CHANNEL_FIELDS else f"[{lo:g}, {hi:g}]"
                raise bad(name, f"a number in {interval}", v)
        if not (is_number(self.min_distance_m) and 0 < self.min_distance_m < self.cell_radius_m):
            raise bad("min_distance_m", f"a number in (0, cell_radius_m={self.cell_radius_m})", self.min_distance_m)
        for name in ("alpha_cv", "output_cv"):
            v = getattr(self, name)
            if not (is_number(v) and 0 <= v <= 2):
                raise bad(name, "a number in [0, 2]", v)
        # finite: an infinite nu is the normal case (use null); inf itself broke the draws (chi / inf)
        if self.output_tail_nu is not None and not (is_number(self.output_tail_nu) and 2 < self.output_tail_nu < math.inf):
            raise bad("output_tail_nu", "null (normal) or a finite number > 2 (finite variance)", self.output_tail_nu)
        if not isinstance(self.simulate_acceptance, bool):
            raise bad("simulate_acceptance", "true or false", self.simulate_acceptance)
        if self.kv_memory not in KV_MEMORY_MODELS:
            raise bad("kv_memory", f"one of {list(KV_MEMORY_MODELS)}", self.kv_memory)
        if self.user_order not in USER_ORDERS:
            raise bad("user_order", f"one of {list(USER_ORDERS)}", self.user_order)
        if self.completion not in COMPLETIONS:
            raise bad("completion", f"one of {list(COMPLETIONS)}", self.completion)
        if self.sharing not in SHARINGS:
            raise bad("sharing", f"one of {list(SHARINGS)}", self.sharing)
        if self.reward_timing not in REWARD_TIMINGS:
            raise bad("reward_timing", f"one of {list(REWARD_TIMINGS)}", self.reward_timing)
        if not (isinstance(self.edge_fraction, int | float) and not isinstance(self.edge_fraction, bool) and 0.0 <= self.edge_fraction <= 1.0):
            raise bad("edge_fraction", "a number in [0, 1]", self.edge_fraction)
        self.rtt_ms = self._range("rtt_ms", self.rtt_ms, 0.0, 1e5)
        if self.rtt_distribution not in RTT_DISTRIBUTIONS:
            raise bad("rtt_distribution", f"one of {list(RTT_DISTRIBUTIONS)}", self.rtt_distribution)
        if self.rtt_distribution == "loguniform" and self.rtt_ms[0] <= 0:
            raise bad("rtt_ms", "a [low, high] pair with low > 0 for rtt_distribution='loguniform'", self.rtt_ms)
        problem = choice_problem(self.draft_kv, self.verify_flops_efficiency, self.sd_user_workspace_bytes, self.sd_overhead_bytes)
        if problem:
            raise ConfigError(f"env config {problem}")
        return self

    @staticmethod
    def _range(name: str, value: Any, lo: float, hi: float, integer: bool = False) -> list:
        try:
            a, b = (float(v) for v in value)
        except (TypeError, ValueError):
            raise ConfigError(f"env config field '{name}' must be a [low, high] pair, got {value!r}") from None
        if not (lo <= a <= b <= hi):
            raise ConfigError(f"env config field '{name}' must satisfy {lo} <= low <= high <= {hi}, got {value!r}")
        if integer:
            if a != int(a) or b != int(b):
                raise ConfigError(f"env config field '{name}' must hold integers, got {value!r}")
            return [int(a), int(b)]
        return [a, b]

    @property
    def model_choices(self) -> ModelChoices:
        """The cost-model choices of this config (what ``CostModel.from_config`` applies)."""
        return ModelChoices(self.draft_kv, self.verify_flops_efficiency, self.sd_user_workspace_bytes, self.sd_overhead_bytes)

    @property
    def k_max(self) -> int:
        return self.max_users if self.max_users is not None else self.num_users

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EnvConfig:
        """Build from keyword arguments, rejecting unknown names with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown env config field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> EnvConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- app configs (train, evaluate, serve)
#: top-level app config keys that were renamed: old -> new. ``gamma`` (the draft depth) collided
#: with ``agent.gamma``, the RL discount.
RENAMED_APP_KEYS = {"gamma": "draft_depth"}


def _renamed_message(app: str, old: str) -> str:
    new = RENAMED_APP_KEYS[old]
    return f"{app} config key '{old}' was renamed to '{new}' (the SD draft depth, tokens per iteration; 'gamma' stays the RL discount agent.gamma): use {new}=N, or {new}=null for the default {DEFAULT_DRAFT_DEPTH}"


def refuse_renamed_keys(app_cfg: Mapping[str, Any], app: str) -> None:
    """Raise :class:`ConfigError` naming the new key if ``app_cfg`` uses a renamed top-level key."""
    for old in RENAMED_APP_KEYS:
        if old in app_cfg:
            raise ConfigError(_renamed_message(app, old))


def refuse_renamed_overrides(overrides: Sequence[str], app: str) -> None:
    """The same for command-line overrides (``gamma=5``, ``+gamma=5``), before Hydra composes."""
    for arg in overrides:
        key = arg.lstrip("+~").split("=", 1)[0]
        if key in RENAMED_APP_KEYS:
            raise ConfigError(_renamed_message(app, key))


def resolve_draft_depth(value: Any, max_gamma: int, app: str) -> int:
    """The app config's ``draft_depth``: ``None`` is ``min(DEFAULT_DRAFT_DEPTH, max_gamma)``, else
    an integer in ``[1, max_gamma]`` (tokens drafted per SD iteration)."""
    if value is None:
        return min(DEFAULT_DRAFT_DEPTH, max_gamma)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= max_gamma:
        raise ConfigError(f"{app} config 'draft_depth' must be null (= {DEFAULT_DRAFT_DEPTH}) or an integer in [1, max_gamma={max_gamma}], got {value!r}")
    return value
