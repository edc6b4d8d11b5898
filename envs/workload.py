"""Rounds of users: what each user asks for, predicted and realised.

A round is ``K`` users, each with one task: input length, predicted output length, end-to-end
deadline, predicted SD acceptance rate, and a position in the cell that fixes its uplink and
downlink times. Realised output length and acceptance are drawn at the same time from the
configured error model (equal to the predictions by default) so that a round is fixed by its seed.

Rounds come from three disjoint **streams** (bottom of this module): ``train`` (the training
environments), ``validation`` (checkpoint selection, early stopping, tuning) and ``test`` (every
published table). They are numpy ``SeedSequence`` streams told apart by their spawn key, so no
seed choice can make two of them share a round; ``tests/test_streams.py`` checks it on contents.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from envs.channel import link_rates_bps, transfer_time_s
from envs.config import EnvConfig

ALPHA_MAX = 0.999  #: realised acceptance is kept below 1 so expected tokens per iteration stay finite


@dataclass
class Round:
    """One round of users (arrays of length K). Times in seconds, lengths in tokens."""

    input_tokens: np.ndarray
    output_tokens: np.ndarray  #: predicted output length O_k (what schedulers see)
    deadline_s: np.ndarray
    alpha: np.ndarray  #: predicted acceptance alpha_k
    distance_m: np.ndarray
    uplink_s: np.ndarray  #: time to send the prompt
    downlink_s: np.ndarray  #: time to send the predicted output
    realized_output_tokens: np.ndarray
    realized_alpha: np.ndarray
    realized_downlink_s: np.ndarray
    #: SpecEdge split (EdgeSchedule-v1): whether the user has its own edge GPU, and its edge-server
    #: round trip; None on rounds built without them (nobody has an edge)
    has_edge: np.ndarray | None = None
    rtt_s: np.ndarray | None = None

    @property
    def num_users(self) -> int:
        return len(self.input_tokens)

    @property
    def slack_s(self) -> np.ndarray:
        """Time left for uplink + compute: ``T_k - t_d,k`` (predicted downlink)."""
        return self.deadline_s - self.downlink_s

    def subset(self, idx: ArrayLike) -> Round:
        """The round of the users ``idx`` selects (an index array or a boolean mask)."""
        return Round(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx] for f in fields(self)})

    def order(self, how: str) -> np.ndarray:
        """Presentation order: 'arrival' (as drawn), ascending 'deadline', 'slack' or predicted 'output', or 'slack_desc'."""
        if how == "arrival":
            return np.arange(self.num_users)
        key = {"deadline": self.deadline_s, "slack": self.slack_s, "output": self.output_tokens, "slack_desc": -self.slack_s}[how]
        return np.argsort(key, kind="stable")

    @classmethod
    def from_arrays(cls, cfg: EnvConfig, input_tokens: ArrayLike, output_tokens: ArrayLike, deadline_s: ArrayLike, alpha: ArrayLike, distance_m: ArrayLike) -> Round:
        """A round with given users and exact predictions (realised = predicted)."""
        i = np.asarray(input_tokens, dtype=np.int64)
        o = np.asarray(output_tokens, dtype=np.int64)
        up, down = link_rates_bps(np.asarray(distance_m, dtype=float), cfg)
        t_down = transfer_time_s(o, down, cfg)
        return cls(
            input_tokens=i,
            output_tokens=o,
            deadline_s=np.asarray(deadline_s, dtype=float),
            alpha=np.asarray(alpha, dtype=float),
            distance_m=np.asarray(distance_m, dtype=float),
            uplink_s=transfer_time_s(i, up, cfg),
            downlink_s=t_down,
            realized_output_tokens=o.copy(),
            realized_alpha=np.asarray(alpha, dtype=float).copy(),
            realized_downlink_s=t_down.copy(),
        )


    @classmethod
    def from_requests(cls, input_tokens: ArrayLike, output_tokens: ArrayLike, deadline_s: ArrayLike, alpha: ArrayLike, uplink_s: ArrayLike, downlink_s: ArrayLike) -> Round:
        """A round of measured requests with given link times (no radio model; realised = predicted).

        ``input_tokens`` (>= 1) and ``output_tokens`` (>= 1, the predicted output) per request,
        ``deadline_s`` (> 0, seconds left from now), ``alpha`` (predicted acceptance, in [0, 1]),
        ``uplink_s`` / ``downlink_s`` (>= 0 seconds: the prompt still to be received, the output to be
        sent), each an array of one value per request or, for the link times, one value for all.
        ``distance_m`` is NaN: there is no radio link to place the user on. Raises ``ValueError``
        naming the field and its range.
        """
        i = np.asarray(input_tokens)
        k = i.shape[0] if i.ndim == 1 else -1
        if k < 1:
            raise ValueError(f"input_tokens must be a 1-D array of at least one request, got shape {i.shape}")

        def per_request(name: str, value, integer: bool, ok, allowed: str, scalar_ok: bool = False) -> np.ndarray:
            raw = np.asarray(value)
            if scalar_ok and raw.ndim == 0:
                raw = np.full(k, raw)
            if raw.shape != (k,):
                raise ValueError(f"{name} must hold one value per request ({k}, as input_tokens), got shape {raw.shape}")
            if raw.dtype.kind not in "iuf" or (integer and raw.dtype.kind == "f" and not np.all(raw == np.round(raw))):
                raise ValueError(f"{name} must be {allowed}, got {value!r}")
            x = raw.astype(np.int64 if integer else float)
            good = np.isfinite(x) & ok(x)
            if not np.all(good):
                raise ValueError(f"{name} must be {allowed}, got {x[~good][0].item()!r} (request {int(np.flatnonzero(~good)[0])})")
            return x

        inp = per_request("input_tokens", i, True, lambda x: x >= 1, "integers >= 1")
        out = per_request("output_tokens", output_tokens, True, lambda x: x >= 1, "integers >= 1")
        dl = per_request("deadline_s", deadline_s, False, lambda x: x > 0, "finite seconds > 0")
        a = per_request("alpha", alpha, False, lambda x: (x >= 0) & (x <= 1), "in [0, 1]")
        up = per_request("uplink_s", uplink_s, False, lambda x: x >= 0, "finite seconds >= 0", scalar_ok=True)
        down = per_request("downlink_s", downlink_s, False, lambda x: x >= 0, "finite seconds >= 0", scalar_ok=True)
        return cls(
            input_tokens=inp,
            output_tokens=out,
            deadline_s=dl,
            alpha=a,
            distance_m=np.full(k, np.nan),
            uplink_s=up,
            downlink_s=down,
            realized_output_tokens=out.copy(),
            realized_alpha=a.copy(),
            realized_downlink_s=down.copy(),
        )


def _beta_with_mean_cv(mean: np.ndarray, cv: float, u: np.ndarray) -> np.ndarray:
    """Quantile ``u`` of a Beta with the given mean and coefficient of variation.

    The variance is capped just below ``mean * (1 - mean)``, the most a Beta on [0, 1] can have.
    """
    var = np.minimum((cv * mean) ** 2, 0.999 * mean * (1.0 - mean))
    total = mean * (1.0 - mean) / var - 1.0
    return stats.beta.ppf(u, mean * total, (1.0 - mean) * total)


def sample_round(rng: np.random.Generator, cfg: EnvConfig, num_users: int | None = None) -> Round:
    """Draw one round from ``cfg``. Every draw comes from ``rng``, in a fixed order.

    The error draws are always made (and scaled by the configured CV), so rounds with the same
    seed share their users across error settings: common random numbers for sweeps.
    """
    return round_from_draws(cfg, *draw_round(rng, cfg, num_users))


#: What :func:`draw_round` takes from a generator: inputs, outputs, deadlines, acceptance, distances,
#: the acceptance and output error draws (``chi`` None without a tail), has-an-edge, RTT seconds.
RoundDraws = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]


def draw_round(rng: np.random.Generator, cfg: EnvConfig, num_users: int | None = None) -> RoundDraws:
    """The random half of :func:`sample_round`: every draw from ``rng``, in its fixed order.

    Split from :func:`round_from_draws` (the arithmetic, element by element per user) so that a vector
    env can draw each sub-env's round from its own generator and then derive all of them in one call
    on the concatenated draws (``envs.split_reset_batch``): the same values as one round at a time.
    """
    k = cfg.num_users if num_users is None else num_users
    i = rng.integers(cfg.input_tokens[0], cfg.input_tokens[1] + 1, size=k)
    o = rng.integers(cfg.output_tokens[0], cfg.output_tokens[1] + 1, size=k)
    t = rng.uniform(cfg.deadline_s[0], cfg.deadline_s[1], size=k)
    a = rng.uniform(cfg.alpha[0], cfg.alpha[1], size=k)
    # uniform over the annulus area between min_distance and the cell radius
    r2 = rng.uniform(cfg.min_distance_m**2, cfg.cell_radius_m**2, size=k)
    d = np.sqrt(r2)
    u_alpha = rng.random(size=k)
    z_out = rng.standard_normal(size=k)
    chi = rng.chisquare(cfg.output_tail_nu, size=k) if cfg.output_tail_nu is not None else None
    has_edge, rtt_s = draw_edge_users(rng.spawn(1)[0], cfg, k)
    return i, o, t, a, d, u_alpha, z_out, chi, has_edge, rtt_s


def round_from_draws(cfg: EnvConfig, i: np.ndarray, o: np.ndarray, t: np.ndarray, a: np.ndarray, d: np.ndarray, u_alpha: np.ndarray,
                     z_out: np.ndarray, chi: np.ndarray | None, has_edge: np.ndarray, rtt_s: np.ndarray) -> Round:
    """The round of :func:`draw_round`'s draws (every operation element-wise per user, so draws of
    several rounds concatenated give the rounds' users concatenated)."""
    rnd = Round.from_arrays(cfg, i, o, t, a, d)
    if cfg.alpha_cv > 0:
        mean = np.clip(a, 1e-3, ALPHA_MAX)
        rnd.realized_alpha = np.clip(_beta_with_mean_cv(mean, cfg.alpha_cv, np.clip(u_alpha, 1e-9, 1 - 1e-9)), 0.0, ALPHA_MAX)
    if cfg.output_cv > 0:
        # log-normal (or log-t) error with median equal to the prediction
        s = np.sqrt(np.log1p(cfg.output_cv**2))
        shock = z_out if chi is None else z_out / np.sqrt(chi / cfg.output_tail_nu)
        realized = np.rint(o * np.exp(s * shock))
        # a heavy tail can draw absurd lengths; cap at 4x the largest configured output
        rnd.realized_output_tokens = np.clip(realized, 1, 4 * cfg.output_tokens[1]).astype(np.int64)
        _, down = link_rates_bps(d, cfg)
        rnd.realized_downlink_s = transfer_time_s(rnd.realized_output_tokens, down, cfg)
    rnd.has_edge, rnd.rtt_s = has_edge, rtt_s
    return rnd


def draw_edge_users(rng: np.random.Generator, cfg: EnvConfig, num_users: int) -> tuple[np.ndarray, np.ndarray]:
    """Whether each user has an edge GPU (probability ``edge_fraction``) and its RTT in seconds.

    ``sample_round`` calls it with a child of the round's generator (``rng.spawn``), which leaves
    the parent's stream untouched: v0 rounds from the same seed are unchanged, and rounds that
    differ only in ``edge_fraction`` or ``rtt_ms`` share their users (common random numbers).
    """
    u_edge = rng.random(num_users)
    u_rtt = rng.random(num_users)
    lo, hi = cfg.rtt_ms
    if cfg.rtt_distribution == "loguniform":
        rtt_ms = np.exp(np.log(lo) + u_rtt * (np.log(hi) - np.log(lo)))
    else:
        rtt_ms = lo + u_rtt * (hi - lo)
    return u_edge < cfg.edge_fraction, rtt_ms / 1e3


# ------------------------------------------------------------------------------------ round streams
#: The three disjoint round streams. ``train`` feeds the training environments; ``validation``
#: chooses checkpoints, stops early and tunes hyperparameters; ``test`` is the only stream any
#: published table reports. A round belongs to one stream by how its generator is seeded (below).
Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
#: numpy's SeedSequence spawn key of each stream: the 5th entropy word. ``test`` has none, so its
#: rounds are exactly the historical ``SeedSequence([seed, r, 0])`` rounds every table was made on.
SPAWN_KEY: dict[str, tuple[int, ...]] = {"test": (), "validation": (1,), "train": (2,)}
WORD = 2**32  #: seeds, indices, stages and start steps are single 32-bit entropy words


def _word(name: str, value: int) -> int:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or not 0 <= int(value) < WORD:
        raise ValueError(f"{name} must be an integer in [0, 2**32), got {value!r}")
    return int(value)


def stream_seed_sequence(split: Split, seed: int, index: int, stage: int = 0, start_step: int = 0) -> np.random.SeedSequence:
    """The seed sequence of round ``index`` of ``split`` (train: of training sub-env ``index``).

    Entropy is ``[seed, index, stage, start_step]`` and the spawn key names the split, so two
    streams never share a generator whatever their seeds: train and validation differ from each
    other and from test (which has no spawn key) in the 5th assembled entropy word. ``stage`` and
    ``start_step`` (train only) give a curriculum stage or a resumed run fresh training rounds.
    """
    if split not in SPAWN_KEY:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    words = [_word("seed", seed), _word("index", index)]
    if split == "train":
        words += [_word("stage", stage), _word("start_step", start_step)]
    elif stage or start_step:
        raise ValueError(f"stage and start_step apply to the train stream only, got split={split!r}")
    return np.random.SeedSequence(words, spawn_key=SPAWN_KEY[split])


def split_rng(split: Split, seed: int, index: int) -> np.random.Generator:
    """The generator of round ``index`` of a validation or test stream."""
    if split == "train":
        raise ValueError("the train stream is one generator per training sub-env: use train_env_seeds()")
    return np.random.default_rng(stream_seed_sequence(split, seed, index))


def train_env_seeds(seed: int, num_envs: int, stage: int = 0, start_step: int = 0) -> list[int]:
    """Integer seeds for the ``num_envs`` training sub-envs, one train-stream generator each.

    A vector env seeds sub-env ``i`` with ``SeedSequence(int)``; this int's 32-bit words are
    ``[seed, i, stage, start_step, 2]``, which is exactly ``stream_seed_sequence("train", seed, i,
    stage, start_step)`` (numpy pads entropy to 4 words before the spawn key).
    """
    _word("num_envs", num_envs)
    tag = SPAWN_KEY["train"][0]
    base = _word("seed", seed) + (_word("stage", stage) << 64) + (_word("start_step", start_step) << 96) + (tag << 128)
    return [base + (i << 32) for i in range(num_envs)]


def round_rng(seed: int, index: int, stream: int = 0) -> np.random.Generator:
    """Generator ``(seed, index, stream)``: stream 0 draws test round ``index``; others draw outcomes."""
    return np.random.default_rng(np.random.SeedSequence([seed, index, stream]))


def make_rounds(cfg: EnvConfig, rounds: int, seed: int, split: Split = "test") -> list[Round]:
    """Rounds ``0 .. rounds-1`` of the ``split`` stream from ``seed`` (round ``r`` depends only on ``r``)."""
    if split == "train":
        raise ValueError("make_rounds draws validation or test rounds; training rounds come from train_env_seeds()")
    if split == "test":  # the historical rounds: SeedSequence([seed, r, 0]) == stream_seed_sequence("test", seed, r)
        return [sample_round(round_rng(seed, r), cfg) for r in range(rounds)]
    return [sample_round(split_rng(split, seed, r), cfg) for r in range(rounds)]
