"""CostModel's one-point batch times as single calls that remember their passes: the memo misses of
``envs.split_builder.SplitScalarPlan`` (issue #13).

The scalar builder memoises each batch's times by their exact arguments; under random play most
AD and SD lookups still miss (a new longest input or output makes a new key), so a miss's price
shows in the step. For a cost model that keeps :class:`~envs.cost_model.CostModel`'s own methods
and has none of their optional terms (engine overhead, separate verify compute), the functions here
return one call per time that runs the same operations on the same arguments as the method -- so
the same float -- calling the latency model's passes directly and remembering the parts that depend
on fewer arguments than the time: the prefill passes per ``(b, S)``, an SD iteration per ``(b, c, g)``
(``c`` the mean context), the decode sums' table entries per ``(b, c)``. The caller owns the dicts
(the plan empties them with its other memos). Any other model gets its method back.
``tests/test_env_v1_speed_paths.py`` holds them to CostModel's methods bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

from envs.cost_model import CostModel
from envs.latency import LatencyModel


def ad_time_of(cost: CostModel, prefills: dict, decode_sums: dict) -> Callable[[int, int, int], float]:
    """``cost.ad_time1`` for a non-empty batch as one call: its prefill pass, remembered, plus the
    decode passes' sum (``max`` written as its comparison); any other model's method as it is.

    ``LatencyModel.decode_sum1(b, S, n)`` is ``table[S + n] - table[S]`` of a prefix-sum table whose
    entry ``table[c]`` is ``decode_sum1(b, 0, c)`` (``table[0]`` is 0; a grown table keeps its
    entries), so the entries are remembered per ``(b, c)`` and subtracted here: the same float."""
    if getattr(type(cost), "ad_time1", None) is not CostModel.ad_time1 or cost.engine is not None:
        return cost.ad_time1
    tau1, decode_sum1 = cost.tau_l.tau1, cost.tau_l.decode_sum1
    own_table = getattr(type(cost.tau_l), "decode_sum1", None) is LatencyModel.decode_sum1

    def ad_time1(b: int, s_max: int, n_max: int) -> float:
        s = 1 if 1 > s_max else s_max  # max(s_max, 1)
        key = (b, s)
        prefill = prefills.get(key)
        if prefill is None:
            prefill = prefills[key] = tau1(b, s, s)
        n = n_max - 1
        n = 0 if 0 > n else n  # max(n_max - 1, 0)
        if not own_table:
            return prefill + decode_sum1(b, s, n)
        low = decode_sums.get(key)
        if low is None:
            low = decode_sums[key] = decode_sum1(b, 0, s)
        high = decode_sums.get((b, s + n))
        if high is None:
            high = decode_sums[(b, s + n)] = decode_sum1(b, 0, s + n)
        return prefill + (high - low)

    return ad_time1


def sd_parts_of(cost: CostModel, prefills: dict, iterations: dict) -> Callable[[int, int, int, int], tuple[float, float]] | None:
    """``cost.sd_parts1`` (prefill, one iteration at depth ``gamma``) as one call, the prefill
    remembered per ``(b, S)`` and the iteration per ``(b, c, gamma)`` (it depends on S and N through
    the mean context ``c`` alone); any other model's method as it is (None without one)."""
    if not _own_sd_parts(cost):
        return getattr(cost, "sd_parts1", None)
    tau_l1, tau_s1 = cost.tau_l.tau1, cost.tau_s.tau1

    def sd_parts1(b: int, s_max: int, n_max: int, gamma: int) -> tuple[float, float]:
        s = float(s_max)
        s = 1.0 if 1.0 > s else s  # max(float(s_max), 1.0)
        key = (b, s_max)
        prefill = prefills.get(key)
        if prefill is None:
            prefill = prefills[key] = tau_l1(b, s, s) + tau_s1(b, s, s)
        c = s + float(n_max) / 2.0
        key = (b, c, gamma)
        iteration = iterations.get(key)
        if iteration is None:
            g = float(gamma)
            iteration = iterations[key] = g * tau_s1(b, 1.0, c) + tau_l1(b, g + 1.0, c + g)
        return prefill, iteration

    return sd_parts1


def _own_sd_parts(cost: CostModel) -> bool:
    """Whether ``cost`` prices SD's parts by CostModel's own methods, with none of their optional
    terms (:meth:`CostModel.sd_parts_are_plain`; False for a model that is not a CostModel)."""
    plain = getattr(cost, "sd_parts_are_plain", None)
    return plain is not None and plain()


def sd_parts_all_of(cost: CostModel, prefills: dict) -> Callable[[int, int, int, int], tuple[float, ...]] | None:
    """``cost.sd_parts_all1`` (prefill, one iteration at each depth 1..G) as one call, the prefill
    remembered with :func:`sd_parts_of`'s (the same passes); any other model's method as it is."""
    if not _own_sd_parts(cost):
        return getattr(cost, "sd_parts_all1", None)
    tau_l1, tau_s1 = cost.tau_l.tau1, cost.tau_s.tau1

    def sd_parts_all1(b: int, s_max: int, n_max: int, g_max: int) -> tuple[float, ...]:
        s = float(s_max)
        s = 1.0 if 1.0 > s else s  # max(float(s_max), 1.0)
        c = s + float(n_max) / 2.0
        draft = tau_s1(b, 1.0, c)
        key = (b, s_max)
        prefill = prefills.get(key)
        if prefill is None:
            prefill = prefills[key] = tau_l1(b, s, s) + tau_s1(b, s, s)
        return (prefill, *[float(g) * draft + tau_l1(b, float(g) + 1.0, c + float(g)) for g in range(1, g_max + 1)])

    return sd_parts_all1
