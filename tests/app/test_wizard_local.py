"""The wizard's Local tab and catalog at 80x24 and 140x42 (issue 33, items 5 and 7)."""

from __future__ import annotations

import pytest
from rich.cells import cell_len
from textual.widgets import DataTable, Input, TabbedContent

from app.widgets.catalog_table import choose_layout, short_repo
from app.widgets.path_label import fit_path
from tests.app.test_wizard import NOT_DONE, WizardApp, text_of, until
from tests.hub_fixtures import fake_hub, hub_env  # noqa: F401

LONG = "a folder with a rather long name/another level of folders/and one more/SmolLM2-135M-Instruct.Q4_1.gguf"


async def type_local_path(pilot, screen, path: str) -> Input:
    screen.query_one("#tabs", TabbedContent).active = "local-pane"
    box = screen.query_one("#local-path", Input)
    box.focus()
    box.value = path
    await pilot.pause()
    return box


def lines_of(screen, selector: str) -> list[str]:
    return text_of(screen, selector).splitlines()


async def test_ctrl_d_in_the_path_box_uses_the_typed_gguf(hub_env, tmp_path):
    gguf = tmp_path / LONG
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")  # the wizard only checks that it is there; loading it is the engine's job
    app = WizardApp()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await type_local_path(pilot, screen, str(gguf))
        await pilot.press("ctrl+d")  # no Enter first: Ctrl+D takes what is typed
        await until(pilot, lambda: app.result is not NOT_DONE)
    assert app.result == (str(gguf), None)


@pytest.mark.parametrize("typed", ["/no/such/dir/" + LONG, "models/SmolLM2"])
async def test_a_missing_path_says_no_such_file_or_folder(hub_env, typed):
    app = WizardApp()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await type_local_path(pilot, screen, typed)
        await pilot.press("ctrl+d")
        await until(pilot, lambda: text_of(screen, "#message") != "")
        message = text_of(screen, "#message")
        assert message.startswith("no such file or folder:") and "Hub repository" not in message
        lines = lines_of(screen, "#message")
        if len(lines) == 1:
            assert typed in message
        else:  # too long for one line: the path on a line of its own, its end whole
            assert lines[0] == "no such file or folder:" and typed.endswith(lines[1].lstrip("…"))
        width = screen.query_one("#message").content_region.width
        assert all(cell_len(line) <= width for line in lines)
        assert app.result is NOT_DONE


async def test_a_long_path_loses_its_start_not_its_name(hub_env, tmp_path):
    gguf = tmp_path / LONG
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")
    app = WizardApp()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await type_local_path(pilot, screen, str(gguf))
        await pilot.press("enter")
        await until(pilot, lambda: screen.choice is not None)
        target = lines_of(screen, "#target")
        assert len(target) == 1 and target[0].startswith("…") and target[0].endswith("Q4_1.gguf")
        assert cell_len(target[0]) <= screen.query_one("#target").content_region.width
        assert "GGUF file SmolLM2-135M-Instruct.Q4_1.gguf" in text_of(screen, "#summary")


@pytest.mark.parametrize("size, columns", [((140, 42), ["model", "size", "fit", "licence", "draft"]),
                                           ((80, 24), ["model", "size", "fit"])])
async def test_catalog_columns_fit_whole(hub_env, size, columns):
    app = WizardApp()
    async with app.run_test(size=size) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.env is not None)
        await pilot.pause()
        table = screen.query_one("#catalog", DataTable)
        assert [str(c.value) for c in table.columns] == columns
        assert table.virtual_size.width <= table.scrollable_content_region.width  # nothing scrolled off
        for key, column in table.columns.items():
            widest = max(cell_len(str(table.get_cell(row, key))) for row in table.rows)
            assert widest <= column.get_render_width(table) - 2 * table.cell_padding, key.value
        if "draft" in columns:
            assert table.get_cell("llama-3.1-8b", "draft") == "EAGLE3-LLaMA3.1-Instruct-8B"
        assert "no GPU" in str(table.get_cell("demo", "fit")) or "fits" in str(table.get_cell("demo", "fit"))


def test_choose_layout_drops_the_owner_then_columns():
    widths = {"model": 41, "size": 8, "fit": 21, "licence": 16, "draft": 43}
    assert choose_layout(200, widths, 35).columns == ("model", "size", "fit", "licence", "draft")
    assert not choose_layout(200, widths, 35).short_draft
    assert choose_layout(136, widths, 35).short_draft
    assert choose_layout(110, widths, 35).columns == ("model", "size", "fit", "draft")
    narrow = choose_layout(76, widths, 35)
    assert narrow.columns == ("model", "size", "fit") and narrow.model_width is None
    assert choose_layout(60, widths, 35).model_width == 60 - 10 - 23 - 2  # shortened, not dropped
    assert short_repo("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B") == "EAGLE3-LLaMA3.1-Instruct-8B"
    assert short_repo("mtp:builtin") == "mtp:builtin"


def test_fit_path_shortens_the_path_from_the_left_only():
    path = "/home/someone/models/" + LONG  # with spaces in its folder names
    one = fit_path(f"Model {path}", path, 40)
    assert cell_len(one) == 40 and one.startswith("Model …") and one.endswith("Q4_1.gguf")
    wrapped = fit_path(f"no such file or folder: {path} (give a folder)", path, 30, wrap=True).splitlines()
    assert wrapped[0] == "no such file or folder:" and wrapped[2] == "(give a folder)"
    assert cell_len(wrapped[1]) == 30 and wrapped[1].startswith("…") and path.endswith(wrapped[1][1:])
    assert fit_path(f"short: {path}", path, 200) == f"short: {path}"
    assert fit_path("no path in this long text", "/x/y", 10) == "no path in this long text"
