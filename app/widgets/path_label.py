"""PathLabel: a line of plain text whose file paths lose their start, not their name, when it is too long."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Label

MIN_TAIL = 12  # a path is never cut shorter than this: the name stays readable, the line may wrap instead


def shorten_left(text: str, width: int) -> str:
    """'…' and the end of `text`, `width` cells in all (the end of a path is its file or folder name)."""
    if cell_len(text) <= width:
        return text
    tail = text
    while tail and cell_len(tail) > width - 1:
        tail = tail[1:]
    return "…" + tail


def fit_path(text: str, path: str | None, width: int, wrap: bool = False) -> str:
    """`text` with `path` (a part of it) shortened from the left so that it is never folded in the middle of a
    name (paths may hold spaces, so only the caller knows where one starts and ends). Without `wrap`, the
    whole text is fitted to one line of `width` cells, the path kept to MIN_TAIL at least; with `wrap`, a
    text too long for one line puts the path on a line of its own, shortened only if longer than a line."""
    if width <= 0 or cell_len(text) <= width or not path or path not in text:
        return text
    before, after = text.split(path, 1)
    if not wrap:
        room = max(MIN_TAIL, cell_len(path) - (cell_len(text) - width))
        return before + shorten_left(path, room) + after
    lines = [before.rstrip(), shorten_left(path, width), after.strip()]
    return "\n".join(line for line in lines if line)


class PathLabel(Label):
    """Plain text (no markup: paths and error messages may hold brackets) with one path in it, refitted to
    its width. wrap: several lines are fine (a message), else one line (a name in a row of fields)."""

    def __init__(self, text: str = "", wrap: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.full_text = text
        self.path: str | None = None
        self.wrap = wrap

    def show(self, text: str, path: str | None = None) -> None:
        """path: the part of `text` that is a file or folder path, if any."""
        self.full_text = text
        self.path = path
        self.refresh(layout=True)

    def render(self) -> Text:
        return Text(fit_path(self.full_text, self.path, self.content_region.width, self.wrap))
