"""The dim line under an answer: its speed, time to first token and, with speculation, accepted length."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.cells import cell_len
from textual.widgets import Static


def stats_dict(stats: Any) -> dict[str, Any]:
    """GenerationStats, a stored dict, or None -> a plain dict."""
    if stats is None:
        return {}
    if dataclasses.is_dataclass(stats):
        return dataclasses.asdict(stats)
    return dict(stats)


def _spec_off(s: dict) -> str:
    """No accepted length to show: speculation was off, or (None) a server decided it without saying."""
    return "spec: the server's" if "speculative" in s and s["speculative"] is None else "spec off"


def format_stats(stats: Any, finish_reason: str | None = None, model: str | None = None,
                 compact: bool = False) -> str:
    """compact: the short form, for a half-width pane whose title already says speculation off
    or on, and for any answer whose full line would wrap."""
    s = stats_dict(stats)
    parts: list[str] = []
    if model:
        parts.append(model)
    if s and compact:  # about 36 cells: speed, time to first token, accepted length
        speed = s.get("decode_tok_s", 0.0)
        parts.append(f"{speed:.0f} tok/s" if speed >= 100 else f"{speed:.1f} tok/s")
        parts.append(f"TTFT {s.get('ttft_s', 0.0) * 1000:.0f} ms")
        parts.append(f"accept {s.get('accept_len_mean', 0.0):.2f}" if s.get("speculative") else _spec_off(s))
    elif s:
        parts.append(f"{s.get('decode_tok_s', 0.0):.1f} tok/s")
        parts.append(f"TTFT {s.get('ttft_s', 0.0) * 1000:.0f} ms")
        parts.append(f"{s.get('generated_tokens', 0)} tokens")
        if s.get("speculative"):
            # k unknown (0): a server other than ours, which says how many tokens it accepted, not how many it drafted
            k = f"tree {s['tree']}, " if s.get("tree") else f"k={s['draft_steps']}, " if s.get("draft_steps") else ""
            parts.append(f"spec {k}accept len {s.get('accept_len_mean', 0.0):.2f}")
        else:
            parts.append(_spec_off(s))
    if finish_reason == "cancelled":
        parts.append("stopped")
    elif finish_reason == "length":
        parts.append("hit max tokens")
    return " · ".join(parts)


class StatsLine(Static):
    _text = "\n"  # the text shown, as far as its height goes ("\n": unknown)

    def __init__(self, *args, compact: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.compact = compact
        self._shown: tuple | None = None  # show_stats' arguments, to choose the form again on resize

    def show_stats(self, stats: Any, finish_reason: str | None = None, model: str | None = None) -> None:
        """The full line where it fits on one line of the widget, else the short form."""
        text = format_stats(stats, finish_reason, model, self.compact)
        width = self.content_region.width
        if not self.compact and width and cell_len(text) > width:
            text = format_stats(stats, finish_reason, model, compact=True)
        self.update(text)
        self._shown = (stats, finish_reason, model)

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show_stats(*self._shown)

    def update(self, content: Any = "", *, layout: bool | None = None) -> None:
        """Without `layout`, lays the screen out again only when the line's height may change: a new text
        that fits on one line, like the old one, needs a repaint only (cheap, while an answer streams)."""
        self._shown = None  # other text from here on (show_stats sets it again)
        text = content if isinstance(content, str) else None
        if layout is None:
            width = self.content_region.width
            layout = not (text and self._text and width and "\n" not in text + self._text
                          and cell_len(text) <= width and cell_len(self._text) <= width)
        self._text = text or "\n"
        super().update(content, layout=layout)
