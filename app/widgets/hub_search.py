"""HubSearch: search the Hub by name and pick a result as the model or as its draft."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, DataTable, Input


@dataclass(frozen=True)
class SearchHit:
    repo_id: str
    downloads: int
    is_gated: bool


class HubSearch(Vertical):
    """Posts Query when the user searches and Picked when a result is chosen; the screen does the I/O."""

    DEFAULT_CSS = """
    HubSearch { height: 1fr; }
    HubSearch Horizontal { height: auto; }
    HubSearch Input { width: 1fr; }
    HubSearch DataTable { height: 1fr; }
    """

    @dataclass
    class Query(Message):
        text: str

    @dataclass
    class Picked(Message):
        repo_id: str
        as_draft: bool

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Input(compact=True, placeholder="search the Hub by name, e.g. qwen3 eagle3", id="search-text")
            yield Button("Search", id="search-go", compact=True)
        yield DataTable(cursor_type="row", zebra_stripes=True, id="search-results")
        with Horizontal():
            yield Button("Use as model", id="pick-model", variant="primary", compact=True)
            yield Button("Use as draft", id="pick-draft", compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("Repository", key="repo")
        table.add_column("Downloads", key="downloads")
        table.add_column("", key="gated")

    def show(self, hits: list[SearchHit]) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for h in hits:
            table.add_row(h.repo_id, f"{h.downloads:,}", "gated" if h.is_gated else "", key=h.repo_id)
        if hits:
            table.focus()

    def _selected(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip():
            self.post_message(self.Query(event.value.strip()))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.post_message(self.Picked(str(event.row_key.value), as_draft=False))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "search-go":
            text = self.query_one("#search-text", Input).value.strip()
            if text:
                self.post_message(self.Query(text))
        elif (repo := self._selected()) is not None:
            self.post_message(self.Picked(repo, as_draft=event.button.id == "pick-draft"))
