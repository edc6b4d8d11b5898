"""Validation of profile fields: each error names the field (``where`` + key) and what is allowed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class ProfileError(ValueError):
    """A profile file or dict is malformed; the message names the field and the allowed values."""


def require_field(d: dict, key: str, where: str) -> Any:
    """``d[key]``, or a :class:`ProfileError` naming ``where + key`` if it is missing."""
    if not isinstance(d, dict) or key not in d:
        raise ProfileError(f"profile field '{where}{key}' is missing")
    return d[key]


def refuse_unknown(d: dict, known: tuple[str, ...], where: str) -> None:
    """A :class:`ProfileError` naming any key of ``d`` not in ``known``: a misspelled optional key
    (``request_overhed_bytes``) would otherwise be dropped and its field left at its default."""
    unknown = sorted(str(k) for k in d if k not in known) if isinstance(d, dict) else []
    if unknown:
        section = f"section '{where.rstrip('.')}'" if where else "a profile's top level"
        raise ProfileError(f"unknown profile field(s) {[where + k for k in unknown]}; {section} knows {sorted(known)}")


def positive_field(d: dict, key: str, where: str, *, integer: bool = False, allow_zero: bool = False) -> float:
    """``d[key]`` as a finite number > 0 (>= 0 with ``allow_zero``; an int with ``integer``), else a :class:`ProfileError`."""
    value = require_field(d, key, where)
    if isinstance(value, bool):  # YAML's true is an int to Python, never a count or a size
        raise ProfileError(f"profile field '{where}{key}' must be a number, got {value!r}")
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise ProfileError(f"profile field '{where}{key}' must be a number, got {value!r}") from None
    ok = num >= 0 if allow_zero else num > 0
    if not ok or not math.isfinite(num):
        bound = ">= 0" if allow_zero else "> 0"
        raise ProfileError(f"profile field '{where}{key}' must be {bound}, got {value!r}")
    if integer:
        if num != int(num):
            raise ProfileError(f"profile field '{where}{key}' must be an integer, got {value!r}")
        return int(num)
    return num


def axis_field(d: dict, key: str, where: str) -> np.ndarray:
    """A grid axis: a non-empty, strictly increasing list of positive finite numbers."""
    value = require_field(d, key, where)
    msg = f"profile field '{where}{key}' must be a non-empty, strictly increasing list of positive finite numbers, got {value!r}"
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ProfileError(msg) from None
    # NaN compares false with everything, so it must be refused explicitly, not by the order test
    if arr.ndim != 1 or len(arr) == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0) or np.any(np.diff(arr) <= 0):
        raise ProfileError(msg)
    return arr
