"""`localchat serve --model demo` as a user starts it (a process of its own, on the CPU): the official
`openai` client gets the tokens `localchat run` writes, with the speculation figures; memory stays flat
over many requests; Ctrl+C stops it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import openai
import pytest

from engine.engine import Engine

pytestmark = pytest.mark.slow

PROMPT = "Give me three tips for learning to cook."
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": PROMPT}]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.fixture(scope="module")
def demo_server(demo_gguf):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--model", "demo", "--device", "cpu",
                             "--port", "0"], stderr=subprocess.PIPE, text=True, env=env)
    lines, deadline = [], time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if match := re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line):
            break
        assert line or proc.poll() is None, "".join(lines)
    else:
        proc.kill()
        raise AssertionError("the server did not start: " + "".join(lines))
    yield proc, match.group(1)
    if proc.poll() is None:
        proc.kill()


def test_openai_client_gets_the_tokens_of_localchat_run(demo_server):
    proc, url = demo_server
    run = subprocess.run([sys.executable, "-m", "app.cli", "run", "--model", "demo", "--device", "cpu", "--json",
                          "--max-tokens", "32", PROMPT], capture_output=True, text=True, timeout=300)
    expected = json.loads(run.stdout)["token_ids"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    card = client.models.list().data[0].model_extra["localchat"]  # LOCALCHAT_CPU_SPEC=off (conftest): plain decoding unless asked
    assert card["speculation_default"] is False and card["speculation_note"] == Engine.CPU_SPEC_REASON
    reply = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=32, temperature=0,
                                           extra_body={"return_token_ids": True, "speculative": True})
    assert reply.choices[0].model_extra["token_ids"] == expected
    ours = reply.usage.model_extra["localchat"]
    assert ours["speculative"] and ours["accept_len_mean"] > 1 and ours["decode_tok_s"] > 0
    chunks = list(client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=32, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"return_token_ids": True}))
    assert [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids") or []] == expected
    assert chunks[-1].usage.completion_tokens == len(expected)
    assert chunks[-1].usage.model_extra["localchat"]["speculative"] is False  # the CPU's default


def test_memory_stays_flat_and_ctrl_c_stops_it(demo_server):
    proc, url = demo_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    def ask(i: int) -> None:
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": f"A word on {i}."}],
                                       max_tokens=4, temperature=0)

    for i in range(5):
        ask(i)
    before = rss_mb(proc.pid)
    for i in range(30):
        ask(i)
    assert rss_mb(proc.pid) - before < 40, (before, rss_mb(proc.pid))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) in (0, 130)
    assert "Traceback" not in proc.stderr.read()
