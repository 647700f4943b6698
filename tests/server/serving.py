"""A `localchat serve` for tests: the real Starlette app on uvicorn, on 127.0.0.1 in a thread of the test
process, over a real engine (a tiny random model on the CPU)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import uvicorn

from server.api import ServeOptions, build_app
from server.command import bind
from server.scheduler import Scheduler
from tests.tiny import make_tiny_model


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT (the API is under /v1)
    scheduler: Scheduler

    def client(self, **kwargs):
        import openai

        kwargs.setdefault("api_key", "none")
        kwargs.setdefault("max_retries", 0)  # a test sees each refusal, not the client's retry of it
        return openai.OpenAI(base_url=self.url + "/v1", **kwargs)


@contextmanager
def serving(engine, max_queue: int = 8, options: ServeOptions = ServeOptions(), **scheduler_kwargs) -> Iterator[Served]:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    scheduler = Scheduler(engine, max_queue, **scheduler_kwargs)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, scheduler, options), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{port}", scheduler)
    finally:
        server.should_exit = True
        thread.join(10)
        scheduler.close()
        sock.close()


class Slowed:
    """The real engine, slowed to at most one step per `delay_s`, its answers running to max_tokens
    (a random model's sampled answer may end at once): long enough answers for a test to act on one
    mid-stream or while others wait."""

    def __init__(self, engine, delay_s: float) -> None:
        self.engine, self.delay_s = engine, delay_s

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def stream_ids(self, prompt_ids, params, *args, **kwargs):
        import dataclasses

        params = dataclasses.replace(params, ignore_eos=True)
        for event in self.engine.stream_ids(prompt_ids, params, *args, **kwargs):
            time.sleep(self.delay_s)
            yield event


def tiny_engine(folder: Path, draft: Path | None = None, max_seq_len: int = 256):
    from engine import Engine

    if not (folder / "config.json").exists():
        make_tiny_model(folder, "llama")
    return Engine.load(str(folder), draft=str(draft) if draft else None, device="cpu", max_seq_len=max_seq_len)


def tiny_head(model: Path, folder: Path) -> Path:
    """A random EAGLE-3 head for the tiny model: speculation runs (and, greedy, changes no token)."""
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(model)
    return write_head(folder, cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64, (0, 1, 2))
