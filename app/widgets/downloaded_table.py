"""DownloadedTable: models and drafts already in the HF cache (what offline mode can use)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import DataTable

from engine.hub.local_models import LocalModel
from engine.units import format_bytes


class DownloadedTable(DataTable):
    """One row per downloaded repo; Enter posts DownloadedTable.Chosen."""

    @dataclass
    class Chosen(Message):
        model: LocalModel

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.models: dict[str, LocalModel] = {}

    def on_mount(self) -> None:
        self.add_column("Model or draft", key="name")
        self.add_column("Kind", key="kind")
        self.add_column("Size", key="size")

    def show(self, models: tuple[LocalModel, ...]) -> None:
        self.clear()
        self.models = {m.name: m for m in models}
        for m in models:
            self.add_row(m.name, "draft" if m.is_draft else "model", format_bytes(m.size_bytes), key=m.name)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        model = self.models.get(str(event.row_key.value))
        if model is not None:
            self.post_message(self.Chosen(model))
