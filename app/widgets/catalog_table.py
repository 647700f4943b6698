"""CatalogTable: the known target + draft pairs with download size, licence, and GPU fit."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import DataTable

from engine.catalog import Catalog, CatalogEntry
from engine.fit import FitEstimate
from engine.units import format_bytes

FIT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red", "no GPU": "dim"}


class CatalogTable(DataTable):
    """One row per catalog entry; Enter (or a click) on a row posts CatalogTable.Chosen."""

    @dataclass
    class Chosen(Message):
        entry: CatalogEntry

    def __init__(self, catalog: Catalog, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.catalog = catalog

    def on_mount(self) -> None:
        # the draft's long repo id goes last, so narrow terminals still show size and fit
        self.add_column("Model", key="model")
        self.add_column("Download", key="size")
        self.add_column("Fit", key="fit")
        self.add_column("Licence", key="licence")
        self.add_column("Draft", key="draft")
        for e in self.catalog.entries:
            draft = "shipped EAGLE-3 head" if e.draft and e.draft.is_shipped else (e.draft.repo if e.draft else "-")
            licence = e.target.licence + (" (gated)" if e.target.is_gated else "")
            self.add_row(e.label, format_bytes(e.download_bytes), "…", licence, draft, key=e.id)

    def show_fits(self, fits: dict[str, FitEstimate], cached: set[str]) -> None:
        """Fill the Fit column; entries whose target is already downloaded say so."""
        for e in self.catalog.entries:
            fit = fits.get(e.id)
            if fit is None:
                text = ""
            elif fit.available_bytes is None:
                text = f"needs {format_bytes(fit.need_bytes)}, no GPU"
            else:
                text = f"{fit.verdict} ({format_bytes(fit.need_bytes)})"
            if e.id in cached:
                text += " · downloaded"
            style = FIT_STYLE.get(fit.verdict, "") if fit else ""
            self.update_cell(e.id, "fit", f"[{style}]{text}[/]" if style else text, update_width=True)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        entry = self.catalog.by_id(str(event.row_key.value))
        if entry is not None:
            self.post_message(self.Chosen(entry))
