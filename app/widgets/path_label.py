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


def fit_paths(text: str, width: int, wrap: bool = False) -> str:
    """`text` with its path-like words (those with a slash) shortened from the left so that none is folded
    in the middle of a name. Without `wrap`, the whole text is fitted to one line of `width` cells by
    shortening its longest path (down to MIN_TAIL); with `wrap`, the text may wrap at its spaces and only
    a path longer than a whole line is shortened."""
    if width <= 0 or cell_len(text) <= width or "\n" in text:
        return text
    words = text.split(" ")
    paths = [i for i, w in enumerate(words) if "/" in w or "\\" in w]
    if wrap:
        return " ".join(shorten_left(w, width) if i in paths else w for i, w in enumerate(words))
    if not paths:
        return text
    i = max(paths, key=lambda j: cell_len(words[j]))
    room = max(MIN_TAIL, cell_len(words[i]) - (cell_len(text) - width))
    words[i] = shorten_left(words[i], room)
    return " ".join(words)


class PathLabel(Label):
    """Plain text (no markup: paths and error messages may hold brackets), refitted to its width.
    wrap: several lines are fine (a message), else one line (a name in a row of fields)."""

    def __init__(self, text: str = "", wrap: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.full_text = text
        self.wrap = wrap

    def show(self, text: str) -> None:
        self.full_text = text
        self.refresh(layout=True)

    def render(self) -> Text:
        return Text(fit_paths(self.full_text, self.content_region.width, self.wrap))
