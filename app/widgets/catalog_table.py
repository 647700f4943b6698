"""CatalogTable: the known target + draft pairs with download size, licence, and GPU fit."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from engine.hub.catalog import Catalog, CatalogEntry
from engine.hub.fit import FitEstimate
from engine.units import format_bytes

FIT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "red", "no GPU": "dim"}
TITLES = {"model": "Model", "size": "Download", "fit": "Fit", "licence": "Licence", "draft": "Draft"}
MIN_MODEL_WIDTH = 22  # a shortened model label still names the model
CELL_PADDING = 2  # DataTable's default: one cell each side of a column


@dataclass(frozen=True)
class Layout:
    columns: tuple[str, ...]
    short_draft: bool  # drafts shown without their owner ("EAGLE3-LLaMA3.1-Instruct-8B")
    model_width: int | None  # the model label's width when shortened, else None


# Widest first; then what goes when the table is narrower: the draft's owner, the licence, the draft, the size.
CHOICES = (
    (("model", "size", "fit", "licence", "draft"), False),
    (("model", "size", "fit", "licence", "draft"), True),
    (("model", "size", "fit", "draft"), True),
    (("model", "size", "fit"), True),
    (("model", "fit"), True),
)


def short_repo(repo: str) -> str:
    """'owner/name' -> 'name' (the name alone usually says which model the draft is for)."""
    return repo.split("/", 1)[1] if repo.count("/") == 1 else repo


def choose_layout(width: int, widths: dict[str, int], short_draft_width: int) -> Layout:
    """The first of CHOICES whose columns fit in `width` cells, every cell whole; from the third on, the model
    label may be shortened (to MIN_MODEL_WIDTH at least) rather than dropping one more column."""
    for i, (columns, short) in enumerate(CHOICES):
        natural = {**widths, "draft": short_draft_width if short else widths["draft"]}
        others = sum(natural[c] + CELL_PADDING for c in columns if c != "model")
        room = width - others - CELL_PADDING
        if room >= natural["model"]:
            return Layout(columns, short, None)
        if i >= 2 and room >= MIN_MODEL_WIDTH:
            return Layout(columns, short, room)
    columns, short = CHOICES[-1]
    return Layout(columns, short, MIN_MODEL_WIDTH)


class CatalogTable(DataTable):
    """One row per catalog entry; Enter (or a click) on a row posts CatalogTable.Chosen. The columns follow
    the table's width: see choose_layout."""

    @dataclass
    class Chosen(Message):
        entry: CatalogEntry

    def __init__(self, catalog: Catalog, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.catalog = catalog
        self.fits: dict[str, str] = {e.id: "…" for e in catalog.entries}  # catalog id -> Fit cell (markup)
        self.cached: set[str] = set()
        self.column_layout: Layout | None = None

    def on_mount(self) -> None:
        self._fill()

    def on_resize(self) -> None:
        self._fill()

    def cells(self, e: CatalogEntry, short_draft: bool) -> dict[str, str | Text]:
        if e.draft is None:
            draft = "-"
        elif e.draft.is_shipped:
            draft = "shipped EAGLE-3 head"
        else:
            draft = short_repo(e.draft.repo) if short_draft else e.draft.repo
        licence = e.target.licence + (" (gated)" if e.target.is_gated else "")
        size = "downloaded" if e.id in self.cached else format_bytes(e.download_bytes)
        return {"model": e.label, "size": size, "fit": Text.from_markup(self.fits[e.id]), "licence": licence,
                "draft": draft}

    def _widths(self, short_draft: bool) -> dict[str, int]:
        widths = {key: cell_len(title) for key, title in TITLES.items()}
        for e in self.catalog.entries:
            for key, cell in self.cells(e, short_draft).items():
                widths[key] = max(widths[key], cell.cell_len if isinstance(cell, Text) else cell_len(cell))
        return widths

    def _fill(self) -> None:
        """(Re)builds the columns when the layout changes, else only the cells; the cursor stays on its row."""
        width = self.scrollable_content_region.width
        if not width:
            return
        layout = choose_layout(width, self._widths(False), self._widths(True)["draft"])
        row = self.cursor_row
        if layout != self.column_layout:
            self.clear(columns=True)
            for key in layout.columns:
                self.add_column(TITLES[key], key=key, width=layout.model_width if key == "model" else None)
            for e in self.catalog.entries:
                cells = self.cells(e, layout.short_draft)
                self.add_row(*(self._fit(cells[key], key, layout) for key in layout.columns), key=e.id)
            self.column_layout = layout
            self.move_cursor(row=row)
            return
        for e in self.catalog.entries:
            cells = self.cells(e, layout.short_draft)
            for key in layout.columns:
                self.update_cell(e.id, key, self._fit(cells[key], key, layout), update_width=True)

    @staticmethod
    def _fit(cell: str | Text, key: str, layout: Layout) -> str | Text:
        if key == "model" and layout.model_width is not None and isinstance(cell, str):
            return cell if cell_len(cell) <= layout.model_width else cell[: layout.model_width - 1] + "…"
        return cell

    def show_fits(self, fits: dict[str, FitEstimate], cached: set[str]) -> None:
        """Fill the Fit column, and say which targets are downloaded already (in place of their size)."""
        for e in self.catalog.entries:
            fit = fits.get(e.id)
            if fit is None:
                text = ""
            elif fit.available_bytes is None:
                text = f"needs {format_bytes(fit.need_bytes)}, no GPU"
            else:
                text = f"{fit.as_text} ({format_bytes(fit.need_bytes)})"
            style = FIT_STYLE.get(fit.verdict, "") if fit else ""
            self.fits[e.id] = f"[{style}]{text}[/]" if style else text
        self.cached = set(cached)
        self._fill()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        entry = self.catalog.by_id(str(event.row_key.value))
        if entry is not None:
            self.post_message(self.Chosen(entry))
