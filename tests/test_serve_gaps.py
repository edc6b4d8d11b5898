"""Serving behaviours the other live-server tests leave open: the policy/profile mismatch warning,
``finish_reason == "stop"`` at the end-of-sequence token (AD and SD engines), and an engine fault
logged exactly once with its traceback."""

from __future__ import annotations

import copy
import json
import logging
import shutil

import httpx
import pytest
from live_server import ROOT, running
from test_serve_faults import _faulty_pair, _final_event, wait_warm

from envs.profile import load_profile
from runtime.pair import ModelPair
from runtime.serve_config import ServeConfig, policy_profile_warning

SHIPPED_POLICY = ROOT / "policies" / "paper_k50"  # a v0 policy (placement=local)


def _policy_trained_on(folder, profile_name: str):
    """A copy of the shipped policy whose policy.json says it was trained on ``profile_name``."""
    shutil.copytree(SHIPPED_POLICY, folder)
    meta = json.loads((folder / "policy.json").read_text())
    meta.setdefault("env", {})["profile"] = profile_name
    (folder / "policy.json").write_text(json.dumps(meta))
    return folder


# ----------------------------------------------------------------------------- (a) policy trained on another profile
def test_policy_profile_warning_names_both_profiles_and_is_silent_on_a_match(profile, tmp_path):
    planning = load_profile(str(profile))
    assert planning.name == "tiny_test"
    other = _policy_trained_on(tmp_path / "other", "rtx4090_llama2-7b_tinyllama-1.1b")
    for path in (other, other / "model.zip"):  # a folder or its model.zip
        warning = policy_profile_warning(str(path), planning)
        assert warning is not None and "'rtx4090_llama2-7b_tinyllama-1.1b'" in warning and "'tiny_test'" in warning, warning
    same = _policy_trained_on(tmp_path / "same", "tiny_test")
    assert policy_profile_warning(str(same), planning) is None
    assert policy_profile_warning(str(same / "model.zip"), planning) is None
    assert policy_profile_warning(None, planning) is None


@pytest.mark.parametrize("trained_on, warns", [("rtx4090_llama2-7b_tinyllama-1.1b", True), ("tiny_test", False)])
def test_the_server_logs_the_policy_profile_mismatch_at_start(pair, profile, tmp_path, caplog, trained_on, warns):
    from runtime.rounds import RoundServer

    policy = _policy_trained_on(tmp_path / "policy", trained_on)
    cfg = ServeConfig(scheduler="policy", policy_path=str(policy), profile=str(profile), port=0)
    with caplog.at_level(logging.WARNING, logger="specsched.serve"):
        rounds = RoundServer(cfg, pair)
    rounds.pool.shutdown(wait=False)
    said = [r for r in caplog.records if r.name == "specsched.serve" and "was trained on profile" in r.getMessage()]
    if warns:
        assert len(said) == 1 and said[0].levelno == logging.WARNING and "'tiny_test'" in said[0].getMessage()
    else:
        assert said == []


# ----------------------------------------------------------------------------- (b) finish_reason at end of sequence
def _eos_pair(pair, after: int) -> ModelPair:
    """The pair with a target whose argmax is EOS at every position >= ``after`` (position ids):
    greedy AD and SD (lossless) both end there. The draft is left as it is (SD's drafts get rejected)."""
    target = copy.deepcopy(pair.target)
    inner, eos = target.forward, pair.tokenizer.eos_id
    assert eos is not None

    def forward(*args, position_ids=None, **kwargs):
        out = inner(*args, position_ids=position_ids, **kwargs)
        if position_ids is not None:
            out.logits[..., eos] = out.logits[..., eos] + 1e4 * (position_ids >= after).to(out.logits.dtype)
        return out

    target.forward = forward
    return ModelPair(target, pair.draft, pair.tokenizer, pair.path)


@pytest.mark.parametrize("scheduler", ["ad_only", "sd_only"])
def test_generation_that_ends_at_eos_reports_stop_and_a_token_limit_reports_length(pair, profile, scheduler):
    prompt = "def f(x):"
    n_prompt = len(pair.tokenizer.encode(prompt))
    with running(_eos_pair(pair, after=n_prompt + 2), profile, scheduler=scheduler, calibration_probe_s=0) as srv:
        url = srv.url
        wait_warm(url)
        plain = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 16}, timeout=60)
        streamed = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 16, "stream": True}, timeout=60)
        short = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=60)
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert body["specsched"]["outcome"] == "served" and body["specsched"]["mode"] == scheduler[:2]
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] < 16  # ended by EOS, not by max_tokens
    finals = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    reasons = [c["finish_reason"] for f in finals for c in f.get("choices", []) if c.get("finish_reason")]
    assert reasons == ["stop"], finals
    assert _final_event(streamed)["specsched"]["outcome"] == "served"
    # the control: two tokens end before the EOS position, at the token limit
    assert short.status_code == 200 and short.json()["choices"][0]["finish_reason"] == "length"
    assert short.json()["usage"]["completion_tokens"] == 2


# ----------------------------------------------------------------------------- (c) a fault logged once, with its traceback
def test_an_engine_fault_is_logged_exactly_once_with_its_traceback(pair, profile, caplog):
    bad, hook = _faulty_pair(pair, fail_on=set())
    with caplog.at_level(logging.WARNING):
        with running(bad, profile, scheduler="ad_only", window_s=0.1, calibration_probe_s=0) as srv:
            url = srv.url
            wait_warm(url)
            hook.arm(after=1)  # the next target pass: the round of the request below
            resp = httpx.post(f"{url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 8}, timeout=60)
            again = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60)
    assert resp.status_code == 500 and resp.json()["error"]["code"] == "engine_fault"
    assert again.status_code == 200  # the server carried on
    about = [r for r in caplog.records if "injected fault" in r.getMessage() or (r.exc_info and "injected fault" in str(r.exc_info[1]))]
    assert len(about) == 1, [(r.name, r.levelname, r.getMessage()) for r in about]
    record = about[0]
    assert record.name == "specsched.serve" and record.levelno == logging.ERROR
    assert record.exc_info and isinstance(record.exc_info[1], RuntimeError) and record.exc_info[2] is not None
    text = logging.Formatter().format(record)
    assert "Traceback (most recent call last)" in text and "injected fault on forward call" in text
    assert "__call__" in text  # the traceback reaches the faulty forward, not just the round's wrapper
