"""A tiny hand-computable system: a linear-in-everything profile and a three-user round.

Used by ``test_golden.py`` and ``test_binding.py``. Every number the tests assert is derived by
hand (in comments there) from DESIGN.md §1 and ``envs/cost_model.py``'s module docstring, never by
calling the code under test.

Pass times (seconds) are multilinear in ``(b, q, c)``, so the ``table`` profile's trilinear
interpolation / linear extrapolation over a 2x2x2 grid reproduces them exactly everywhere:

* ``tau_L(b, q, c) = 0.010 + 0.001 b q + 0.0001 b c``
* ``tau_S(b, q, c) = 0.002 + 0.0002 b q + 0.00002 b c``

Memory (bytes):

* KV per token is ``2 (K and V) * layers * kv_heads * head_dim * dtype_bytes``:
  ``kv_L = 2 * 2 * 1 * 250 * 2 = 2000``; ``kv_S = 2 * 1 * 1 * 250 * 2 = 1000``; an SD user holds
  both: ``kv_SD = 3000``.
* ``W_L = 1e6 params * 2 bytes = 2_000_000``; ``W_S = 1e4 * 2 = 20_000``.
* ``Q = 2_300_000``, reserve ``100_000``: budget ``Q - reserve - W_L = 200_000`` without SD and
  ``200_000 - 20_000 = 180_000`` with SD.
"""

from __future__ import annotations

import numpy as np

from envs.cost_model import CostModel
from envs.profile import Profile
from envs.workload import Round

Q_BYTES = 2_300_000.0
RESERVE_BYTES = 100_000.0
W_L = 2_000_000.0
W_S = 20_000.0
KV_L = 2000.0
KV_SD = 3000.0


def tau_l(b: float, q: float, c: float) -> float:
    return 0.010 + 0.001 * b * q + 0.0001 * b * c


def tau_s(b: float, q: float, c: float) -> float:
    return 0.002 + 0.0002 * b * q + 0.00002 * b * c


def _grid(fn) -> dict:
    axis = [1.0, 2.0]
    tau = [[[fn(b, q, c) for c in axis] for q in axis] for b in axis]
    return {"b": axis, "q": axis, "c": axis, "tau_s": tau}


def _model(name: str, params: float, layers: int) -> dict:
    return {"name": name, "params": params, "layers": layers, "hidden": 500, "ffn_hidden": 1000, "heads": 2,
            "kv_heads": 1, "head_dim": 250, "vocab": 100, "dtype_bytes": 2}


def profile_dict(memory_bytes: float = Q_BYTES, engine: dict | None = None) -> dict:
    d = {
        "name": "golden",
        "device": {"name": "golden", "memory_bytes": memory_bytes, "bandwidth_bytes_per_s": 1e12, "flops_per_s": 1e15,
                   "reserve_bytes": RESERVE_BYTES},
        "llm": _model("llm", 1e6, 2),
        "slm": _model("slm", 1e4, 1),
        "latency": {"source": "table", "llm": _grid(tau_l), "slm": _grid(tau_s)},
    }
    if engine is not None:
        d["engine"] = engine
    return d


def golden_cost(memory_bytes: float = Q_BYTES, kv_memory: str = "per_user", engine: dict | None = None) -> CostModel:
    return CostModel(Profile.from_dict(profile_dict(memory_bytes, engine)), kv_memory)


def make_round(input_tokens, output_tokens, deadline_s, alpha, uplink_s, downlink_s) -> Round:
    """A round with explicit link times (no channel model) and realised = predicted."""
    o = np.asarray(output_tokens, dtype=np.int64)
    down = np.asarray(downlink_s, dtype=float)
    a = np.asarray(alpha, dtype=float)
    return Round(
        input_tokens=np.asarray(input_tokens, dtype=np.int64),
        output_tokens=o,
        deadline_s=np.asarray(deadline_s, dtype=float),
        alpha=a,
        distance_m=np.full(len(o), 100.0),
        uplink_s=np.asarray(uplink_s, dtype=float),
        downlink_s=down,
        realized_output_tokens=o.copy(),
        realized_alpha=a.copy(),
        realized_downlink_s=down.copy(),
    )


def three_users() -> Round:
    """Users 0 and 1 are loose (AD is fine), user 2 is tight (only SD, alone, is fast enough).

    Every user: ``I = 10``, ``O = 10``, ``alpha = 0.9``, downlink 0.01 s.
    Uplinks 0.01, 0.02, 0.005 s; deadlines 1.03, 1.03, 0.145 s, so slacks ``T - t_d`` are 1.02,
    1.02, 0.135 s and the budgets are ``beta_A({0,1}) = 1.02 - 0.02 = 1.0`` s and
    ``beta_S({2}) = 0.135 - 0.005 = 0.13`` s.
    """
    return make_round([10, 10, 10], [10, 10, 10], [1.03, 1.03, 0.145], [0.9, 0.9, 0.9], [0.01, 0.02, 0.005], [0.01, 0.01, 0.01])
