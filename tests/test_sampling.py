"""Per-row sampling (runtime.sampling) in the AD and SD engines: exact SD at each row's own
temperature / top-p, greedy rows unchanged beside sampled ones, seeded rows reproducible."""

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from tiny_models import tiny, tiny_trio

from runtime.engines import generate_ad, generate_sd
from runtime.sampling import RowSampler, inverse_cdf, nucleus


@pytest.fixture(scope="module")
def models():
    return tiny_trio()


# ------------------------------------------------------------------------------ the pieces
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12), st.floats(0.01, 1.0))
def test_nucleus_keeps_the_smallest_most_likely_set(weights, top_p):
    w = np.asarray(weights) + 1e-3
    p = torch.tensor(w / w.sum(), dtype=torch.float64)
    kept = nucleus(p[None], torch.tensor([[top_p]], dtype=torch.float64))[0].numpy()
    assert kept.sum() == pytest.approx(1.0)
    order = np.argsort(-p.numpy(), kind="stable")
    mass = np.cumsum(p.numpy()[order])
    size = 1 + int(np.searchsorted(mass, top_p - 1e-12))  # smallest prefix reaching top_p
    size = len(p) if top_p >= 1 else min(size, len(p))
    assert (kept > 0).sum() == size
    assert np.allclose(kept[kept > 0], p.numpy()[kept > 0] / p.numpy()[kept > 0].sum())
    if size < len(p):  # what is kept is at least as likely as anything cut
        assert p.numpy()[kept > 0].min() >= p.numpy()[kept == 0].max() - 1e-15


def test_inverse_cdf_never_draws_a_zero_probability_token():
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 5, dtype=torch.float64)
    u = torch.tensor([0.0, 0.25, 0.5, 0.75, 1 - 2**-53], dtype=torch.float64)
    assert inverse_cdf(p, u).tolist() == [1, 1, 3, 3, 3]


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(temperature=[1.0]), "temperature has 1 values for 2"), (dict(seed=[1, 2, 3]), "seed has 3 values"),
])
def test_bad_sampling_arguments_are_named(kwargs, words):
    with pytest.raises(ValueError, match=words):
        RowSampler(2, **kwargs)


# ------------------------------------------------------------------------------ the engines
def joint_law(model, prompt: list[int], temperature: float, top_p: float, v: int) -> np.ndarray:
    """The exact law of the first two tokens under the processed target distribution, [v, v]."""
    s = RowSampler(1, temperature, top_p, device="cpu")
    with torch.no_grad():
        p1 = s.probs(model(torch.tensor([prompt])).logits[:, -1])[0]  # [v]
        p2 = torch.stack([s.probs(model(torch.tensor([prompt + [a]])).logits[:, -1])[0] for a in range(v)])  # [v (first), v (second)]
    return (p1[:, None] * p2).numpy()


def chi_square_p(counts: np.ndarray, law: np.ndarray) -> float:
    """p-value of the counts under the law; cells of zero probability must be empty, small cells pooled."""
    n = counts.sum()
    assert counts[law == 0].sum() == 0, "a token outside the nucleus was produced"
    obs, exp = counts[law > 0], law[law > 0] * n
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return float(stats.chisquare(obs, exp).pvalue)


def test_sd_with_per_row_temperature_and_top_p_matches_the_target():
    """Rows of three settings (two sampled, one greedy) in one batch; the first two tokens of each
    sampled setting follow its own processed target law (chi-square on the joint), and the same
    test refuses the draft's law (it has the power to see a wrong distribution)."""
    v, n = 6, 2500
    target, draft = tiny(1, 16, vocab=v, seed=3), tiny(1, 16, vocab=v, seed=4)
    with torch.no_grad():  # a random tiny model's next-token law is nearly flat: sharpen it, so temperature matters
        target.lm_head.weight.mul_(10)
        draft.lm_head.weight.mul_(10)
    prompt = [1, 2, 3]
    settings_ = [(0.6, 0.8), (1.6, 1.0), (0.0, 1.0)]  # (temperature, top_p)
    rows = [settings_[i % 3] for i in range(3 * n)]
    sd = generate_sd(target, draft, [prompt] * len(rows), 3, 2, temperature=[t for t, _ in rows], top_p=[q for _, q in rows], seed=11)
    greedy = generate_ad(target, [prompt], 2).tokens[0]
    assert all(t[:2] == greedy for t in sd.tokens[2::3])
    laws = {k: joint_law(target, prompt, temp, top_p, v) for k, (temp, top_p) in enumerate(settings_[:2])}
    for k, law in laws.items():
        counts = np.zeros((v, v))
        for a, b in (t[:2] for t in sd.tokens[k::3]):
            counts[a, b] += 1
        assert chi_square_p(counts, law) > 1e-3, settings_[k]
        # power: the same test refuses the other row setting's law (one temperature for the whole batch would fail here)
        other = laws[1 - k]
        assert stats.chisquare(counts.ravel() + 0.5, other.ravel() * n + 0.5).pvalue < 1e-3
    # and the draft's law at the first setting (SD that kept the draft's tokens would fail here)
    counts = np.zeros((v, v))
    for a, b in (t[:2] for t in sd.tokens[0::3]):
        counts[a, b] += 1
    wrong = joint_law(draft, prompt, *settings_[0], v)
    assert stats.chisquare(counts.ravel() + 0.5, wrong.ravel() * n + 0.5).pvalue < 1e-3
    assert 0 < sd.alpha_hat < 1  # rejections and residual draws were exercised


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_rows_are_unchanged_beside_sampled_rows(models, gamma):
    target, close, far = models
    rng = random.Random(gamma)
    prompts = [[rng.randrange(1, 40) for _ in range(rng.randint(1, 12))] for _ in range(6)]
    limits = [rng.randint(3, 20) for _ in prompts]
    temps = [0.0, 1.0, 0.0, 0.5, 0.0, 1.4]
    tops = [1.0, 0.9, 1.0, 1.0, 1.0, 0.5]
    greedy_ad = generate_ad(target, prompts, limits).tokens
    mixed_ad = generate_ad(target, prompts, limits, temperature=temps, top_p=tops, seed=5).tokens
    for draft in (close, far):
        plain = generate_sd(target, draft, prompts, gamma, limits).tokens
        mixed = generate_sd(target, draft, prompts, gamma, limits, temperature=temps, top_p=tops, seed=5).tokens
        for i, t in enumerate(temps):
            if t == 0:
                assert mixed[i] == plain[i] == greedy_ad[i] == mixed_ad[i]
    # the sampled rows did sample (not the greedy text), so the comparison above is not vacuous
    assert any(mixed_ad[i] != greedy_ad[i] for i, t in enumerate(temps) if t > 0)


def test_a_seeded_row_is_reproducible_whatever_its_neighbours(models):
    target, close, _ = models
    prompt = [3, 9, 27]
    for run in (lambda ps, **kw: generate_ad(target, ps, 16, **kw), lambda ps, **kw: generate_sd(target, close, ps, 3, 16, **kw)):
        alone = run([prompt], temperature=1.0, seed=[42]).tokens[0]
        again = run([prompt], temperature=1.0, seed=[42]).tokens[0]
        beside = run([[5, 6], prompt, [7] * 9], temperature=[0.0, 1.0, 0.8], top_p=[1.0, 1.0, 0.7], seed=[1, 42, 2]).tokens[1]
        other = run([prompt], temperature=1.0, seed=[43]).tokens[0]
        assert alone == again == beside
        assert other != alone
