"""Serving parts without a server: incremental text, calibration, schemas, configuration."""

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.calibration import CalibratedCostModel, StepCalibration
from runtime.openai_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    UnsupportedParameter,
    error_body,
    plain_chat_prompt,
)
from runtime.serve_config import ServeConfig, check_profile_matches_pair
from runtime.textstream import REPLACEMENT, TextStream
from runtime.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def _stream_all(text: str, cuts: list[int], stops=()) -> tuple[list[str], TextStream]:
    ids = TOK.encode(text)
    ts = TextStream(TOK.decode, stops)
    pieces, at = [], 0
    for cut in sorted(set(c % (len(ids) + 1) for c in cuts)) + [len(ids)]:
        ts.feed(ids[at:cut])
        at = cut
        pieces.append(ts.take())
    pieces.append(ts.take(final=True))
    return pieces, ts


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.lists(st.integers(0, 200), max_size=12))
def test_streamed_pieces_join_to_the_text_and_never_split_a_character(text, cuts):
    pieces, _ = _stream_all(text, cuts)
    assert "".join(pieces) == text
    assert not any(REPLACEMENT in p for p in pieces) or REPLACEMENT in text


def test_multibyte_characters_split_across_tokens_stay_whole():
    text = "héllo → 世界 🙂 done"
    pieces, _ = _stream_all(text, list(range(len(text.encode()))))  # one byte per token
    assert "".join(pieces) == text and all(REPLACEMENT not in p for p in pieces)
    assert TOK.decode(TOK.encode("🙂")[:2]) == REPLACEMENT  # what a naive per-token decode would send


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc→", min_size=1, max_size=30), st.text(alphabet="abc→", min_size=1, max_size=3), st.lists(st.integers(0, 100), max_size=8))
def test_stop_sequences_match_the_reference_cut(text, stop, cuts):
    pieces, ts = _stream_all(text, cuts, [stop])
    want = text[: text.index(stop)] if stop in text else text
    assert "".join(pieces) == want
    assert ts.stopped == (stop in text)
    # text and tokens counted do not depend on the chunking: a speculative chunk past the stop counts only up to
    # the token that completes it, as one token at a time would (usage counted the whole chunk)
    _, one_by_one = _stream_all(text, list(range(len(TOK.encode(text)) + 1)), [stop])
    assert ts.tokens == one_by_one.tokens


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc", min_size=1, max_size=24), st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=2, max_size=3),
       st.lists(st.integers(0, 100), max_size=8))
def test_overlapping_stop_sequences_cut_as_one_token_at_a_time_would(text, stops, cuts):
    # with stops like ["abcd", "c"] a chunk cut the text at the earliest *start* among the stops it
    # held, while one token at a time stops at the first *completed* one (a reviewer's find)
    pieces, ts = _stream_all(text, cuts, stops)
    ref_pieces, ref = _stream_all(text, list(range(len(TOK.encode(text)) + 1)), stops)
    assert ts.text == ref.text and "".join(pieces) == "".join(ref_pieces) and ts.tokens == ref.tokens


def test_stop_prefix_is_held_back_until_settled():
    ts = TextStream(TOK.decode, ["END"])
    ts.feed(TOK.encode("abcE"))
    assert ts.take() == "abc"  # "E" may start "END"
    ts.feed(TOK.encode("x"))
    assert ts.take() == "Ex"
    ts.feed(TOK.encode("EN"))
    assert ts.take() == ""
    ts.feed(TOK.encode("D tail"))
    assert ts.stopped and ts.take() == "" and ts.text == "abcEx"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-6, 1e3), st.floats(1e-6, 1e3)), min_size=1, max_size=30))
def test_calibration_stays_in_bounds(samples):
    cal = StepCalibration(0.3, (0.5, 20.0))
    for real, predicted in samples:
        f = cal.update("ad", real, predicted)
        assert 0.5 <= f <= 20.0
    assert cal.factor["sd"] == 1.0  # per mode


def test_calibration_tracks_a_slower_host_and_ignores_bad_samples():
    cal = StepCalibration(0.3, (0.5, 20.0))
    for _ in range(20):
        cal.update("sd", 4.0, 1.0)
    assert cal.factor["sd"] == pytest.approx(4.0)
    assert cal.update("sd", float("nan"), 1.0) is None and cal.update("sd", 1.0, 0.0) is None
    assert cal.factor["sd"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="mode"):
        cal.update("xd", 1.0, 1.0)
    with pytest.raises(ValueError, match="bounds"):
        StepCalibration(0.3, (2.0, 3.0))


def test_calibration_plans_for_a_swinging_host_above_its_mean():
    cal = StepCalibration(0.3, (0.5, 20.0), margin_sd=1.0)
    for i in range(40):
        cal.update("ad", 1.0 if i % 2 else 3.0, 1.0)
    assert 1.5 < cal.mean["ad"] < 2.5 and cal.factor["ad"] > cal.mean["ad"] + 0.5
    flat = StepCalibration(0.3, (0.5, 20.0), margin_sd=0.0)
    for i in range(40):
        flat.update("ad", 1.0 if i % 2 else 3.0, 1.0)
    assert flat.factor["ad"] == pytest.approx(flat.mean["ad"])


def test_calibrated_cost_model_scales_times_not_memory():
    from envs.cost_model import CostModel
    from envs.profile import load_profile

    base = CostModel(load_profile("cpu1_specsched-pair"))
    cal = StepCalibration()
    cost = CalibratedCostModel(base, cal)
    cal.factor.update(ad=3.0, sd=0.5)
    assert cost.ad_time1(2, 50, 20) == pytest.approx(3.0 * base.ad_time1(2, 50, 20))
    assert cost.sd_time1(2, 50, 20, 6, 4) == pytest.approx(0.5 * base.sd_time1(2, 50, 20, 6, 4))
    assert float(cost.ad_time(2, 50, 20)) == pytest.approx(3.0 * float(base.ad_time(2, 50, 20)))
    assert cost.ad_memory1(2, 50, 20, 30) == base.ad_memory1(2, 50, 20, 30)


@pytest.mark.parametrize("field,value", [("n", 2), ("best_of", 3), ("logprobs", 1), ("echo", True), ("suffix", "x"), ("presence_penalty", 0.5),
                                         ("logit_bias", {"1": 2}), ("made_up", 1),
                                         # type-aware: true is not n = 1; a completion's logprobs 0 asks for the sampled token's
                                         ("n", True), ("n", 1.0), ("logprobs", 0), ("logprobs", True), ("tool_choice", "auto"),
                                         ("response_format", {"type": "json_object"}), ("response_format", {"type": "text", "x": 1})])
def test_unsupported_parameters_are_named(field, value):
    req = CompletionRequest.model_validate({"prompt": "x", field: value})
    with pytest.raises(UnsupportedParameter) as err:
        req.check_supported()
    assert err.value.param == field


@pytest.mark.parametrize("extra", [{"logprobs": False}, {"top_logprobs": 0}, {"response_format": {"type": "text"}}, {"tool_choice": "none"},
                                   {"parallel_tool_calls": False}, {"tools": []}, {"n": 1}, {"presence_penalty": 0}, {"frequency_penalty": 0.0},
                                   {"logit_bias": {}}, {"logprobs": None}, {"suffix": ""}, {"presence_penalty": 0}])
def test_neutral_values_clients_send_explicitly_pass(extra):
    # the OpenAI SDK and others send defaults explicitly: they ask for nothing the server lacks
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **extra})
    chat.check_supported()


@pytest.mark.parametrize("field,value", [("temperature", True), ("top_p", True), ("seed", True), ("deadline_s", True), ("deadline_s", "5"),
                                         ("temperature", "0.5"), ("seed", 1.5)])
def test_sampling_and_deadline_fields_are_strict(field, value):
    # true sampled at T = 1 and became a 1 s deadline; "5" was accepted as 5 s
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", field: value})
    CompletionRequest.model_validate({"prompt": "x", "temperature": 1, "deadline_s": 5, "top_p": 1})  # an int is still a number


def test_an_unsent_limit_is_capped_at_the_servers():
    # a server with max_tokens_limit 8 refused a request that sent no max_tokens ("got 16")
    assert CompletionRequest.model_validate({"prompt": "x"}).token_limit(8) == 8
    assert CompletionRequest.model_validate({"prompt": "x"}).token_limit(512) == 16
    assert CompletionRequest.model_validate({"prompt": "x", "max_tokens": 100}).token_limit(8) == 100  # sent: the range check refuses it
    assert ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]}).token_limit(4) == 4


def test_supported_parameters_pass():
    req = CompletionRequest.model_validate({"prompt": ["x"], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.8,
                                            "top_p": 0.9, "seed": 3, "stop": ["\n"], "user": "u", "deadline_s": 2.5, "n": 1, "echo": False})
    req.check_supported()
    assert req.prompt == "x" and req.stop_list() == ["\n"]
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_completion_tokens": 5})
    assert chat.token_limit(64) == 5 and chat.messages[0].text() == "hi"
    assert plain_chat_prompt([("user", "hi")]) == "user: hi\nassistant: "
    body = error_body(429, "no", code="rejected")
    assert body == {"error": {"message": "no", "type": "rate_limit_error", "param": None, "code": "rejected"}}


@pytest.mark.parametrize(("body", "limit", "field"), [({"max_completion_tokens": 0, "max_tokens": 5}, 0, "max_completion_tokens"),
                                                     ({"max_tokens": 0}, 0, "max_tokens"), ({"max_tokens": -3}, -3, "max_tokens"),
                                                     ({}, 16, "max_tokens"), ({"max_tokens": 7}, 7, "max_tokens")])
def test_chat_token_limit_keeps_a_sent_zero_for_the_range_check(body, limit, field):
    # a sent 0 must reach the server's range check (which names [1, limit]), not fall back to a default
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})
    assert chat.token_limit(64) == limit and chat.limit_field() == field


def test_bad_config_fails_fast_before_any_model_is_loaded():
    start = time.monotonic()
    for overrides, field in (({"scheduler": "nosuch"}, "scheduler"), ({"profile": "nosuch"}, "profile"), ({"window_s": 0}, "window_s"),
                             ({"pair": "/nonexistent"}, "pair"), ({"target": "/nonexistent", "draft": "/nonexistent"}, "target"),
                             ({"target": "."}, "draft"), ({"scheduler": "policy", "policy_path": None}, "policy_path"),
                             ({"calibration_bounds": [2.0, 3.0]}, "calibration_bounds"), ({"max_round": 65}, "max_round"), ({"dtype": "int7"}, "dtype"),
                             # an exhaustive search cannot decide the default 64-request round: every request of a larger one got 500
                             ({"scheduler": "exhaustive"}, "max_round' must be an integer in \\[1, 16\\]"),
                             ({"scheduler": "optimal_v1", "max_round": 9}, "max_round' must be an integer in \\[1, 8\\]")):
        with pytest.raises(ValueError, match=field):
            ServeConfig(**overrides).validate()
    assert time.monotonic() - start < 10.0
    ServeConfig(scheduler="exhaustive", max_round=16).validate()  # within the search's limit


def test_profile_of_other_dimensions_is_refused():
    from types import SimpleNamespace

    from envs.profile import load_profile

    prof = load_profile("cpu1_specsched-pair")
    same = SimpleNamespace(num_hidden_layers=prof.llm.layers, hidden_size=prof.llm.hidden, num_attention_heads=prof.llm.heads,
                           num_key_value_heads=prof.llm.kv_heads, vocab_size=prof.llm.vocab)
    draft = SimpleNamespace(num_hidden_layers=prof.slm.layers, hidden_size=prof.slm.hidden, num_attention_heads=prof.slm.heads,
                            num_key_value_heads=prof.slm.kv_heads, vocab_size=prof.slm.vocab)
    check_profile_matches_pair(prof, same, draft)
    other = SimpleNamespace(**{**vars(same), "vocab_size": 32000})
    with pytest.raises(ValueError, match="llm.vocab"):
        check_profile_matches_pair(prof, other, draft)


# ------------------------------------------------------------------ the load generator's HTTP client
def _serve_raw(response: bytes):
    """A one-shot loopback server that answers any request with ``response`` (bytes, sent in small
    pieces so lines and chunks are split across reads), then closes."""

    async def start():
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            for i in range(0, len(response), 7):
                writer.write(response[i : i + 7])
                await writer.drain()
            writer.close()

        return await asyncio.start_server(handle, "127.0.0.1", 0)

    return start


@pytest.mark.parametrize("response, status, lines", [
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:\r\nc;ext=1\r\n a\n\ndata: b\n\r\n0\r\nx-trailer: 1\r\n\r\n", 200, ["data: a", "", "data: b"]),
    (b"HTTP/1.1 429 Too Many\r\nContent-Length: 11\r\n\r\n{\"e\": 1}\nxy", 429, ['{"e": 1}', "xy"]),
    (b"HTTP/1.1 200 OK\r\n\r\nuntil\nclose", 200, ["until", "close"]),
])
def test_lean_http_reads_chunked_sized_and_close_delimited_bodies(response, status, lines):
    from runtime.lean_http import post_json

    async def go():
        server = await _serve_raw(response)()
        port = server.sockets[0].getsockname()[1]
        async with server, post_json(f"http://127.0.0.1:{port}", "/v1/completions", {"x": 1}) as resp:
            return resp.status, [line async for line in resp.lines()]

    assert asyncio.run(go()) == (status, lines)


@pytest.mark.parametrize("response, words", [(b"SPAM\r\n\r\n", "bad status line"), (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
                                             (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "expected bytes")])
def test_lean_http_refuses_broken_responses(response, words):
    from runtime.lean_http import HTTPError, post_json

    async def go():
        server = await _serve_raw(response)()
        port = server.sockets[0].getsockname()[1]
        async with server, post_json(f"http://127.0.0.1:{port}", "/", {}) as resp:
            return await resp.read()

    with pytest.raises((HTTPError, asyncio.IncompleteReadError), match=words):
        asyncio.run(go())
    with pytest.raises(ValueError, match="only http"):
        post_json("https://example.org", "/", {})


def test_lean_http_brackets_an_ipv6_host():
    # the Host header read "::1:PORT" (unparseable) for http://[::1]:PORT
    import socket

    from runtime.lean_http import post_json

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    seen = {}

    async def go():
        async def handle(reader, writer):
            seen["head"] = (await reader.readuntil(b"\r\n\r\n")).decode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()

        try:
            server = await asyncio.start_server(handle, "::1", 0)
        except OSError:
            pytest.skip("no IPv6 loopback here")
        port = server.sockets[0].getsockname()[1]
        async with server, post_json(f"http://[::1]:{port}", "/v1/completions", {}) as resp:
            return resp.status, port

    status, port = asyncio.run(go())
    assert status == 200 and f"Host: [::1]:{port}\r\n" in seen["head"]


def test_arrival_is_stamped_before_the_body_is_read():
    """A request's age counts from the app's entry: time spent waiting for its body (or queued in a
    busy event loop) is seen by the admission check."""
    from runtime.api import ARRIVAL_KEY, BodyLimits
    from runtime.metrics import ServeMetrics

    seen = {}

    async def app(scope, receive, send):
        seen["body"] = (await receive())["body"]
        seen["app_at"] = time.monotonic()
        seen["arrival"] = scope[ARRIVAL_KEY]

    async def receive():
        await asyncio.sleep(0.2)  # a slow body
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        raise AssertionError(f"nothing is sent for a good body: {msg}")

    limits = BodyLimits(app, ServeConfig(), ServeMetrics())
    asyncio.run(limits({"type": "http", "method": "POST", "headers": []}, receive, send))
    assert seen["body"] == b"{}" and seen["app_at"] - seen["arrival"] >= 0.2


def test_header_timeout_tells_unread_bytes_from_a_silent_client():
    """Bytes the kernel holds but the (busy) event loop has not read yet mean the client did send:
    the header timeout gives such a connection more time instead of resetting it."""
    from runtime.header_timeout import unread_bytes_waiting

    async def go():
        transports = []

        class Idle(asyncio.Protocol):
            def connection_made(self, transport):
                transport.pause_reading()  # like a loop too busy to read
                transports.append(transport)

        server = await asyncio.get_running_loop().create_server(Idle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            _, silent = await asyncio.open_connection("127.0.0.1", port)
            _, talker = await asyncio.open_connection("127.0.0.1", port)
            talker.write(b"POST / HTTP/1.1\r\n")
            await talker.drain()
            talker_port = talker.get_extra_info("sockname")[1]
            for _ in range(200):  # until both are accepted and the talker's bytes are in the kernel
                if len(transports) == 2 and any(unread_bytes_waiting(t) for t in transports):
                    break
                await asyncio.sleep(0.01)
            by_peer = {t.get_extra_info("peername")[1]: t for t in transports}
            result = [unread_bytes_waiting(by_peer[p]) for p in sorted(by_peer, key=lambda p: p == talker_port)]
            silent.close()
            talker.close()
            return result

    assert asyncio.run(go()) == [False, True]


def test_send_stamp_is_read_within_bounds():
    """The client's send stamp counts when it is plausible; skew, junk or no stamp count as 'sent now'."""
    from runtime.admission import MAX_SENT_LEAD_S, client_sent_lead_s, sent_header_value

    now = 1_700_000_000.0
    assert client_sent_lead_s(sent_header_value(now - 0.25), now) == pytest.approx(0.25, abs=1e-5)
    assert client_sent_lead_s(f"{int((now - 0.5) * 1e6)}".encode(), now) == pytest.approx(0.5, abs=1e-5)  # bare µs
    assert client_sent_lead_s(sent_header_value(now + 0.3), now) == 0.0  # slightly ahead (skew): sent now
    assert client_sent_lead_s(sent_header_value(now - MAX_SENT_LEAD_S - 1), now) == 0.0  # another host's clock
    assert client_sent_lead_s(sent_header_value(now + 5), now) == 0.0
    for junk in (None, b"", b"t=", b"t=abc", b"nan", b"inf"):
        assert client_sent_lead_s(junk, now) == 0.0


def test_arrival_counts_from_the_clients_send_stamp():
    """With ``X-Request-Start`` the deadline counts from when the client sent, before the server saw it."""
    from runtime.admission import sent_header_value
    from runtime.api import ARRIVAL_KEY, SENT_LEAD_KEY, BodyLimits
    from runtime.metrics import ServeMetrics

    seen = {}

    async def app(scope, receive, send):
        await receive()
        seen["entered"], seen["arrival"], seen["lead"] = time.monotonic(), scope[ARRIVAL_KEY], scope[SENT_LEAD_KEY]

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        raise AssertionError(f"nothing is sent for a good body: {msg}")

    headers = [(b"x-request-start", sent_header_value(time.time() - 0.4).encode())]
    asyncio.run(BodyLimits(app, ServeConfig(), ServeMetrics())({"type": "http", "method": "POST", "headers": headers}, receive, send))
    assert 0.39 <= seen["lead"] <= 5 and seen["entered"] - seen["arrival"] >= 0.39


def test_answer_margin_learns_the_answer_delay_and_stays_bounded():
    from runtime.admission import AnswerMargin

    m = AnswerMargin(weight=0.2, k_sd=2.0, max_s=1.0)
    assert m.value == 0.0
    for _ in range(50):
        m.observe(0.05)
    assert m.value == pytest.approx(0.05, abs=1e-6)  # a steady delay: no spread
    for x in (0.05, 0.3) * 20:  # a swinging delay: the margin sits above the mean
        m.observe(x)
    assert m.value > m.mean + 0.05
    for bad in (float("nan"), float("inf"), -1.0):
        before = m.value
        m.observe(bad)
        assert m.value == before
    for _ in range(50):
        m.observe(100.0)  # a stalled write cannot push the margin past its bound
    assert m.value == 1.0
    lagged = AnswerMargin(max_s=1.0)
    for _ in range(30):
        lagged.observe_lag(0.4)
    assert lagged.value == pytest.approx(0.4, abs=1e-3)  # never below the event loop's lag
    with pytest.raises(ValueError, match="weight"):
        AnswerMargin(weight=0)
    with pytest.raises(ValueError, match="max_s"):
        AnswerMargin(max_s=0)


def test_answer_delay_of_a_rejection_is_fed_to_the_margin():
    """When a rejection's last byte is written, its delay since the decision is a margin sample; a
    served request's is not."""
    from runtime.admission import AnswerMargin
    from runtime.api import LIVE_KEY, BodyLimits
    from runtime.live_request import LiveRequest
    from runtime.metrics import ServeMetrics

    margin = AnswerMargin()

    def request(outcome: str) -> LiveRequest:
        live = LiveRequest(id="x", prompt_ids=[1], max_tokens=1, deadline_s=1.0, text=TextStream(TOK.decode))
        live.outcome, live.completed_at = outcome, time.monotonic() - 0.3
        return live

    async def run(live: LiveRequest) -> None:
        async def app(scope, receive, send):
            await receive()
            scope[LIVE_KEY] = live
            await send({"type": "http.response.start", "status": 429, "headers": []})
            await send({"type": "http.response.body", "body": b"{}", "more_body": False})

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(msg):
            pass

        await BodyLimits(app, ServeConfig(), ServeMetrics(), margin)({"type": "http", "method": "POST", "headers": []}, receive, send)

    asyncio.run(run(request("served")))
    assert margin.samples == 0
    asyncio.run(run(request("rejected")))
    assert margin.samples == 1 and 0.3 <= margin.mean < 5


def test_calibration_plans_with_a_spread_until_it_has_a_few_samples():
    from runtime.calibration import SETTLED

    cal = StepCalibration(0.3, (0.5, 20.0), margin_sd=1.0, first_rel_sd=0.2)
    assert cal.update("sd", 2.0, 1.0) == pytest.approx(2.4)  # one sample: mean 2 + 1 x (0.2 x 2)
    for _ in range(SETTLED - 1):
        f = cal.update("sd", 2.0, 1.0)
    assert f == pytest.approx(2.0)  # settled: samples that agree leave no spread
    assert StepCalibration().update("ad", 2.0, 1.0) == pytest.approx(2.0)  # off by default
    with pytest.raises(ValueError, match="first_rel_sd"):
        StepCalibration(first_rel_sd=-0.1)


def test_queue_prices_a_burst_in_one_call_as_it_prices_one_request():
    """The vectorised pricing of many queued requests gives the scalar prices, bit for bit."""
    from envs.cost_model import CostModel, sd_iterations1
    from envs.profile import load_profile
    from runtime.admission import price_alone
    from runtime.live_request import LiveRequest

    cost = CostModel(load_profile("cpu1_specsched-pair"))
    reqs = [LiveRequest(id=str(i), prompt_ids=[1] * (5 + 37 * i), max_tokens=1 + 11 * i, deadline_s=1.0, text=TextStream(TOK.decode)) for i in range(12)]
    price_alone(cost, reqs[:2], 0.8, 4)  # the scalar path
    price_alone(cost, reqs, 0.8, 4)  # the rest in one call; the first two keep their prices
    for r in reqs:
        s, n = len(r.prompt_ids), r.max_tokens
        assert r.alone_s == (cost.ad_time1(1, s, n), cost.sd_time1(1, s, n, sd_iterations1(n, 0.8, 4), 4))
