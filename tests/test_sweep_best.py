"""experiments.sweep_best: which fixed depth of a live sweep is best, by a paired bootstrap over the
texts the runs generated (hand-made sweeps whose answer is known)."""

import numpy as np
import pandas as pd
import pytest

from experiments.sweep_best import near_any, paired_best, paired_ratio, per_text


def _texts(itl: dict[int, list[float]], seed: int = 0, rtt: float = 5.0) -> pd.DataFrame:
    """One row per text (client i, request 0) and depth; ``itl[d][i]``: text i's ITL at depth d."""
    return pd.DataFrame([{"rtt_ms": rtt, "depth": d, "seed": seed, "client": i, "request": 0, "itl_ms": x}
                         for d, xs in itl.items() for i, x in enumerate(xs)])


def test_per_text_averages_a_text_measured_twice_and_drops_texts_some_depth_lacks():
    twice = pd.concat([_texts({1: [10.0, 20.0], 2: [12.0, 22.0]}), _texts({1: [12.0], 2: [14.0]})])  # text (0, 0, 0) twice
    table = per_text(twice)
    assert table.loc[(0, 0, 0)].tolist() == [11.0, 13.0] and table.loc[(0, 1, 0)].tolist() == [20.0, 22.0]
    unfinished = _texts({1: [10.0, 20.0], 2: [12.0, np.nan]})  # text 1 has no ITL at depth 2
    assert per_text(unfinished).index.tolist() == [(0, 0, 0)]


def test_per_text_names_the_missing_columns():
    with pytest.raises(ValueError, match="seed"):
        per_text(_texts({1: [10.0]}).drop(columns=["seed"]))


def test_pairing_finds_a_consistent_difference_that_the_texts_spread_hides():
    # texts differ by up to 100 %, but depth 3 is 0.5 ms faster than depth 2 on every text: the
    # runs' means overlap widely, the paired difference does not reach 0
    rng = np.random.default_rng(1)
    base = list(rng.uniform(10.0, 20.0, size=24))
    found = paired_best(_texts({2: [b + 0.5 for b in base], 3: base, 4: [b + 3.0 for b in base]}))
    assert found.best == 3 and found.tied == [3] and found.texts == 24
    assert found.p_best[3] == 1.0 and found.best_itl_ms == pytest.approx(np.mean(base))


def test_depths_the_texts_cannot_tell_apart_are_tied():
    rng = np.random.default_rng(2)
    base = rng.uniform(10.0, 20.0, size=12)
    noise = rng.normal(0.0, 1.0, size=(3, 12))  # per-text noise far larger than the 0.05 ms between depths 5 and 6
    found = paired_best(_texts({5: list(base + noise[0]), 6: list(base + 0.05 + noise[1]), 7: list(base + 8.0 + noise[2])}))
    assert set(found.tied) == {5, 6} and found.best in (5, 6)
    assert 0.0 < found.p_best[5] < 1.0 and found.p_best[7] == 0.0 and sum(found.p_best.values()) == pytest.approx(1.0)


def test_a_sweep_with_no_text_served_at_every_depth_is_refused():
    with pytest.raises(ValueError, match="every depth"):
        paired_best(_texts({1: [10.0, np.nan], 2: [np.nan, 12.0]}))


def test_paired_ratio_is_the_ratio_of_the_means_over_the_shared_texts():
    auto = _texts({0: [11.0, 22.0, 33.0]}).assign(depth="auto")
    best = _texts({4: [10.0, 20.0, 30.0, 40.0]})  # text 3 has no auto run: left out
    ratio, low, high, texts = paired_ratio(auto, best)
    assert texts == 3 and ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)
    noisy = _texts({0: [11.0, 18.0, 36.0]}).assign(depth="auto")
    ratio, low, high, _ = paired_ratio(noisy, best)
    assert low < ratio < high and ratio == pytest.approx(65.0 / 60.0)
    assert np.isnan(paired_ratio(auto.assign(seed=9), best)[0])  # no shared text


def test_near_any():
    assert near_any(4, [2, 6], 1) is False and near_any(5, [2, 6], 1) and not near_any(3, [], 1)


def _host_drift_sweep() -> pd.DataFrame:
    """Four seeds (repeats) of 8 texts at depths 2 and 3. Within a seed depth 3 beats depth 2 by the
    same margin on every text, but that margin is the two runs' host speeds: +1.5 ms in three
    repeats, -1.0 ms in the fourth."""
    rng = np.random.default_rng(3)
    parts = []
    for seed, host in enumerate((1.5, 1.5, 1.5, -1.0)):
        base = list(rng.uniform(10.0, 20.0, size=8))
        parts.append(_texts({2: [b + host for b in base], 3: base}, seed=seed))
    return pd.concat(parts)


def test_the_seed_stage_widens_the_interval_when_the_runs_host_speed_differs():
    """Texts-only, every text says depth 3 wins (no tie); resampling the seeds first sees that one
    repeat in four says the opposite, and the interval reaches 0 (tied)."""
    sweep = _host_drift_sweep()
    texts_only = paired_best(sweep, clusters=None)
    by_seed = paired_best(sweep)  # the default: clusters="seed"
    assert texts_only.best == by_seed.best == 3
    assert texts_only.tied == [3] and by_seed.tied == [2, 3]
    assert by_seed.p_best[2] > 0.0 == texts_only.p_best[2]
    _, low, high, _ = paired_ratio(sweep[sweep.depth == 2], sweep[sweep.depth == 3], clusters=None)
    _, low_seed, high_seed, _ = paired_ratio(sweep[sweep.depth == 2], sweep[sweep.depth == 3])
    assert low_seed < low and high_seed >= high and low_seed < 1.0 < low  # only the seed stage admits no gain


def test_with_one_seed_the_two_stage_bootstrap_is_the_texts_bootstrap():
    rng = np.random.default_rng(4)
    base = rng.uniform(10.0, 20.0, size=12)
    sweep = _texts({1: list(base + rng.normal(0, 1, 12)), 2: list(base + 0.3 + rng.normal(0, 1, 12))})
    assert paired_best(sweep) == paired_best(sweep, clusters=None)


def test_an_unknown_cluster_column_is_refused():
    with pytest.raises(ValueError, match="clusters"):
        paired_best(_texts({1: [10.0], 2: [11.0]}), clusters="repeat")
