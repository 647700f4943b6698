"""Finding the way around at 80x24 and 140x42: footer, Keys list, sidebar, status bar, message box, copy,
delete, compare (issue 33, items 6 and 7)."""

from __future__ import annotations

import pytest
from rich.cells import cell_len
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from app.screens.compare_screen import CompareScreen
from app.screens.keys_screen import KeysScreen, key_name
from app.widgets.chat_list import ChatList
from app.widgets.prompt_input import PromptInput
from tests.app.fake_engine import answer_for
from tests.app.pilot_helpers import notes, ready, send, wait_for


def footer_keys(app) -> dict[str, FooterKey]:
    return {k.description: k for k in app.screen.query_one(Footer).query(FooterKey)}


async def test_footer_shows_quit_and_every_key_fits_at_80_columns(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.pause()
        keys = footer_keys(app)
        assert {"Quit", "Keys", "Models", "Compare"} <= set(keys)
        assert all(k.region.right <= 80 and k.region.width > 0 for k in keys.values()), \
            [(k.description, k.region) for k in keys.values()]
        assert keys["Quit"].key == "ctrl+q"


async def test_keys_from_the_palette_and_f1_list_the_apps_keys_and_esc_closes(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause(0.3)
        await pilot.press(*"Keys")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen))
        keys = dict(app.screen.rows)
        assert keys["Ctrl+Q"] == "Quit localchat" and keys["Enter"] == "Send the message"
        assert {"Ctrl+B", "Ctrl+T", "F5", "F8", "Esc", "Ctrl+L"} <= set(keys)
        assert not any("cursor" in text.lower() for text in keys.values())  # not the text box's own keys
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, KeysScreen)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, KeysScreen))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, KeysScreen)


def test_key_names_read_as_typed():
    assert [key_name(k) for k in ("ctrl+q", "f5", "escape", "shift+tab", "ctrl+l")] == \
        ["Ctrl+Q", "F5", "Esc", "Shift+Tab", "Ctrl+L"]


async def test_80x24_hides_the_sidebar_and_keeps_status_and_placeholder_whole(make_app):
    app = make_app(fixed_stats=True, model_name="SmolLM2-135M-Instruct", draft_name="demo-eagle3")
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        sidebar = app.screen.query_one("#sidebar")
        assert not sidebar.display
        box = app.screen.query_one(PromptInput)
        assert cell_len(box.placeholder) <= box.content_region.width
        await send(pilot, "hello")
        for part in ("model", "spec", "speed"):
            widget = app.screen.query_one(f"#status-{part}")
            text = str(widget.render())
            assert cell_len(text) <= widget.content_region.width and widget.region.right <= 80, (part, text)
        assert "SmolLM2-135M-Instruct" in str(app.screen.query_one("#status-model").render())
        assert "accept" in str(app.screen.query_one("#status-speed").render())
        await pilot.press("ctrl+l")  # the chat list on demand
        await pilot.pause()
        assert sidebar.display and app.screen.query_one(ChatList).titles == ["hello"]
        assert cell_len(box.placeholder) <= box.content_region.width  # the short hint in the narrower box
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert not sidebar.display


async def test_140x42_shows_the_sidebar_and_the_whole_status_line(make_app):
    app = make_app(fixed_stats=True, model_name="SmolLM2-135M-Instruct", draft_name="demo-eagle3")
    async with app.run_test(size=(140, 42)) as pilot:
        await ready(pilot)
        assert app.screen.query_one("#sidebar").display
        await send(pilot, "hello")
        assert "draft demo-eagle3" in str(app.screen.query_one("#status-model").render())
        assert "accept len 3.20" in str(app.screen.query_one("#status-speed").render())
        assert app.screen.query_one(PromptInput).placeholder == PromptInput.PLACEHOLDER


async def test_copy_mid_answer_says_it_is_the_answer_so_far(make_app):
    app = make_app(step_delay_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "stream slowly", wait=False)
        await wait_for(pilot, lambda: app.screen.answer is not None and app.screen.answer.text)
        await pilot.press("ctrl+o")
        copied = app.clipboard
        full = answer_for([{"role": "user", "content": "stream slowly"}])
        assert "so far" in notes(app)[-1] and copied and full.startswith(copied) and copied != full
        await wait_for(pilot, lambda: app.screen.answer is None)
        await pilot.press("ctrl+o")
        assert app.clipboard == full and "Copied the last answer" in notes(app)[-1]


async def test_deleting_a_chat_while_its_answer_streams_drops_it_from_the_list(make_app):
    app = make_app(step_delay_s=0.05)
    async with app.run_test(size=(110, 36)) as pilot:
        await ready(pilot)
        await send(pilot, "keep me")
        await pilot.press("ctrl+n")
        await send(pilot, "delete me", wait=False)
        await wait_for(pilot, lambda: app.screen.answer is not None and app.screen.answer.text)
        deleted = app.screen.chat.id
        await pilot.press("f8")
        await pilot.pause()
        await pilot.press("y")
        await wait_for(pilot, lambda: "delete me" not in app.screen.query_one(ChatList).titles)
        await wait_for(pilot, lambda: app.screen.answer is None)
        await pilot.pause(0.2)
        assert app.screen.query_one(ChatList).titles == ["keep me"]
        assert app.store.get_chat(deleted) is None and app.store.messages(deleted) == []
        assert not any("failed" in n.lower() for n in notes(app))


@pytest.mark.parametrize("size", [(80, 24), (140, 42)])
async def test_compare_covers_the_screen_so_no_border_peeks_out(make_app, size):
    app = make_app(fixed_stats=True)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await send(pilot, "compare")
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.pause()
        box = app.screen.query_one("#compare").region
        footer = app.screen.query_one(Footer).region
        assert (box.x, box.y, box.width, box.bottom) == (0, 0, size[0], footer.y)
