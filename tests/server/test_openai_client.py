"""The official `openai` client against `localchat serve` on 127.0.0.1 (a tiny random model and a random
EAGLE-3 head on the CPU): answers, streaming, figures, errors, disconnects, the queue."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine.types import SamplingParams
from server.api import ServeOptions
from tests.server.serving import Slowed, serving, tiny_engine, tiny_head
from tests.tiny import make_tiny_model

PROMPT = "Paris is the capital of"
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("serve")
    model = make_tiny_model(base / "llama", "llama")
    return model, tiny_head(model, base / "head")


@pytest.fixture(scope="module")
def engine(tiny):
    return tiny_engine(*tiny)


@pytest.fixture(scope="module")
def served(engine):
    with serving(engine, options=ServeOptions(max_body_bytes=64 << 10)) as s:
        yield s


def ask(served, engine, **kw):
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("temperature", 0)
    return served.client().chat.completions.create(model=engine.model_name, **kw)


def wait_until(condition, timeout_s: float) -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start


def test_answer_with_usage_and_speculation_figures(served, engine):
    reply = ask(served, engine, max_tokens=16, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    expected = engine.generate(MESSAGES, SamplingParams(max_tokens=16))
    assert choice.model_extra["token_ids"] == expected.token_ids
    assert choice.message.content == expected.text and choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length") and reply.model == engine.model_name
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.prompt_tokens > 0
    ours = reply.usage.model_extra["localchat"]
    assert ours["speculative"] is True and ours["draft_steps"] == 5 and ours["verify_steps"] >= 1
    assert 1 <= ours["accept_len_mean"] == ours["tokens_per_verify_step"] <= 6 and ours["verify_tokens"] >= 6
    assert ours["decode_tok_s"] > 0 and ours["ttft_s"] > 0 and sum(ours["accept_hist"]) == ours["verify_steps"]


def test_stream_with_usage_equals_the_answer_and_speculation_is_per_request(served, engine):
    whole = ask(served, engine, max_tokens=20).choices[0].message.content
    chunks = list(ask(served, engine, max_tokens=20, stream=True, stream_options={"include_usage": True},
                      extra_body={"speculative": False}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole  # greedy: speculation on (above) and off (here) write the same tokens
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].model_extra["localchat"]["speculative"] is False
    assert engine.has_twin  # plain decoding ran on the model without its draft (Engine.without_draft)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 20
    assert chunks[-1].usage.model_extra["localchat"]["decode_tok_s"] > 0
    without_usage = list(ask(served, engine, max_tokens=4, stream=True))
    assert all(c.usage is None for c in without_usage) and without_usage[-1].choices[0].finish_reason


def test_greedy_tokens_equal_localchat_run(served, engine, tiny, capsys):
    from app.cli import main

    model, head = tiny
    assert main(["run", "--model", str(model), "--draft", str(head), "--device", "cpu", "--max-seq-len", "256",
                 "--max-tokens", "24", "--system", "", "--json", PROMPT]) == 0
    run = json.loads(capsys.readouterr().out)
    reply = ask(served, engine, max_tokens=24, extra_body={"return_token_ids": True})
    assert reply.choices[0].model_extra["token_ids"] == run["token_ids"]
    streamed = list(ask(served, engine, max_tokens=24, stream=True, extra_body={"return_token_ids": True}))
    assert [t for c in streamed if c.choices for t in c.choices[0].model_extra.get("token_ids") or []] \
        == run["token_ids"]
    live = [c.model_extra["localchat"] for c in streamed if c.choices and c.choices[0].delta.content]
    assert all(f["speculative"] for f in live) and live[-1]["accept_len_mean"] >= 1 \
        and live[-1]["completion_tokens"] <= 24


def test_models_and_health(served, engine):
    models = served.client().models.list().data
    assert [m.id for m in models] == [engine.model_name]
    assert models[0].model_extra["localchat"]["has_draft"] is True
    assert models[0].model_extra["localchat"]["draft_steps"] == 5
    with urllib.request.urlopen(served.url + "/health") as r:
        assert json.loads(r.read())["status"] == "ok"


def post_raw(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/v1/chat/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("fields, status, words", [
    ({"extra_body": {"temperature": "hot"}}, 400, "temperature must be a number"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    ({"max_tokens": 0}, 400, "max_tokens must be >= 1"),
    ({"n": 2}, 400, "n must be 1"),
    ({"extra_body": {"stop": ["a", "b", "c", "d", "e"]}}, 400, "at most 4"),
    ({"messages": [{"role": "user", "content": "word " * 400}]}, 400, "context holds 256"),
    ({"messages": [{"role": "user", "content": "x" * (80 << 10)}]}, 413, "larger than"),
])
def test_bad_requests_get_openai_errors(served, engine, fields, status, words):
    with pytest.raises(openai.APIStatusError) as error:
        ask(served, engine, **fields)
    assert error.value.status_code == status
    assert words in error.value.body["message"], error.value.body
    assert ask(served, engine, max_tokens=2).choices[0].message is not None  # the server lives on


def test_malformed_json_and_unknown_routes(served):
    status, body = post_raw(served.url, b'{"messages": [')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = post_raw(served.url, b'[1, 2]')
    assert status == 400 and "JSON object" in body["error"]["message"]
    status, body = post_raw(served.url, b'\xff\xfe{}')
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    try:
        urllib.request.urlopen(served.url + "/v2/nothing")
    except urllib.error.HTTPError as e:
        assert e.code == 404 and "error" in json.loads(e.read())


def test_api_key(engine):
    with serving(engine, options=ServeOptions(api_key="sekrit")) as s:
        with pytest.raises(openai.AuthenticationError, match="API key"):
            s.client(api_key="wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            s.client().chat.completions.create(model="x", messages=MESSAGES, max_tokens=2)
        assert s.client(api_key="sekrit").models.list().data[0].id == engine.model_name
        with urllib.request.urlopen(s.url + "/health") as r:  # probes need no key
            assert r.status == 200


def test_disconnect_stops_the_answer_and_leaves_the_queue(engine):
    with serving(Slowed(engine, 0.05), max_queue=1) as s:
        client = s.client()
        stream = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=200, stream=True,
                                                temperature=0)
        chunks = iter(stream)
        for _ in range(3):
            next(chunks)
        assert s.scheduler.is_decoding
        waiting = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5, stream=True)
        assert s.scheduler.num_waiting == 1
        waiting.close()  # its client leaves while it waits: its place frees
        wait_until(lambda: s.scheduler.num_waiting == 0, 2.0)
        stream.close()  # mid-answer: the engine stops within a step (0.05 s here)
        assert wait_until(lambda: not s.scheduler.is_decoding, 2.0) < 1.0
        start = time.monotonic()
        reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, temperature=0)
        assert reply.usage.completion_tokens <= 4 and time.monotonic() - start < 2.0
        with pytest.raises(openai.APITimeoutError):  # a non-streamed request whose client gives up
            s.client(timeout=0.5).chat.completions.create(model="m", messages=MESSAGES, max_tokens=200)
        assert wait_until(lambda: not s.scheduler.is_decoding, 2.0) < 1.0


def test_a_full_queue_refuses_with_429_and_retry_after(engine):
    with serving(Slowed(engine, 0.03), max_queue=1) as s:
        client = s.client()

        def one(_):
            try:
                return client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=0)
            except openai.RateLimitError as e:
                return e

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(4)))
        refused = [r for r in results if isinstance(r, openai.RateLimitError)]
        answered = [r for r in results if not isinstance(r, Exception)]
        assert len(answered) >= 2 and refused and len(answered) + len(refused) == 4
        assert all(int(e.response.headers["retry-after"]) >= 1 for e in refused)
        wait_until(lambda: s.scheduler.num_waiting == 0 and not s.scheduler.is_decoding, 2.0)


def test_fifty_sequential_and_eight_concurrent_requests(served, engine):
    client = served.client()
    for i in range(50):
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Count {i}"}],
                                               max_tokens=2, temperature=0)
        assert reply.usage.completion_tokens >= 1

    def one(i: int) -> str:
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"Hello {i}"}],
                                               max_tokens=6, stream=i % 2 == 0, temperature=0.7, seed=i)
        if i % 2:
            return reply.choices[0].finish_reason
        return [c.choices[0].finish_reason for c in reply if c.choices][-1]

    with ThreadPoolExecutor(8) as pool:
        reasons = list(pool.map(one, range(8)))
    assert len(reasons) == 8 and set(reasons) <= {"stop", "length"}
    wait_until(lambda: served.scheduler.num_waiting == 0 and not served.scheduler.is_decoding, 2.0)


class Failing:
    """The real engine, failing after its second step: a runtime error inside the engine."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def stream_ids(self, *args, **kwargs):
        events = self.engine.stream_ids(*args, **kwargs)
        for i, event in enumerate(events):
            if i == 2:
                events.close()
                raise RuntimeError("CUDA error: an illegal memory access\nmore lines")
            yield event


def test_an_engine_failure_ends_that_request_only(engine):
    with serving(Failing(engine)) as s:
        client = s.client()
        with pytest.raises(openai.InternalServerError, match="illegal memory access"):
            client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=0)
        with pytest.raises(openai.APIError, match="illegal memory access"):
            list(client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=20, temperature=0,
                                                stream=True))
        reply = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2, temperature=0)
        assert reply.choices[0].finish_reason == "length"  # two steps: no failure, and the server lives on


def test_a_server_where_speculation_loses_defaults_to_off_and_says_so(engine):
    """`localchat serve` with a model's default draft where speculation is slower
    (Engine.speculation_pays): requests that do not say decode plainly, a request may still ask;
    the model card says so, and the app connected to it starts with speculation off, giving why."""
    from app.remote import RemoteChoice, RemoteEngine

    note = "slower on this GPU (0.39x of no draft)"
    with serving(engine, spec_default=False, spec_note=note) as s:
        client = s.client()
        card = client.models.list().data[0].model_extra["localchat"]
        assert card["speculation_default"] is False and card["speculation_note"] == note and card["has_draft"]
        by_default = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, temperature=0,
                                                    max_tokens=12)
        assert by_default.usage.model_extra["localchat"]["speculative"] is False
        asked = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, temperature=0,
                                               max_tokens=12, extra_body={"speculative": True})
        assert asked.usage.model_extra["localchat"]["speculative"] is True
        assert asked.choices[0].message.content == by_default.choices[0].message.content
        assert RemoteEngine.connect(RemoteChoice(s.url)).speculation_pays() == (False, note)
    with serving(engine) as s:  # where it pays (the default): on, and the app keeps its switch
        assert s.client().models.list().data[0].model_extra["localchat"]["speculation_default"] is True
        assert RemoteEngine.connect(RemoteChoice(s.url)).speculation_pays() == (True, "")


def test_sampled_requests_follow_the_sampled_verdict(engine):
    """Where speculation pays greedily and loses when sampling (Engine.speculation_pays(sampled=True)),
    a greedy request that does not say speculates and a sampled one decodes plainly; the model card
    gives both verdicts, and the app connected to it reads the sampled one."""
    from app.remote import RemoteChoice, RemoteEngine

    note = "slower at temperature 0.7 on this GPU (0.90x of no draft)"
    with serving(engine, spec_default=True, spec_sampled=(False, note)) as s:
        client = s.client()
        card = client.models.list().data[0].model_extra["localchat"]
        assert card["speculation_default"] is True
        assert card["speculation_default_sampled"] is False and card["speculation_note_sampled"] == note
        greedy = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, temperature=0,
                                                max_tokens=8)
        assert greedy.usage.model_extra["localchat"]["speculative"] is True
        sampled = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, temperature=0.7,
                                                 max_tokens=8, seed=3)
        assert sampled.usage.model_extra["localchat"]["speculative"] is False
        asked = client.chat.completions.create(model=engine.model_name, messages=MESSAGES, temperature=0.7,
                                               max_tokens=8, seed=3, extra_body={"speculative": True})
        assert asked.usage.model_extra["localchat"]["speculative"] is True
        remote = RemoteEngine.connect(RemoteChoice(s.url))
        assert remote.speculation_pays() == (True, "") and remote.speculation_pays(sampled=True) == (False, note)
