"""The live server's configuration: every field, checked in full before anything is built or loaded.

``ServeConfig.validate`` checks ranges, that the scheduler name exists, that the profile loads and
that every path (pair, target, draft, policy) is there -- in well under a second, so
``scheduler=nosuch`` fails before the model pair is built for minutes. With ``placement=split`` it
also checks ``split.*`` (:class:`SplitSettings`), that the scheduler plans ED (``balance_ed``,
``edge_first``, or ``policy`` with a policy trained on EdgeSchedule-v1) and that the profile has
``edge`` and ``network`` sections. Once the pair is loaded,
:func:`check_profile_matches_pair` refuses a profile measured for other model dimensions, and
:func:`policy_profile_warning` says when a learned policy was trained on another profile than the
one planning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.config import EnvConfig, resolve_draft_depth
from envs.profile import Profile, load_profile

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: schedulers that plan the ED mode (EdgeSchedule-v1): the only ones placement=split accepts
SPLIT_SCHEDULERS = ("balance_ed", "edge_first", "policy")
V1_ENV_ID = "EdgeSchedule-v1"
#: ``split.device_sharing``: the plan's ED share enforced by turns, or left to the OS
DEVICE_SHARING = ("turns", "os")


@dataclass
class SplitSettings:
    """``placement=split``: the gRPC side of the server (edge clients register, submit and verify there)."""

    port: int = 50051  #: gRPC port of the placement and verification services (0: a free one)
    cohorts: int = 2  #: verification cohorts that take turns (pipeline-aware; 1: everyone in one batch)
    window_ms: float = 5.0  #: how long a verification batch waits for the rest of its cohort, ms
    max_depth: int = 16  #: the deepest draft chain the verifier accepts
    max_clients: int = 64  #: concurrent gRPC streams (placement + verification)
    #: how the verifier and the round's AD / SD engines share one device: ``turns`` (the plan's ED
    #: share enforced, :mod:`runtime.device_turns`) or ``os`` (two free threads; the OS time-slices them)
    device_sharing: str = "turns"

    @classmethod
    def from_value(cls, value: SplitSettings | Mapping[str, Any] | None) -> SplitSettings:
        """From a mapping (Hydra's ``split.*``) or an instance; raises ``ValueError`` naming the field."""
        if isinstance(value, cls):
            s = value
        elif isinstance(value, dict):
            unknown = sorted(set(value) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValueError(f"unknown serve config key(s) split.{unknown}; known: {sorted(cls.__dataclass_fields__)}")
            s = cls(**value)
        else:
            raise ValueError(f"serve config 'split' must be a mapping of {sorted(cls.__dataclass_fields__)}, got {value!r}")

        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"serve config 'split.{name}' must be {allowed}, got {getattr(s, name)!r}")

        def integer(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        need(integer(s.port) and 0 <= s.port <= 65535, "port", "an integer in [0, 65535]")
        need(integer(s.cohorts) and 1 <= s.cohorts <= 8, "cohorts", "an integer in [1, 8]")
        need(isinstance(s.window_ms, int | float) and not isinstance(s.window_ms, bool) and 0 <= s.window_ms <= 1000, "window_ms", "in [0, 1000] ms")
        need(integer(s.max_depth) and 1 <= s.max_depth <= 64, "max_depth", "an integer in [1, 64]")
        need(integer(s.max_clients) and 1 <= s.max_clients <= 1024, "max_clients", "an integer in [1, 1024]")
        need(s.device_sharing in DEVICE_SHARING, "device_sharing", f"one of {list(DEVICE_SHARING)}")
        return s


@dataclass
class ServeConfig:
    scheduler: str = "balance"
    host: str = "127.0.0.1"
    port: int = 8011
    pair: str | None = None  #: a built pair folder (target/ + draft/); None = the project's own (built and cached)
    target: str | None = None  #: any local Hugging Face causal LM folder (with ``draft``; overrides ``pair``)
    draft: str | None = None  #: the draft model's folder (shares the target's tokenizer)
    pair_preset: str = "full"
    device: str = "cpu"
    devices: list[str] | None = None  #: two devices: AD batches on the first, SD on the second (overrides ``device``)
    dtype: str = "float32"
    threads: int | None = None  #: torch CPU threads (None = torch's default); plan with a profile measured at the same count
    #: the cost model the scheduler plans with: ``auto`` = a profile measured on this machine (the shipped table for the
    #: thread count plus a quick calibration, measured on first use and cached per machine: runtime.machine_profile),
    #: or a name in envs/profiles/ or a .yaml path, used as it is
    profile: str = "auto"
    auto_profile: bool = True  #: with profile=auto: measure (< 2 min, once per machine) on a cache miss; false: the shipped table as it is
    window_s: float = 0.5  #: how long a round collects requests
    max_round: int = 64  #: most requests in one round (the rest carry over to the next round)
    max_queue: int = 512  #: requests waiting beyond this are refused (503)
    stream_interval_s: float = 0.05  #: a stream sends new text at most this often (the first at once)
    max_tokens_limit: int = 512
    max_prompt_tokens: int = 2048
    default_deadline_s: float = 30.0
    draft_depth: int | None = None  #: SD draft depth (tokens per iteration); None = envs.plan.DEFAULT_DRAFT_DEPTH (resolved by validate)
    alpha_init: float = 0.8  #: acceptance estimate before any SD has run (then an EMA of the engine's measurements)
    policy_path: str | None = None
    shutdown_timeout_s: float = 30.0  #: SIGTERM: running rounds get this long, then every remaining stream is ended
    max_body_bytes: int = 1 << 20  #: larger request bodies get 413 before they are read whole
    body_timeout_s: float = 10.0  #: a request body not complete after this long is dropped (408)
    header_timeout_s: float = 10.0  #: a connection that has not sent complete request headers after this long is closed
    calibration_weight: float = 0.3  #: EMA weight of each round's measured real / predicted step time
    calibration_bounds: list[float] = field(default_factory=lambda: [0.5, 20.0])  #: the calibration factor stays in [low, high]
    calibration_margin_sd: float = 1.0  #: plan with mean + this many standard deviations of real / predicted
    calibration_probe_s: float = 5.0  #: before planning, probe the host's speed if the last sample is older than this (0: never)
    #: ``local``: HTTP users only (AD / SD); ``split``: edge clients (ED-capable users) also register over gRPC
    #: (``split.*``) and every user is planned with a v1 scheduler (runtime.split_rounds)
    placement: str = "local"
    split: SplitSettings | dict = field(default_factory=SplitSettings)

    def validate(self) -> ServeConfig:
        """Check every field (and that scheduler, profile and paths exist); raises ``ValueError``
        naming the field and what it may be. Loads nothing heavy."""

        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"serve config '{name}' must be {allowed}, got {getattr(self, name)!r}")

        def integer(name: str, lo: int, hi: int | None = None) -> None:
            v = getattr(self, name)
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)
            need(ok, name, f"an integer in [{lo}, {hi if hi is not None else 'inf'}]")

        def positive(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and (v >= 0 if allow_zero else v > 0) and v < float("inf")
            need(ok, name, ">= 0" if allow_zero else "a finite number > 0")

        integer("port", 0, 65535)
        for name in ("window_s", "default_deadline_s", "shutdown_timeout_s", "body_timeout_s", "header_timeout_s"):
            positive(name)
        positive("stream_interval_s", allow_zero=True)
        positive("calibration_probe_s", allow_zero=True)
        need(self.threads is None or (isinstance(self.threads, int) and not isinstance(self.threads, bool) and self.threads >= 1), "threads", "null or an integer >= 1")
        integer("max_round", 1, 64)  # the environment's observation is sized for at most 64 users
        integer("max_queue", 1)
        integer("max_tokens_limit", 1)
        integer("max_prompt_tokens", 1)
        integer("max_body_bytes", 1024)
        self.draft_depth = resolve_draft_depth(self.draft_depth, EnvConfig.max_gamma, "serve")  # the planning env's default max_gamma
        need(isinstance(self.alpha_init, int | float) and 0 < self.alpha_init < 1, "alpha_init", "in (0, 1)")
        need(isinstance(self.calibration_weight, int | float) and 0 < self.calibration_weight <= 1, "calibration_weight", "in (0, 1]")
        need(isinstance(self.calibration_margin_sd, int | float) and 0 <= self.calibration_margin_sd <= 10, "calibration_margin_sd", "in [0, 10]")
        b = self.calibration_bounds
        need(isinstance(b, list | tuple) and len(b) == 2 and all(isinstance(x, int | float) for x in b) and 0 < b[0] <= 1 <= b[1] < float("inf"),
             "calibration_bounds", "[low, high] with 0 < low <= 1 <= high")
        need(self.devices is None or (isinstance(self.devices, list | tuple) and len(self.devices) == 2 and all(isinstance(d, str) and d for d in self.devices)),
             "devices", "null or a list of two device names, e.g. [cuda:0, cuda:1]")
        need(isinstance(self.dtype, str) and self.dtype in ("float32", "float16", "bfloat16"), "dtype", "one of float32, float16, bfloat16")
        # torch is imported only once the cheap checks have passed
        from runtime.pair import device_dtype_problem

        for name, dev in [("device", self.device)] + [("devices", d) for d in (self.devices or [])]:
            need(isinstance(dev, str) and device_dtype_problem(dev, self.dtype) is None, name,
                 "a torch device this machine has (cpu, cuda, cuda:N with CUDA available)")
        need((self.target is None) == (self.draft is None), "draft", "given together with 'target' (both or neither)")
        for name in ("pair", "target", "draft"):
            path = getattr(self, name)
            need(path is None or Path(path).is_dir(), name, "null or an existing folder")
        need(isinstance(self.auto_profile, bool), "auto_profile", "true or false")
        need(self.placement in ("local", "split"), "placement", "local or split")
        self.split = SplitSettings.from_value(self.split)
        self._check_scheduler()
        try:
            if self.profile != "auto":  # auto is resolved once the pair is loaded (runtime.machine_profile)
                profile = load_profile(self.profile)
        except ValueError as err:
            raise ValueError(f"serve config 'profile': {err}") from None
        if self.placement == "split":
            self._check_split(None if self.profile == "auto" else profile)
        return self

    def _check_split(self, profile: Profile | None) -> None:
        """placement=split: a v1 scheduler, a profile with edge and network sections, one device, two ports."""
        if self.scheduler not in SPLIT_SCHEDULERS:
            raise ValueError(f"serve config 'scheduler' must be one of {list(SPLIT_SCHEDULERS)} with placement=split (they plan ED), got {self.scheduler!r}")
        if self.scheduler == "policy":
            folder = Path(self.policy_path)
            meta = (folder if folder.is_dir() else folder.parent) / "policy.json"
            env_id = json.loads(meta.read_text()).get("env_id", "EdgeSchedule-v0") if meta.is_file() else None
            if env_id != V1_ENV_ID:
                raise ValueError(f"serve config 'policy_path' must be a policy trained on {V1_ENV_ID} with placement=split (e.g. policies/split_k20), got {self.policy_path!r} ({env_id or 'no policy.json'})")
        if profile is None or profile.edge is None or profile.network is None:
            raise ValueError(f"serve config 'profile' must name a profile with edge and network sections with placement=split "
                             f"(e.g. split_cpu1_specsched-pair; runtime.profile --role edge), got {self.profile!r}")
        if self.devices is not None:
            raise ValueError(f"serve config 'devices' must be null with placement=split (the verifier shares the one target), got {self.devices!r}")
        if self.split.port != 0 and self.split.port == self.port:
            raise ValueError(f"serve config 'split.port' must differ from 'port' ({self.port}), got {self.split.port}")

    def _check_scheduler(self) -> None:
        from agents.registry import SCHEDULERS

        known = sorted(SCHEDULERS) + ["policy"]
        if self.scheduler not in known:
            raise ValueError(f"serve config 'scheduler' must be one of {known}, got {self.scheduler!r}")
        if self.scheduler == "policy":
            if not self.policy_path or not Path(self.policy_path).exists():
                raise ValueError(f"serve config 'policy_path' must be an existing policy folder or model.zip for scheduler=policy, got {self.policy_path!r}")
            return
        # an exhaustive search decides rounds of at most its max_users: a larger round would fail every request in it
        limit = SCHEDULERS[self.scheduler].max_users
        if limit is not None and self.max_round > limit:
            raise ValueError(f"serve config 'max_round' must be an integer in [1, {limit}] with scheduler={self.scheduler} "
                             f"(it searches every plan of a round), got {self.max_round}; set max_round={limit}")


def check_profile_matches_pair(profile: Profile, target_config: PretrainedConfig, draft_config: PretrainedConfig) -> None:
    """Refuse a profile whose model dimensions or vocabulary differ from the loaded pair's
    (``*_config``: the Hugging Face configs); planning with it would time another model."""
    fields = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "vocab": "vocab_size"}
    wrong = []
    for role, spec, cfg in (("llm", profile.llm, target_config), ("slm", profile.slm, draft_config)):
        for ours, theirs in fields.items():
            have = getattr(cfg, theirs, None)
            if ours == "kv_heads" and have is None:
                have = getattr(cfg, "num_attention_heads", None)  # no GQA field: one KV head per head
            if have is not None and int(have) != int(getattr(spec, ours)):
                wrong.append(f"{role}.{ours}: profile {getattr(spec, ours)}, model {have}")
    if wrong:
        raise ValueError(f"profile {profile.name!r} does not describe the served pair ({'; '.join(wrong)}); measure one with runtime.profile or pass profile=PATH")


def policy_profile_warning(policy_path: str | None, profile: Profile) -> str | None:
    """A warning when a learned policy was trained on another profile than the one planning."""
    if not policy_path:
        return None
    folder = Path(policy_path)
    meta = (folder if folder.is_dir() else folder.parent) / "policy.json"
    if not meta.is_file():
        return None
    trained = json.loads(meta.read_text()).get("env", {}).get("profile")
    if trained and trained != profile.name:
        return f"the policy at {policy_path} was trained on profile {trained!r}, but the server plans with {profile.name!r}"
    return None
