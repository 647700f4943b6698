"""Pilot tests of the chat screen on the fake engine: send, stream, stop, regenerate, copy, speculation."""

from __future__ import annotations

import threading
import time

from tests.app.pilot_helpers import engine_of, notes, ready, send, wait_for
from tests.app.fake_engine import answer_for
from textual.widgets import Markdown

from app.widgets.message_view import MessageView
from app.widgets.prompt_input import PromptInput
from app.widgets.stats_line import StatsLine
from app.widgets.status_bar import StatusBar


def answer_text(app) -> str:
    return app.screen.conversation.views[-1].content


async def test_send_streams_markdown_answer_and_saves_it(make_app, monkeypatch):
    partial = []
    original = MessageView.append

    async def recording_append(self, text, stats):
        await original(self, text, stats)
        partial.append(len(self.content))

    monkeypatch.setattr(MessageView, "append", recording_append)
    app = make_app(step_delay_s=0.01)
    async with app.run_test(size=(110, 36)) as pilot:
        await ready(pilot)
        await send(pilot, "Tell me about drafts")
        expected = answer_for([{"role": "user", "content": "Tell me about drafts"}])
        assert answer_text(app) == expected
        assert any(0 < n < len(expected) for n in partial), partial
        view = app.screen.conversation.views[-1]
        assert view.query("MarkdownFence") and view.query("MarkdownBulletList")  # rendered as Markdown
        stats = str(view.query_one(StatsLine).render())
        assert "tok/s" in stats and "TTFT" in stats and "accept" in stats
        assert "tok/s" in str(app.screen.query_one("#status-speed").render())
        saved = app.store.messages(app.screen.chat.id)
        assert [m.role for m in saved] == ["user", "assistant"]
        assert saved[1].content == expected and saved[1].stats["generated_tokens"] > 0
        assert app.screen.query_one(PromptInput).text == ""


async def test_multiline_input_enter_sends_ctrl_j_and_shift_enter_add_lines(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert app.screen.query_one(PromptInput).text == "a\nb\nc"
        assert app.screen.answer is None
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen.answer is None and len(app.screen.conversation.views) == 2)
        assert app.screen.conversation.views[0].content == "a\nb\nc"


async def test_escape_stops_the_answer_at_once(make_app):
    app = make_app(step_delay_s=0.1)
    async with app.run_test() as pilot:
        await ready(pilot)
        t0 = time.monotonic()
        await send(pilot, "a long answer please", wait=False)
        await wait_for(pilot, lambda: len(answer_text(app)) > 0)
        start = time.monotonic()
        shown = len(answer_text(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen.answer is None)
        # within a few of the 0.1 s steps (the test's own polling and the UI's handling have taken
        # over 0.5 s on a loaded 2-core machine), where running on would take the whole answer
        assert time.monotonic() - start < 1.0
        full = answer_for([{"role": "user", "content": "a long answer please"}])
        assert 0 < len(answer_text(app)) < len(full), (start - t0, shown, time.monotonic() - start)
        assert "stopped" in str(app.screen.conversation.views[-1].query_one(StatsLine).render())
        saved = app.store.messages(app.screen.chat.id)[-1]
        assert saved.finish_reason == "cancelled" and saved.content == answer_text(app)
        await send(pilot, "next")  # the engine is free again
        assert answer_text(app).startswith("You said: **next**")


async def test_toggle_speculation_key_and_palette(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        status = app.screen.query_one(StatusBar)
        assert status.speculative
        await pilot.press("ctrl+t")
        assert not status.speculative and "SPEC OFF" in str(status.query_one("#status-spec").render())
        await send(pilot, "plain please")
        # plain decoding on the engine without its draft (the faster kernels), as compare's off side
        assert engine_of(app).calls[-1]["speculative"] is False and engine_of(app).calls[-1]["draft_loaded"] is False
        assert "spec off" in str(app.screen.conversation.views[-1].query_one(StatsLine).render())
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Toggle speculation")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert status.speculative
        await send(pilot, "fast please")
        assert engine_of(app).calls[-1]["speculative"] is True and engine_of(app).calls[-1]["draft_loaded"] is True
        # the model was loaded once: toggling never reloads
        assert len(app.runner.factory.made) == 1


async def test_speculation_off_keeps_the_draft_loaded_where_a_twin_does_not_fit(make_app):
    app = make_app(twin_fits=False)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+t")
        await send(pilot, "plain please")
        assert engine_of(app).calls[-1]["speculative"] is False and engine_of(app).calls[-1]["draft_loaded"] is True


async def test_where_speculation_is_slower_it_starts_off_and_says_why(make_app):
    """An engine on which plain decoding is the faster default (a CPU): the settings' "on" turns
    into off at load, the status bar says why, and Ctrl+T still turns it on."""
    app = make_app(spec_pays=(False, "slower on a CPU"))
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(pilot)
        status = app.screen.query_one(StatusBar)
        assert not status.speculative
        assert "SPEC OFF: slower on a CPU" in str(status.query_one("#status-spec").render())
        await send(pilot, "plain by default")
        assert engine_of(app).calls[-1]["speculative"] is False
        await pilot.press("ctrl+t")
        assert status.speculative and "SPEC ON" in str(status.query_one("#status-spec").render())
        await send(pilot, "on as asked")
        assert engine_of(app).calls[-1]["speculative"] is True
        await pilot.press("ctrl+t")  # off again: by choice now, so no reason shown
        assert str(status.query_one("#status-spec").render()).strip() == "SPEC OFF"


async def test_regenerate_replaces_the_last_answer(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await pilot.press("ctrl+r")
        await pilot.pause()
        await wait_for(pilot, lambda: app.screen.answer is None)
        assert len(engine_of(app).calls) == 2
        assert engine_of(app).calls[1]["messages"][-1] == {"role": "user", "content": "hello"}
        assert [v.role for v in app.screen.conversation.views] == ["user", "assistant"]
        assert [m.role for m in app.store.messages(app.screen.chat.id)] == ["user", "assistant"]


async def test_copy_last_answer_and_a_chosen_message(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "copy me")
        await pilot.press("ctrl+o")
        assert app.clipboard == answer_text(app)
        user_view = app.screen.conversation.views[0]
        user_view.focus()
        await pilot.press("c")
        assert app.clipboard == "copy me"


async def test_system_prompt_is_per_chat_and_sent_to_the_engine(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await pilot.press("f3")
        await pilot.pause()
        area = app.screen.query_one("#system-prompt-text")
        area.text = "Answer like a pirate."
        await pilot.press("ctrl+s")
        await pilot.pause()
        await send(pilot, "second")
        assert engine_of(app).calls[-1]["messages"][0] == {"role": "system", "content": "Answer like a pirate."}
        assert app.store.get_chat(app.screen.chat.id).system_prompt == "Answer like a pirate."
        await pilot.press("ctrl+n")
        await pilot.pause()
        await send(pilot, "new chat")
        assert engine_of(app).calls[-1]["messages"][0]["content"] == app.settings.system_prompt


async def test_engine_runs_on_one_thread_off_the_ui(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        threads = {call["thread"] for call in engine_of(app).calls}
        assert len(threads) == 1 and threading.get_ident() not in threads


async def test_model_load_failure_is_a_notification_and_the_app_keeps_running(make_app):
    from engine.errors import ModelLoadError

    app = make_app(fail_load=ModelLoadError("model 'nope' not found"))
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.pause()
        assert any("nope" in n for n in notes(app))
        assert "no model" in str(app.screen.query_one("#status-model").render())
        await send(pilot, "hello?")
        assert app.screen.conversation.views == []
        assert app.screen.query_one(PromptInput).text == "hello?"  # kept, not lost
        assert any("No model is loaded" in n for n in notes(app))
        await pilot.press("ctrl+n")  # still responsive
        assert app.is_running


async def test_out_of_memory_while_generating_is_a_notification(make_app):
    app = make_app(fail_stream=MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "big")
        assert any(n.startswith("Out of memory") for n in notes(app))
        assert app.screen.answer is None and app.is_running
        assert [m.role for m in app.store.messages(app.screen.chat.id)] == ["user"]


async def test_markdown_updates_are_throttled(make_app):
    app = make_app(step_delay_s=0.001)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+t")  # plain decoding: one event per token
        calls = []
        original = Markdown.append

        def counting_append(self, markdown):
            calls.append(markdown)
            return original(self, markdown)

        Markdown.append = counting_append
        try:
            started = time.monotonic()
            await send(pilot, "x")
            elapsed = time.monotonic() - started
        finally:
            Markdown.append = original
        tokens = len(answer_text(app).split())
        assert len(calls) < tokens / 2  # coalesced: far fewer refreshes than tokens
        assert len(calls) <= 30 * elapsed + 2


async def test_conversation_follows_the_end_once_it_overflows(make_app):
    app = make_app()
    async with app.run_test(size=(90, 24)) as pilot:
        await ready(pilot)
        conversation = app.screen.conversation
        # a short chat sits at the top, not sunk to the bottom
        assert conversation.scroll_y == 0 and conversation.query_one("#system-prompt").region.y <= 2
        for prompt in ("one", "two", "three"):
            await send(pilot, prompt)
            await pilot.pause()
            assert conversation.max_scroll_y > 0 and conversation.scroll_y == conversation.max_scroll_y


async def test_quitting_mid_answer_keeps_what_was_written(make_app):
    app = make_app(step_delay_s=0.1)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "quit soon", wait=False)
        await wait_for(pilot, lambda: len(answer_text(app)) > 0)
        shown = answer_text(app)
        chat_id = app.screen.chat.id
        await pilot.press("ctrl+q")
    again = make_app()
    async with again.run_test() as pilot:
        saved = again.store.messages(chat_id)
        assert [m.role for m in saved] == ["user", "assistant"]
        assert saved[1].finish_reason == "cancelled" and saved[1].content.startswith(shown)
        assert saved[1].stats["generated_tokens"] > 0  # what it cost so far, as a stopped answer keeps


async def test_new_chat_mid_answer_stops_it_and_keeps_it_in_its_chat(make_app):
    app = make_app(step_delay_s=0.05)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "a long answer please", wait=False)
        await wait_for(pilot, lambda: len(answer_text(app)) > 0)
        chat_id = app.screen.chat.id
        await pilot.press("ctrl+n")  # the answer's view is gone: its last updates must go nowhere, quietly
        await wait_for(pilot, lambda: app.screen.answer is None)
        await pilot.pause(0.2)
        assert app.is_running and app.screen.conversation.views == []
        saved = app.store.messages(chat_id)
        assert [m.role for m in saved] == ["user", "assistant"] and saved[1].finish_reason == "cancelled"
        await send(pilot, "next")
        assert answer_text(app).startswith("You said: **next**")
