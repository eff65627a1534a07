"""``CompletionsClient`` against a fake server in a thread: the request it sends, the order of the
texts, the derived seeds, the concurrency bound, and each fault: retried, refused, or stopped with
one line naming the server."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from star_engine import UserError
from star_engine.helpers import derive_seed
from star_server import CompletionRequest, CompletionsClient, sample_seed
from star_server.client import server_message

spec = importlib.util.spec_from_file_location("fake_openai_server", Path(__file__).with_name("fake_openai_server.py"))
assert spec is not None and spec.loader is not None
fake = importlib.util.module_from_spec(spec)
sys.modules["fake_openai_server"] = fake
spec.loader.exec_module(fake)

MODEL = "run/models/iter_0001"


def req(prompt: str, n: int = 1, seed: int = 7) -> CompletionRequest:
    return CompletionRequest(prompt, n, seed, 0.7, 0.95, 32, ("\n\n", "Q:"))


def serve(script=(), **kw):
    return fake.FakeServer(fake.State(MODEL, list(script), **kw))


def client(url: str, **kw) -> CompletionsClient:
    opts = {"concurrency": 4, "timeout_seconds": 5.0, "retries": 2, "backoff_seconds": 0.01, **kw}
    return CompletionsClient(url, MODEL, **opts)


def test_the_request_carries_every_field_and_the_texts_come_back_in_order():
    with serve() as s:
        c = client(s.url, extra_body={"top_k": 20})
        assert c.health() and c.models() == [MODEL]
        out = c.complete([req("a", n=3, seed=11), req("b", seed=12), req("c", n=2, seed=13)])
        assert out == [["a#11#0", "a#11#1", "a#11#2"], ["b#12#0"], ["c#13#0", "c#13#1"]]
        first = next(b for b in s.state.bodies if b["prompt"] == "a")
        assert first == {"model": MODEL, "prompt": "a", "max_tokens": 32, "temperature": 0.7, "top_p": 0.95,
                         "n": 3, "seed": 11, "stop": ["\n\n", "Q:"], "top_k": 20}
        assert len(s.state.bodies) == 3
        assert c.complete([]) == []


def test_a_trailing_v1_and_slash_are_dropped_from_the_url():
    with serve() as s:
        assert client(s.url + "/v1/").models() == [MODEL]


def test_without_n_support_k_requests_go_with_derived_seeds_in_order():
    with serve(supports_n=False) as s:
        out = client(s.url, supports_n=False).complete([req("a", n=3, seed=5), req("b", n=1, seed=6)])
        seeds = [sample_seed(5, i) for i in range(3)]
        assert out == [[f"a#{sd}#0" for sd in seeds], ["b#6#0"]]
        assert sorted(b["seed"] for b in s.state.bodies if b["prompt"] == "a") == sorted(seeds)
        assert all(b["n"] == 1 for b in s.state.bodies) and len(s.state.bodies) == 4
    # the rule: the engine's derive_seed of (seed, i), 31 bits; neighbouring seeds do not collide
    assert sample_seed(5, 1) == derive_seed(5, 1) < 2**31
    assert not {sample_seed(5, i) for i in range(8)} & {sample_seed(6, i) for i in range(8)}


def test_a_server_that_ignores_n_is_caught_not_taken_as_one_sample():
    with serve(supports_n=False) as s, pytest.raises(UserError, match="1 choices for n=3.*supports_n = false"):
        client(s.url).complete([req("a", n=3)])


def test_concurrency_is_bounded():
    with serve(delay=0.15) as s:
        out = client(s.url, concurrency=3).complete([req(f"p{i}", seed=i) for i in range(12)])
        assert out == [[f"p{i}#{i}#0"] for i in range(12)]
        assert s.state.max_in_flight == 3


def test_5xx_then_success_is_retried():
    with serve([("status", 503, "overloaded"), ("status", 500, "boom")]) as s:
        assert client(s.url, concurrency=1).complete([req("a")]) == [["a#7#0"]]
        assert len(s.state.bodies) == 3


def test_always_5xx_stops_with_one_line_naming_the_server_and_its_message():
    with serve([("status", 503, "model is\n  loading")] * 10) as s:
        with pytest.raises(UserError) as e:
            client(s.url, retries=2).complete([req("a")])
        msg = str(e.value)
        assert "\n" not in msg and s.url in msg and "HTTP 503: model is loading" in msg and "3 tries" in msg
        assert len(s.state.bodies) == 3


def test_4xx_is_not_retried_and_shows_the_message():
    with serve([("status", 400, "This model's maximum context length is 2048 tokens")]) as s:
        with pytest.raises(UserError, match=r"refused POST /v1/completions: HTTP 400: This model's maximum context"):
            client(s.url).complete([req("a")])
        assert len(s.state.bodies) == 1


def test_a_slow_answer_times_out_and_is_retried():
    with serve([("sleep", 0.6)]) as s:
        t = time.monotonic()
        assert client(s.url, timeout_seconds=0.2).complete([req("a")]) == [["a#7#0"]]
        assert time.monotonic() - t < 0.6 and len(s.state.bodies) == 2


def test_always_slow_names_the_timeout():
    with serve([("sleep", 0.5)] * 3) as s, pytest.raises(UserError, match=r"after 2 tries: no answer within 0.15 s"):
        client(s.url, timeout_seconds=0.15, retries=1).complete([req("a")])


def test_a_dropped_connection_is_retried():
    with serve(["drop", "drop"]) as s:
        assert client(s.url).complete([req("a"), req("b")]) == [["a#7#0"], ["b#7#0"]]
        assert len(s.state.bodies) == 4


def test_a_refused_connection_names_the_url():
    with serve() as s:
        url = s.url
    with pytest.raises(UserError, match=rf"server {url} failed GET /v1/models after 2 tries: connection failed"):
        client(url, retries=1).models()
    assert client(url).health() is False


def test_an_answer_from_another_model_is_an_error():
    with serve([("model", "run/models/iter_0000")]) as s:
        with pytest.raises(UserError, match=r"model 'run/models/iter_0000', not the requested 'run/models/iter_0001'"):
            client(s.url).complete([req("a")])
        assert len(s.state.bodies) == 1  # not retried: the server answered, with the wrong weights


def test_the_first_failure_stops_the_batch():
    with serve([("status", 404, "The model `x` does not exist.")], delay=0.05) as s:
        with pytest.raises(UserError, match="HTTP 404: The model `x` does not exist."):
            client(s.url, concurrency=1).complete([req(f"p{i}") for i in range(20)])
        assert len(s.state.bodies) < 20


@pytest.mark.parametrize("body, message", [
    (b'{"error": {"message": "bad\\n  seed", "code": 400}}', "bad seed"),
    (b'{"detail": [{"loc": ["body", "n"], "msg": "field required"}]}', '[{"loc": ["body", "n"]'),
    (b'{"error": "not loaded"}', "not loaded"),
    (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
    (b"", "(empty body)"),
])
def test_the_server_message_is_read_from_each_error_shape(body, message):
    assert server_message(body).startswith(message) and "\n" not in server_message(body)
    assert len(server_message(b"x" * 5000)) == 303


@pytest.mark.parametrize("kw, match", [
    ({"url": "ftp://host:1"}, "not an http"),
    ({"url": "localhost:8000"}, "not an http"),
    ({"concurrency": 0}, "concurrency must be >= 1"),
    ({"extra_body": {"seed": 1, "top_k": 5}}, "extra_body sets seed"),
])
def test_bad_settings_are_one_line(kw, match):
    args = {"url": "http://127.0.0.1:9", **kw}
    with pytest.raises(UserError, match=match):
        CompletionsClient(args.pop("url"), MODEL, **args)
