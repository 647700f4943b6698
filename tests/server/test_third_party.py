"""The app's remote engine and the `openai` client against a third-party OpenAI-compatible server:
llama-cpp-python's, serving the demo GGUF on the CPU. Marked `third_party` (CI may leave it out: the
package builds llama.cpp from source) and skipped where llama-cpp-python is not installed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import openai
import pytest

from app.remote import RemoteChoice, RemoteEngine
from app.settings import Settings, save_settings
from app.tui import LocalChatApp
from engine.types import SamplingParams
from tests.app.conftest import home  # noqa: F401 (the app's fixture: a fresh LOCALCHAT_HOME)
from tests.app.pilot_helpers import notes, ready, send, wait_for

pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.third_party]

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llama_server(demo_gguf):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(demo_gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "2048", "--model_alias", "smollm2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "llama-cpp-python's server did not start"
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(20)


def test_openai_client_against_llama_cpp(llama_server):
    client = openai.OpenAI(base_url=llama_server + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=16, temperature=0)
    text = reply.choices[0].message.content
    assert "Paris" in text and reply.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=16, temperature=0, stream=True) if c.choices)
    # Not compared with `text`: llama-cpp-python's greedy answers depend on what it has cached from earlier
    # requests (the same request gave "The capital of France is Paris." and "La femme de France, ...").
    assert streamed.strip()


def test_remote_engine_against_llama_cpp(llama_server):
    engine = RemoteEngine.connect(RemoteChoice(llama_server))
    assert engine.model_name == "smollm2" and not engine.is_localchat and not engine.has_draft
    events = list(engine.stream(MESSAGES, SamplingParams(max_tokens=16), speculative=True))
    assert "".join(e.text for e in events).strip() and events[-1].finished
    stats = events[-1].stats
    assert stats.generated_tokens > 1 and stats.ttft_s > 0 and not stats.speculative


async def test_app_chats_with_llama_cpp(home, llama_server):
    save_settings(home / "config" / "settings.toml", Settings(max_tokens=24))
    app = LocalChatApp(remote=RemoteChoice(llama_server))
    async with app.run_test(size=(140, 40)) as pilot:
        await ready(pilot)
        assert app.runner.engine is not None, notes(app)
        spec = app.screen.query_one("#status-spec")
        await wait_for(pilot, lambda: "server's" in str(spec.render()))
        await send(pilot, "What is the capital of France?", wait=False)
        await wait_for(pilot, lambda: app.screen.answer is None, timeout_s=60)  # a busy CPU: minutes, not seconds
        saved = app.store.messages(app.screen.chat.id)[-1]
        assert saved.content.strip() and saved.finish_reason in ("stop", "length")
        assert saved.stats["decode_tok_s"] > 0 and saved.stats["ttft_s"] > 0 and not saved.stats["speculative"]
        await pilot.press("ctrl+t")  # greyed out: this server decides on speculation itself
        await pilot.pause()
        assert any("decides on speculation itself" in n for n in notes(app)) and app.screen.speculative
