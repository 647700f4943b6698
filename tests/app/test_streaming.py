"""The engine thread's side of streaming (held jobs, AnswerStream, time to first token), the UI's pacing and
MarkdownFeed."""

from __future__ import annotations

import threading
import time

import pytest
from textual.app import App
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownBlock

from app import pacing
from app.engine_worker import EngineWorker
from app.settings import Settings
from app.widgets.markdown_feed import PLACEHOLDER, MarkdownFeed
from tests.app.fake_engine import answer_for, fake_factory

MESSAGES = [{"role": "user", "content": "hi"}]


class Inbox:
    """Stands in for the screen: collects what the engine thread posts."""

    def __init__(self) -> None:
        self.messages: list = []
        self.lock = threading.Lock()

    def post_message(self, message) -> bool:
        with self.lock:
            self.messages.append(message)
        return True

    def of(self, kind) -> list:
        with self.lock:
            return [m for m in self.messages if isinstance(m, kind)]

    def wait_for(self, kind, timeout_s: float = 5.0):
        deadline = time.monotonic() + timeout_s
        while not self.of(kind):
            assert time.monotonic() < deadline, f"no {kind.__name__} arrived: {self.messages}"
            time.sleep(0.005)
        return self.of(kind)[-1]


@pytest.fixture
def runner():
    inbox = Inbox()
    runner = EngineWorker(fake_factory(step_delay_s=0.002))
    runner.start(inbox)
    inbox.wait_for(EngineWorker.Loaded)
    yield runner, inbox
    runner.shutdown()


def test_a_held_job_decodes_only_once_released_and_counts_the_wait_in_ttft(runner):
    runner, inbox = runner
    job = runner.generate(inbox, MESSAGES, Settings(), speculative=True, hold=True)
    time.sleep(0.2)
    assert runner.factory.made[-1].calls == [] and not inbox.of(EngineWorker.Started)
    runner.release(job)
    started = inbox.wait_for(EngineWorker.Started)
    finished = inbox.wait_for(EngineWorker.Finished)
    assert started.job_id == finished.job_id == job
    assert finished.text == answer_for(MESSAGES) == started.stream.text
    assert finished.stats.ttft_s >= 0.2  # from the request, not from when decoding was let start
    assert not runner.busy


def test_asked_while_loading_time_to_first_token_counts_from_the_load():
    inbox = Inbox()
    runner = EngineWorker(fake_factory(load_delay_s=0.4, step_delay_s=0.002))
    runner.start(inbox)
    try:
        job = runner.generate(inbox, MESSAGES, Settings(), speculative=False, hold=True)
        runner.release(job)
        finished = inbox.wait_for(EngineWorker.Finished)
        assert inbox.of(EngineWorker.Loaded) and 0 < finished.stats.ttft_s < 0.3
    finally:
        runner.shutdown()


def test_stop_cancels_a_held_job_at_once(runner):
    runner, inbox = runner
    job = runner.generate(inbox, MESSAGES, Settings(), speculative=False, hold=True)
    t0 = time.monotonic()
    runner.stop()
    finished = inbox.wait_for(EngineWorker.Finished)
    assert finished.job_id == job and finished.finish_reason == "cancelled" and time.monotonic() - t0 < 0.5
    assert runner.factory.made[-1].calls == []


def test_a_held_job_starts_anyway_if_never_released(runner, monkeypatch):
    runner, inbox = runner
    monkeypatch.setattr(EngineWorker, "HOLD_MAX_S", 0.1)
    runner.generate(inbox, MESSAGES, Settings(), speculative=False, hold=True)
    assert inbox.wait_for(EngineWorker.Finished).finish_reason == "stop"


def test_the_engine_thread_posts_no_message_per_token(runner):
    runner, inbox = runner
    runner.generate(inbox, MESSAGES, Settings(), speculative=False)  # plain: one event per token
    finished = inbox.wait_for(EngineWorker.Finished)
    assert finished.stats.generated_tokens > 20
    assert len(inbox.of(EngineWorker.Started)) == 1
    stream = inbox.of(EngineWorker.Started)[0].stream
    first = stream.take()
    assert first and stream.take() == stream.text[len(first):] and stream.take() == ""


class Clock:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 1.0


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(pacing.time, "perf_counter", lambda: clock.wall)
    monkeypatch.setattr(pacing.time, "thread_time", lambda: clock.cpu)
    return clock


def test_pacer_keeps_the_main_thread_under_its_budget(clock):
    pacer = pacing.UpdatePacer()
    budget = pacing.UpdatePacer.BUDGET
    pacer.updated()
    clock.wall += 0.05
    clock.cpu += 0.010  # an update that cost 10 ms of main-thread time
    wait = pacer.wait_s()
    assert wait == pytest.approx((0.010 - 0.05 * budget) / budget)
    clock.wall += wait
    assert pacer.wait_s() == pytest.approx(0.0, abs=1e-9)
    clock.wall += 10  # a long quiet spell saves up only a little
    clock.cpu += 0.002
    assert pacer.wait_s() == 0.0
    pacer.updated()
    clock.cpu += 0.002 + pacing.UpdatePacer.BURST_S
    assert pacer.wait_s() == pytest.approx(0.002 / budget)


def test_pacer_shows_progress_at_least_min_fps(clock):
    pacer = pacing.UpdatePacer()
    pacer.updated()
    clock.cpu += 1.0  # hugely expensive updates
    clock.wall += 0.1
    assert pacer.wait_s() == pytest.approx(1 / pacing.UpdatePacer.MIN_FPS - 0.1)
    clock.wall += 1 / pacing.UpdatePacer.MIN_FPS
    assert pacer.wait_s() == 0.0


class MarkdownApp(App):
    def compose(self):
        yield Markdown()


def blocks(markdown: Markdown) -> list[tuple[str, str]]:
    return [(type(b).__name__, str(b.render())) for b in markdown.query(MarkdownBlock)]


async def test_the_first_text_replaces_the_placeholder_block_in_place():
    app = MarkdownApp()
    async with app.run_test() as pilot:
        markdown = app.query_one(Markdown)
        feed = MarkdownFeed(markdown)
        await feed.start()
        await pilot.pause()
        assert blocks(markdown) == [("MarkdownParagraph", PLACEHOLDER)]
        placeholder = markdown.query_one(MarkdownBlock)
        await feed.append("Hello")
        await pilot.pause()
        assert blocks(markdown) == [("MarkdownParagraph", "Hello")] and markdown.query_one(MarkdownBlock) is placeholder
        await feed.append(" world\n\n- a\n")
        await feed.finish("Hello world\n\n- a\n- b\n\nEnd")
        await pilot.pause()
        assert markdown.source == "Hello world\n\n- a\n- b\n\nEnd"
        assert [kind for kind, _ in blocks(markdown)][:2] == ["MarkdownParagraph", "MarkdownBulletList"]
        assert PLACEHOLDER not in "".join(text for _, text in blocks(markdown))


async def test_an_answer_that_never_starts_leaves_no_placeholder():
    app = MarkdownApp()
    async with app.run_test() as pilot:
        markdown = app.query_one(Markdown)
        feed = MarkdownFeed(markdown)
        await feed.start()
        await feed.append("\n")  # whitespace: still the placeholder
        await feed.finish("\n")
        await pilot.pause()
        assert blocks(markdown) == []


async def test_stats_line_takes_the_short_form_where_the_full_one_would_wrap():
    from textual.app import App

    from app.widgets.stats_line import StatsLine

    stats = {"decode_tok_s": 1437.2, "ttft_s": 0.015, "generated_tokens": 256, "speculative": True,
             "draft_steps": 5, "accept_len_mean": 2.74}

    class One(App):
        CSS = "StatsLine { width: 100%; }"

        def compose(self):
            yield StatsLine()

    for width, want in ((120, "· 256 tokens · spec k=5, accept len 2.74"), (60, "1437 tok/s · TTFT 15 ms · accept 2.74")):
        app = One()
        async with app.run_test(size=(width, 5)) as pilot:
            line = app.query_one(StatsLine)
            line.show_stats(stats, model="SmolLM2-135M-Instruct (Q4_1 GGUF)")
            await pilot.pause()
            assert want in str(line.render()), (width, str(line.render()))
            if width == 60:  # wider again: the full line comes back
                await pilot.resize_terminal(140, 5)
                await pilot.pause()
                assert "spec k=5" in str(line.render())
