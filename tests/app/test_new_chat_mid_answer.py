"""Ctrl+N while an answer streams: the answer stops, and the new chat answers the next prompt."""

from tests.app.pilot_helpers import ready, send, wait_for


async def test_new_chat_mid_answer(make_app):
    app = make_app(step_delay_s=0.05)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "long answer please", wait=False)
        await wait_for(pilot, lambda: app.screen.conversation.views and app.screen.conversation.views[-1].content != "")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.screen.answer is None)
        await pilot.pause(0.3)
        assert app.is_running
        await send(pilot, "next")
        assert app.screen.conversation.views[-1].content.startswith("You said: **next**")
