"""Runtime I: engines (lossless greedy and sampling SD), the project's pair, the profiler."""

import copy
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from tiny_models import tiny, tiny_trio

from runtime.engines import generate_ad, generate_sd

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def models():
    return tiny_trio()


@pytest.mark.parametrize("seed", range(6))
def test_greedy_sd_equals_greedy_ad(models, seed):
    target, close, far = models
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 40) for _ in range(rng.randint(1, 14))] for _ in range(rng.randint(1, 6))]
    limits = [rng.randint(1, 25) for _ in prompts]
    ad = generate_ad(target, prompts, limits)
    for draft in (close, far):
        for gamma in (1, 2, 3, 5, 8):
            sd = generate_sd(target, draft, prompts, gamma, limits)
            assert sd.tokens == ad.tokens, (seed, gamma)
            assert [len(t) for t in sd.tokens] == limits


def test_batched_equals_one_at_a_time(models):
    target, close, _ = models
    prompts = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13]]
    batched = generate_sd(target, close, prompts, 3, 15).tokens
    assert batched == [generate_sd(target, close, [p], 3, 15).tokens[0] for p in prompts]


def test_identical_draft_accepts_everything(models):
    target, _, _ = models
    sd = generate_sd(target, target, [[1, 2, 3]], 4, 30)
    assert sd.alpha_hat == 1.0 and sd.tokens_per_iteration > 4


def test_eos_stops_a_row(models):
    target, close, _ = models
    free = generate_ad(target, [[3, 4, 5]], 20).tokens[0]
    eos = free[5]
    for res in (generate_ad(target, [[3, 4, 5]], 20, eos_id=eos), generate_sd(target, close, [[3, 4, 5]], 3, 20, eos_id=eos)):
        assert res.tokens[0] == free[: free.index(eos) + 1]


def test_sampling_sd_matches_target_distribution():
    """Chi-square on the joint law of the first two tokens, vocabulary of 6."""
    v = 6
    target, draft = tiny(1, 16, vocab=v, seed=3), tiny(1, 16, vocab=v, seed=4)
    prompt, n = [1, 2, 3], 4000
    sd = generate_sd(target, draft, [prompt] * n, 3, 2, temperature=1.0, seed=0)
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1], -1)
        joint = np.stack([(p1[a] * torch.softmax(target(torch.tensor([prompt + [a]])).logits[0, -1], -1)).numpy() for a in range(v)])
    counts = np.zeros((v, v))
    for a, b in (t[:2] for t in sd.tokens):
        counts[a, b] += 1
    assert stats.chisquare(counts.ravel(), joint.ravel() * n).pvalue > 1e-3
    # and a draft that disagrees a lot is still exact (the residual path is exercised)
    assert 0 < sd.alpha_hat < 1


def test_bad_arguments(models):
    target, close, _ = models
    with pytest.raises(ValueError, match="gamma"):
        generate_sd(target, close, [[1]], 0, 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_ad(target, [[1]], 0)
    with pytest.raises(ValueError, match="at least one token"):
        generate_ad(target, [[]], 3)


@pytest.fixture(scope="module")
def built_pair(tmp_path_factory):
    from runtime.pair import build_pair

    return build_pair(tmp_path_factory.mktemp("pair") / "tiny", "tiny", progress=False)


def test_build_and_load_pair(built_pair):
    import json

    from runtime.pair import build_pair, load_pair

    meta = json.loads((built_pair / "pair.json").read_text())
    assert meta["draft_params"] < meta["target_params"]
    assert set(meta["greedy_acceptance"]) == {"code", "prose"}
    pair = load_pair(built_pair)
    ids = pair.tokenizer.encode("def f(x):")
    assert generate_sd(pair.target, pair.draft, [ids], 3, 12).tokens == generate_ad(pair.target, [ids], 12).tokens
    assert build_pair(built_pair, "tiny", progress=False) == built_pair  # cached: no retraining
    # the CLI copies the record (e.g. to results/pair.json), atomically, from the cache
    from runtime.pair import main

    record = built_pair.parent / "results" / "pair.json"
    main(["build", "--preset", "tiny", "--out", str(built_pair), "--meta-out", str(record)])
    copied = json.loads(record.read_text())
    assert copied["recipe_digest"] == meta["recipe_digest"] and copied["recipe"]["max_target_bits_per_byte"] == 4.8
    assert [p.name for p in record.parent.iterdir()] == ["pair.json"]


def test_tokenizer_mismatch_is_refused(built_pair, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from runtime.pair import load_pair

    raw = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    other = tmp_path / "draft"
    load_pair(built_pair).draft.save_pretrained(other)
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(other)
    with pytest.raises(ValueError, match="tokenizers differ"):
        load_pair(built_pair / "target", other)


def test_profiler_writes_a_profile_the_env_runs_on(built_pair, tmp_path):
    import gymnasium as gym

    import envs
    from envs import load_profile

    out = tmp_path / "cpu_pair.yaml"
    res = subprocess.run([sys.executable, "-m", "runtime.profile", "--pair", str(built_pair), "--b", "1,2", "--q", "1,4", "--c", "8,32", "--repeats", "1", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    prof = load_profile(out)
    assert prof.latency_source == "table" and prof.llm.params > prof.slm.params
    assert prof.engine is not None and list(prof.engine.b) == [1, 2] and (prof.engine.ad_step_s >= 0).all()
    env = gym.make(envs.ENV_ID, num_users=5, profile=str(out))
    env.reset(seed=0)
    env.step(1)
    # --engine-only refreshes that section and keeps the measured table
    table = out.read_text().split("engine:")[0]
    res = subprocess.run([sys.executable, "-m", "runtime.profile", "--pair", str(built_pair), "--b", "3", "--repeats", "1", "--engine-only", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert out.read_text().split("engine:")[0] == table and list(load_profile(out).engine.b) == [3]
    from runtime import profile as profile_mod

    with pytest.raises(SystemExit, match="needs an existing profile"):  # refused before the pair is loaded: in process
        profile_mod.main(["--pair", str(built_pair), "--engine-only", "--out", str(tmp_path / "none.yaml")])
    # it says where it was measured, and --quick writes a calibrated copy that says where it was calibrated
    import json

    recipe = json.loads((built_pair / "pair.json").read_text())["recipe_digest"]
    on = load_profile(out).measured_on
    assert on["pair_recipe"] == recipe and on["dtype"] == "float32" and on["cores"] >= 1 and on["torch"] == torch.__version__
    # --no-engine: the base's engine section is kept (the engine measured after the calibration is
    # checked in process below, with the measurement stubbed; for real it would add ~15 s)
    quick = tmp_path / "quick" / "here.yaml"
    res = subprocess.run([sys.executable, "-m", "runtime.profile", "--pair", str(built_pair), "--quick", "--no-engine", "--base", str(out), "--repeats", "1", "--threads", "1",
                          "--out", str(quick)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    cal = load_profile(quick)
    assert cal.calibration is not None and cal.provenance()["threads"] == 1 and cal.name == "here"
    assert cal.latency_source == "table" and list(cal.tau_llm.base.b_grid) == [1, 2]  # the table itself is kept
    assert list(cal.engine.b) == [3] and "engine overhead" not in res.stdout  # and, with --no-engine, the base's engine section
    assert not list(quick.parent.glob(".*"))  # no temporary file left beside it


def test_quick_profile_measures_the_engine_against_its_new_calibration(built_pair, tmp_path, monkeypatch, capsys):
    """``--quick`` without ``--no-engine``: the engine section is measured once, against the
    profile holding the calibration just made (stubbed here: the measurement itself is
    test_machine_profile.py's), written, and printed; the table-profile engine pass does not run."""
    import yaml

    from envs import load_profile
    from runtime import profile as profile_mod

    base = tmp_path / "base.yaml"
    profile_mod.main(["--pair", str(built_pair), "--b", "1,2", "--q", "1,4", "--c", "8,32", "--repeats", "1", "--no-engine", "--out", str(base)])
    assert "engine" not in yaml.safe_load(base.read_text())
    section = {"measured_on": {"cpu_model": "here"}, "llm": {"q": [1, 4], "scale": [2.0, 3.0]}, "slm": {"q": [1, 4], "scale": [1.5, 1.5]}, "notes": "stub"}
    seen: list[dict] = []

    def fake_engine(pair, profile):
        seen.append(profile)
        return {"b": [1, 2], "ad_step_s": [0.004, 0.005], "sd_iteration_s": [0.001, 0.002], "sd_draft_step_s": [0.0, 0.0]}

    def no_second_pass(*args, **kwargs):
        raise AssertionError("the table profile's engine pass ran after --quick")

    monkeypatch.setattr(profile_mod, "quick_calibration", lambda *a, **k: section)
    monkeypatch.setattr(profile_mod, "quick_engine", fake_engine)
    monkeypatch.setattr(profile_mod, "measure_engine", no_second_pass)
    out = tmp_path / "quick.yaml"
    profile_mod.main(["--pair", str(built_pair), "--quick", "--base", str(base), "--out", str(out)])
    assert len(seen) == 1 and seen[0]["calibration"] == section  # measured against the new calibration
    written = load_profile(out)
    assert list(written.engine.ad_step_s) == [0.004, 0.005] and written.calibration is not None
    printed = capsys.readouterr().out
    assert "engine overhead per b [1, 2]: AD step 4.00, 5.00 ms" in printed and "llm: scale 2.00 at q 1, 3.00 at q 4" in printed


def test_generate_cli_streams(built_pair):
    res = subprocess.run([sys.executable, "-m", "runtime.generate", "--pair", str(built_pair), "--prompt", "import os", "--max-new-tokens", "10"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "=== AD ===" in res.stdout and "=== SD ===" in res.stdout and "outputs identical: True" in res.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_greedy_equivalence(models):
    target, close, _ = models
    t, d = copy.deepcopy(target).to("cuda").float(), copy.deepcopy(close).to("cuda").float()
    prompts = [[1, 2, 3], [4, 5]]
    assert generate_sd(t, d, prompts, 3, 10).tokens == generate_ad(t, prompts, 10).tokens


# ---------------------------------------------------------------- the pair: steps, determinism, quality, atomic cache
def micro_recipe(**changes):
    """Seconds to build: for the properties of the build itself, not for decoding quality."""
    from runtime.pair import ModelShape, PairRecipe

    base = dict(target=ModelShape(32, 1, 2, 1, 64), draft=ModelShape(16, 1, 2, 1, 32), seq_len=64, batch=4, target_steps=6, draft_steps=4, max_files=6)
    return PairRecipe(**{**base, **changes})


def test_same_recipe_builds_bitwise_identical_weights(tmp_path):
    import json

    from runtime.pair import build_pair, load_pair

    torch.manual_seed(1234)
    caller_state = torch.random.get_rng_state()
    a = load_pair(build_pair(tmp_path / "a", micro_recipe(), progress=False))
    assert torch.equal(torch.random.get_rng_state(), caller_state)  # the build does not disturb the caller's RNG
    b = load_pair(build_pair(tmp_path / "b", micro_recipe(), progress=False))
    for name in ("target", "draft"):
        sa, sb = getattr(a, name).state_dict(), getattr(b, name).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), name
    meta = json.loads((tmp_path / "a" / "pair.json").read_text())
    assert meta["target_steps"] == 6 and meta["draft_steps"] == 4 and meta["recipe"]["threads"] == 1
    # and a different seed is a different pair: the comparison above can fail
    c = load_pair(build_pair(tmp_path / "c", micro_recipe(seed=1), progress=False))
    assert not torch.equal(a.target.state_dict()["model.embed_tokens.weight"], c.target.state_dict()["model.embed_tokens.weight"])


def test_cache_key_is_the_step_bounded_recipe():
    from runtime.pair import PRESETS

    r = micro_recipe()
    assert micro_recipe(target_steps=7).digest() != r.digest() and micro_recipe(draft_steps=5).digest() != r.digest()
    assert micro_recipe(threads=2).digest() != r.digest() and micro_recipe(seed=3).digest() != r.digest()
    assert micro_recipe(max_target_bits_per_byte=3.0).digest() == r.digest()  # the bound does not change the weights
    assert PRESETS["full"].target_steps >= 300 and "target_seconds" not in PRESETS["full"].__dataclass_fields__


@pytest.mark.parametrize(("field", "value"), [("target_steps", 0), ("draft_steps", -1), ("threads", 0), ("batch", 2.5), ("target_lr", 0.0), ("max_draft_bits_per_byte", float("nan")), ("max_files", 1)])
def test_bad_recipe_named(field, value):
    with pytest.raises(ValueError, match=f"'{field}'"):
        micro_recipe(**{field: value})


def test_pair_missing_its_bound_is_refused_not_cached(tmp_path):
    from runtime.pair import PairQualityError, build_pair

    out = tmp_path / "cache" / "pair-x"
    with pytest.raises(PairQualityError, match=r"target .* bits/byte > bound 0.5.*nothing was cached"):
        build_pair(out, micro_recipe(max_target_bits_per_byte=0.5), progress=False)
    assert not out.exists() and list((tmp_path / "cache").iterdir()) == []


def test_failed_build_leaves_nothing_and_stale_partials_are_swept(tmp_path, monkeypatch):
    from runtime import pair as pair_mod

    cache = tmp_path / "cache"
    cache.mkdir()
    out = cache / "pair-y"
    stale = cache / f".{out.name}.999999999.partial"  # a killed build's leftovers (no such pid)
    (stale / "target").mkdir(parents=True)

    def broken_save(self, folder):
        raise OSError("disk full")

    monkeypatch.setattr(pair_mod.ByteTokenizer, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        pair_mod.build_pair(out, micro_recipe(), progress=False)
    assert list(cache.iterdir()) == []  # neither the pair nor any partial folder


def test_cached_pair_is_rechecked_against_a_tightened_bound(tmp_path):
    import json

    from runtime.pair import PairQualityError, build_pair

    out = build_pair(tmp_path / "p", micro_recipe(), progress=False)
    bits = json.loads((out / "pair.json").read_text())["bits_per_byte"]["draft"]
    assert build_pair(out, micro_recipe(max_draft_bits_per_byte=bits + 0.01), progress=False) == out  # cached, within bound
    with pytest.raises(PairQualityError, match="cached pair"):
        build_pair(out, micro_recipe(max_draft_bits_per_byte=bits - 0.01), progress=False)


def test_profile_out_is_checked_before_measuring(tmp_path, monkeypatch):
    """A bad --out fails at once, before the pair is even loaded."""
    from runtime import profile as profile_mod

    class Loaded(Exception):
        pass

    def load_pair(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(profile_mod, "load_pair", load_pair)
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out, match in ((blocker / "sub" / "p.yaml", "cannot write"), (tmp_path / "p.txt", ".yaml file path"), (tmp_path / "dir.yaml", "is a folder")):
        (tmp_path / "dir.yaml").mkdir(exist_ok=True)
        with pytest.raises(SystemExit, match=match):
            profile_mod.main(["--pair", str(tmp_path), "--out", str(out)])
    with pytest.raises(SystemExit, match="--quick needs an existing profile"):
        profile_mod.main(["--pair", str(tmp_path), "--quick", "--base", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "q.yaml")])
    # a folder that does not exist yet is created (and left empty), then the pair is loaded
    fresh = tmp_path / "new" / "deeper" / "p.yaml"
    with pytest.raises(Loaded):
        profile_mod.main(["--pair", str(tmp_path), "--out", str(fresh)])
    assert fresh.parent.is_dir() and list(fresh.parent.iterdir()) == []
