"""Pilot tests of the sidebar, compare, restarts, and start-up with a broken database or settings file."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from tests.app.pilot_helpers import engine_of, notes, ready, send, wait_for
from tests.app.fake_engine import answer_for
from textual.widgets import Input

from app.screens.compare_screen import CompareScreen
from app.widgets.chat_list import ChatList
from app.widgets.compare_pane import ComparePane


def titles(app) -> list[str]:
    return app.screen.query_one(ChatList).titles


async def test_new_switch_rename_delete_chats(make_app):
    app = make_app()
    async with app.run_test(size=(110, 36)) as pilot:  # wide enough for the chat list
        await ready(pilot)
        await send(pilot, "first chat")
        await pilot.click("#new-chat")
        await pilot.pause()
        assert app.screen.conversation.views == []
        await send(pilot, "second chat")
        assert titles(app) == ["second chat", "first chat"]
        chat_list = app.screen.query_one(ChatList)
        chat_list.focus()
        chat_list.highlighted = 1
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.chat.title == "first chat"
        assert [v.content for v in app.screen.conversation.views][0] == "first chat"
        await pilot.press("f2")
        await pilot.pause()
        app.screen.query_one(Input).value = "Renamed"
        await pilot.press("enter")
        await pilot.pause()
        assert "Renamed" in titles(app)
        await pilot.press("f8")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert titles(app) == ["second chat"]
        assert [c.title for c in app.store.list_chats()] == ["second chat"]
        assert app.screen.chat.title == "second chat"  # the next chat opens
        await pilot.press("f8")
        await pilot.pause()
        await pilot.press("n")  # declined: nothing deleted
        await pilot.pause()
        assert titles(app) == ["second chat"]


async def test_compare_shows_both_answers_speeds_and_identity(make_app):
    app = make_app(fixed_stats=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "compare this")
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        verdict = app.screen.query_one("#compare-verdict")
        await wait_for(pilot, lambda: "Speed-up" in str(verdict.render()))
        off, on = app.screen.query_one("#pane-off", ComparePane), app.screen.query_one("#pane-on", ComparePane)
        expected = answer_for([{"role": "user", "content": "compare this"}])
        assert off.text == on.text == expected
        text = str(verdict.render())
        assert "tokens identical" in text and "3.00× over no draft loaded" in text and "40.0 → 120.0 tok/s" in text
        assert off.token_ids == on.token_ids != []
        assert "40.0 tok/s" in str(off.query_one(".stats").render())
        assert "120 tok/s" in str(on.query_one(".stats").render())  # the short form: no decimals past 100
        # off ran on the engine without its draft (Engine.without_draft), on with the draft
        assert [(c["speculative"], c["draft_loaded"]) for c in engine_of(app).calls[-2:]] == [(False, False),
                                                                                              (True, True)]
        assert off.title == "Speculation off · no draft loaded"
        # the prompt rerun is the last user message, without the answer that followed it
        assert engine_of(app).calls[-1]["messages"][-1] == {"role": "user", "content": "compare this"}
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, CompareScreen)
        assert len(app.store.messages(app.screen.chat.id)) == 2  # compare answers are not saved


async def compare_verdict(pilot, app):
    """Opens the compare screen (Ctrl+B) and waits until both sides have run: its verdict label."""
    await pilot.press("ctrl+b")
    verdict = app.screen.query_one("#compare-verdict")
    await wait_for(pilot, lambda: "Speed-up" in str(verdict.render()))
    return verdict


async def test_compare_reports_different_texts(make_app, monkeypatch):
    from tests.app import fake_engine

    original = fake_engine.answer_for
    app = make_app(fixed_stats=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "compare this")
        calls = iter(range(100))
        monkeypatch.setattr(fake_engine, "answer_for", lambda m: original(m) + str(next(calls)))
        verdict = await compare_verdict(pilot, app)
        last = len(fake_engine.split_tokens(original([{"role": "user", "content": "compare this"}])))
        assert f"tokens differ from token {last} ✗" in str(verdict.render())  # the last word differs


async def test_compare_says_identical_only_for_the_same_tokens(make_app, monkeypatch):
    """The same text from other tokens is not identical."""
    from tests.app import fake_engine

    original = fake_engine.split_tokens
    app = make_app(fixed_stats=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "compare this")
        calls = iter(range(100))
        monkeypatch.setattr(fake_engine, "split_tokens", lambda text: original(text) if next(calls) else list(text))
        verdict = await compare_verdict(pilot, app)
        off, on = app.screen.query_one("#pane-off", ComparePane), app.screen.query_one("#pane-on", ComparePane)
        assert off.text == on.text and "tokens differ from token 1" in str(verdict.render())


async def test_compare_says_when_the_draft_stayed_loaded_for_lack_of_memory(make_app):
    app = make_app(fixed_stats=True, twin_fits=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "compare this")
        verdict = await compare_verdict(pilot, app)
        text = " ".join(str(verdict.render()).split())
        assert "3.00× over speculation off with the draft loaded (too little GPU memory" in text
        assert app.screen.query_one("#pane-off", ComparePane).title == "Speculation off · draft loaded"
        assert [(c["speculative"], c["draft_loaded"]) for c in engine_of(app).calls[-2:]] == [(False, True),
                                                                                              (True, True)]


def test_first_difference():
    from app.screens.compare_screen import first_difference

    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], [4]) == 0


async def test_restart_keeps_history_and_settings(make_app, home: Path):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "remember me")
        await pilot.press("f3")
        await pilot.pause()
        app.screen.query_one("#system-prompt-text").text = "Be brief."
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.theme = "nord"
        await pilot.press("f4")
        await pilot.pause()
        app.screen.query_one("#set-temperature", Input).value = "0.7"
        app.screen.query_one("#set-max_tokens", Input).value = "99"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.settings.temperature == 0.7
    again = make_app()
    async with again.run_test() as pilot:
        await ready(pilot)
        assert again.theme == "nord"
        assert (again.settings.temperature, again.settings.max_tokens) == (0.7, 99)
        assert titles(again) == ["remember me"]
        views = again.screen.conversation.views
        assert [v.content for v in views] == ["remember me", answer_for([{"role": "user", "content": "remember me"}])]
        assert "tok/s" in str(views[1].query_one(".stats").render())  # stats came back too
        assert again.screen.system_prompt == "Be brief."
        await send(pilot, "and now?")
        assert engine_of(again).calls[-1]["messages"][0] == {"role": "system", "content": "Be brief."}
        assert len(engine_of(again).calls[-1]["messages"]) == 4  # system, user, assistant, user


async def _save_settings(pilot, app, **values) -> str:
    """Types values into the open settings screen, presses Ctrl+S; returns its error line."""
    for name, value in values.items():
        app.screen.query_one(f"#set-{name}", Input).value = value
    await pilot.press("ctrl+s")
    await pilot.pause()
    error = app.screen.query("#settings-error")
    return str(error.first().render()) if error else ""


async def test_settings_screen_rejects_bad_values(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("f4")
        await pilot.pause()
        assert "top_p must be in (0, 1]" in await _save_settings(pilot, app, top_p="2")
        assert "repetition_penalty must be > 0" in await _save_settings(pilot, app, top_p="1", repetition_penalty="0")
        await pilot.press("escape")
        await pilot.pause()
        assert app.settings.top_p == 1.0 and app.settings.repetition_penalty == 1.0


async def test_min_p_and_repetition_penalty_reach_the_engine(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("f4")
        await pilot.pause()
        assert await _save_settings(pilot, app, repetition_penalty="1.15", min_p="0.05") == ""
        assert (app.settings.min_p, app.settings.repetition_penalty) == (0.05, 1.15)
        await send(pilot, "hello there")
        params = engine_of(app).calls[-1]["params"]
        assert (params.min_p, params.repetition_penalty) == (0.05, 1.15)


async def test_corrupt_database_is_moved_aside(make_app, home: Path):
    db = home / "data" / "chats.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"this is not an SQLite file " * 200)
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert any("could not be read" in n and "corrupt-" in n for n in notes(app))
        aside = list(db.parent.glob("chats.db.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
        await send(pilot, "fresh start")
        assert [c.title for c in app.store.list_chats()] == ["fresh start"]


async def test_a_locked_database_keeps_messages_until_it_can_write_them(make_app, home: Path):
    """Another program holds the database's write lock: the new chat and its messages stay in memory,
    marked as not saved, and are written in order once the lock is gone (by the retry timer)."""
    first = make_app()
    async with first.run_test(size=(110, 36)) as pilot:
        await ready(pilot)
        await send(pilot, "saved before the lock")
    db = home / "data" / "chats.db"
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        app = make_app()
        app.store.timeout_s = 0.2  # the product waits seconds for a lock; this test need not
        async with app.run_test(size=(110, 36)) as pilot:
            await ready(pilot)
            await pilot.click("#new-chat")
            await send(pilot, "kept while locked")
            assert any("Cannot write the chat history now (database is locked)" in n for n in notes(app))
            await send(pilot, "and this too")
            unsaved = app.screen.query_one("#status-unsaved")
            assert app.screen.status.unsaved == 5 and unsaved.display  # a chat and four messages
            assert "5 not saved yet" in str(unsaved.render())
            assert titles(app) == ["* kept while locked", "saved before the lock"]
            assert app.screen.chat.id < 0  # a provisional id until the chat is written
            lock.execute("ROLLBACK")
            await wait_for(pilot, lambda: app.screen.status.unsaved == 0, timeout_s=3 * app.screen.SAVE_RETRY_S)
            await pilot.pause()
            assert not unsaved.display and titles(app) == ["kept while locked", "saved before the lock"]
            assert any("Chat history saved" in n for n in notes(app))
            await send(pilot, "after the lock")  # the provisional id still works
    finally:
        if lock.in_transaction:
            lock.execute("ROLLBACK")
        lock.close()
    check = sqlite3.connect(db)
    chat_id, title = check.execute("SELECT id, title FROM chats ORDER BY id DESC LIMIT 1").fetchone()
    rows = check.execute("SELECT role, content FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
    check.close()
    assert title == "kept while locked" and chat_id > 0
    assert [r[0] for r in rows] == ["user", "assistant"] * 3
    assert [r[1] for r in rows][::2] == ["kept while locked", "and this too", "after the lock"]


async def test_a_chat_open_in_another_window_is_not_opened_here(make_app, home: Path):
    from app.store import ChatStore

    first = make_app()
    async with first.run_test(size=(110, 36)) as pilot:
        await ready(pilot)
        await send(pilot, "older chat")
        await pilot.click("#new-chat")
        await send(pilot, "latest chat")
    other = ChatStore.open(home / "data" / "chats.db")  # another window, on its latest chat
    latest = other.list_chats()[0]
    assert latest.title == "latest chat" and other.take_lease(latest.id) is None
    try:
        app = make_app()
        async with app.run_test(size=(110, 36)) as pilot:
            await ready(pilot)
            assert app.screen.chat is None and app.screen.conversation.views == []  # a new chat instead
            assert any(f"“latest chat” is open in another localchat window (pid {os.getpid()})" in n
                       for n in notes(app))
            chat_list = app.screen.query_one(ChatList)
            chat_list.focus()
            chat_list.highlighted = titles(app).index("latest chat")
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.chat is None and chat_list.highlighted is None  # refused, nothing changed
            assert chat_list.has_focus  # to pick another one
            chat_list.highlighted = titles(app).index("older chat")
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen.chat.title == "older chat"
            await send(pilot, "more here")
    finally:
        other.close()
    store = ChatStore.open(home / "data" / "chats.db")
    assert [m.content for m in store.messages(latest.id) if m.role == "user"] == ["latest chat"]
    older = next(c for c in store.list_chats() if c.title == "older chat")
    assert [m.content for m in store.messages(older.id) if m.role == "user"] == ["older chat", "more here"]


async def test_unknown_setting_and_bad_value_are_reported(make_app, home: Path):
    (home / "config" / "settings.toml").write_text('temperature = 0.5\ncolour = "red"\ntop_k = "many"\n')
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert any("Unknown setting 'colour'" in n for n in notes(app))
        assert any("top_k must be an integer" in n for n in notes(app))
        assert app.settings.temperature == 0.5 and app.settings.top_k == 0


async def test_missing_config_folder_is_created_with_a_message(make_app, home: Path):
    (home / "config" / "settings.toml").unlink()
    (home / "config").rmdir()
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        assert any("did not exist" in n for n in notes(app))
        assert (home / "config" / "settings.toml").exists()
