"""The remote engine reads the speculation figures of vLLM and SGLang where they publish them, against
small stand-in servers on 127.0.0.1 that answer chat completions as those servers stream them and
publish their counters (vLLM's Prometheus text at /metrics) or average (SGLang's /server_info)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from app.remote import RemoteChoice, RemoteEngine
from app.server_figures import VLLM_ACCEPTED, VLLM_DRAFTS, prometheus_sums
from engine.types import SamplingParams

WORDS = ["The", " capital", " of", " France", " is", " Paris", "."]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def stand_in(kind: str, key: str | None = None) -> Starlette:
    """An OpenAI-compatible server that answers WORDS, one chunk a token; each answer adds 3 verify
    steps that accepted 4 draft tokens in all (vLLM's counters), or sets SGLang's average to 2.5."""
    state = {"drafts": 10.0, "accepted": 12.0, "answers": 0}

    def authorized(request) -> bool:
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "big-model", "object": "model", "owned_by": kind}]})

    async def chat(request):
        body = await request.json()
        state["answers"] += 1
        state["drafts"] += 3
        state["accepted"] += 4

        async def events():
            for i, word in enumerate(WORDS):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "delta": {"content": word},
                                      "finish_reason": "stop" if i == len(WORDS) - 1 else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"], "choices": [],
                     "usage": {"prompt_tokens": 9, "completion_tokens": len(WORDS), "total_tokens": 9 + len(WORDS)}}
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def metrics(request):
        if not authorized(request):
            return PlainTextResponse("unauthorized", status_code=401)
        return PlainTextResponse(
            "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n"
            "# TYPE vllm:spec_decode_num_drafts counter\n"
            f'{VLLM_DRAFTS}{{engine="0",model_name="big-model"}} {state["drafts"] - 1}\n'
            f'{VLLM_DRAFTS}{{engine="1",model_name="big-model"}} 1.0\n'
            f'{VLLM_ACCEPTED}{{engine="0",model_name="big-model"}} {state["accepted"]}\n'
            'vllm:num_requests_running{model_name="big-model"} 0.0\n')

    async def server_info(request):
        value = 2.5 if state["answers"] else None
        return JSONResponse({"internal_states": [{"last_gen_throughput": 100.0, "avg_spec_accept_length": value}]})

    routes = [Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    if kind == "vllm":
        routes.append(Route("/metrics", metrics))
    elif kind == "sglang-old":
        routes.append(Route("/get_server_info", server_info))
    elif kind == "sglang":
        routes.append(Route("/server_info", server_info))
    return Starlette(routes=routes)


@pytest.fixture
def serve():
    servers = []

    def start(app) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the stand-in server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def answer(engine: RemoteEngine):
    events = list(engine.stream(MESSAGES, SamplingParams(max_tokens=16)))
    assert "".join(e.text for e in events) == "".join(WORDS) and events[-1].finished
    return events[-1].stats


def test_prometheus_sums_add_a_metric_over_its_labels():
    text = ('# TYPE x counter\nx_total{a="1"} 2.5\nx_total{a="2",b="c d"} 1\nx_total_other 7\n'
            'y_total 3e2\nx_total{a="3"} NaN\nbroken line\n')
    assert prometheus_sums(text, ("x_total", "y_total")) == {"x_total": 3.5, "y_total": 300.0}
    assert prometheus_sums("", ("x_total",)) == {}


def test_vllm_counters_give_each_answers_accepted_length(serve):
    url = serve(stand_in("vllm", key="k"))
    engine = RemoteEngine.connect(RemoteChoice(url, api_key="k"))
    assert not engine.is_localchat and engine.figures is not None and engine.figures.kind == "vLLM /metrics"
    for _ in range(2):  # each answer: 3 verify steps, 4 drafts accepted -> 1 + 4 / 3
        stats = answer(engine)
        assert stats.speculative is True and stats.verify_steps == 3
        assert stats.accept_len_mean == pytest.approx(1 + 4 / 3)
        assert stats.generated_tokens == len(WORDS)


def test_vllm_counters_need_the_servers_key(serve):
    url = serve(stand_in("vllm", key="k"))
    engine = RemoteEngine.connect(RemoteChoice(url))  # chat needs no key here; /metrics does
    assert engine.figures is None
    assert answer(engine).speculative is None  # unknown, not "off"


@pytest.mark.parametrize("kind", ["sglang", "sglang-old"])
def test_sglang_reports_its_servers_average(serve, kind):
    engine = RemoteEngine.connect(RemoteChoice(serve(stand_in(kind))))
    assert engine.figures is not None and engine.figures.kind == "SGLang /server_info"
    stats = answer(engine)
    assert stats.speculative is True and stats.accept_len_mean == 2.5


def test_a_server_that_publishes_nothing_shows_no_figures(serve):
    engine = RemoteEngine.connect(RemoteChoice(serve(stand_in("plain"))))
    assert engine.figures is None
    stats = answer(engine)
    assert stats.speculative is None and stats.accept_len_mean == 0.0 and stats.ttft_s > 0
