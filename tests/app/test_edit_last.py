"""Up in an empty message box edits the last message sent: Enter replaces it and its answer
(on screen and in the history), Esc gives the edit up."""

from __future__ import annotations

from tests.app.pilot_helpers import notes, ready, send, wait_for

from app.widgets.prompt_input import PromptInput


def _roles_and_texts(app):
    return [(v.role, v.content) for v in app.screen.conversation.views]


async def test_up_edits_the_last_message_and_enter_replaces_it(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        box = app.screen.query_one(PromptInput)
        await pilot.press("up")
        await pilot.pause()
        assert any("No message to edit yet" in n for n in notes(app)) and not box.editing
        await send(pilot, "first question")
        await send(pilot, "second question")
        chat_id = app.screen.chat.id
        assert len(app.store.messages(chat_id)) == 4

        await pilot.press("up")
        await pilot.pause()
        assert box.editing and box.text == "second question" and box.has_class("editing")
        assert "Editing" in str(box.border_title)
        await pilot.press("escape")  # gives the edit up, keeps the conversation
        await pilot.pause()
        assert not box.editing and box.text == "" and len(app.store.messages(chat_id)) == 4

        await pilot.press("up")
        await pilot.pause()
        await pilot.press("end", *" (shorter)")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen.answer is None)
        await pilot.pause()
        shown = _roles_and_texts(app)
        assert [r for r, _ in shown] == ["user", "assistant", "user", "assistant"]
        assert shown[2][1] == "second question (shorter)" and "second question (shorter)" in shown[3][1]
        stored = app.store.messages(chat_id)
        assert [m.content for m in stored if m.role == "user"] == ["first question", "second question (shorter)"]
        assert len(stored) == 4 and not box.editing and box.border_title is None


async def test_up_with_text_in_the_box_moves_the_cursor(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        box = app.screen.query_one(PromptInput)
        box.text = "line one\nline two"
        box.move_cursor((1, 3))
        await pilot.press("up")
        await pilot.pause()
        assert not box.editing and box.cursor_location == (0, 3) and box.text == "line one\nline two"
