"""The scrolling list of messages of one chat, with the chat's system prompt at the top."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from app.store import MessageRecord
from app.widgets.message_view import MessageView

WELCOME = (  # lines short enough not to wrap at 80 columns
    "[b]Start a conversation[/b]\n\n"
    "[b]Enter[/] send · [b]Shift+Enter[/] new line · [b]Esc[/] stop\n"
    "[b]Ctrl+T[/] speculation on/off · [b]Ctrl+B[/] compare\n"
    "[b]F5[/] models · [b]F1[/] keys · [b]Ctrl+P[/] all commands\n"
    "[b]Ctrl+Q[/] quit"
)


class Conversation(VerticalScroll):
    def compose(self) -> ComposeResult:
        yield Static("", id="system-prompt")
        yield Static(WELCOME, id="welcome")

    def watch_virtual_size(self) -> None:
        self._update_anchor()

    def on_resize(self) -> None:
        self._update_anchor()

    def _update_anchor(self) -> None:
        """Follow the end while answers stream in (until the user scrolls up), once there is more than a
        screenful; a short chat stays at the top instead of sinking to the bottom."""
        overflows = self.virtual_size.height > self.scrollable_content_region.height
        if overflows and not self.is_anchored:
            self.anchor()
        elif not overflows and self.is_anchored:
            self.anchor(False)
            self.scroll_home(animate=False, immediate=True)

    async def show(self, system_prompt: str, records: list[MessageRecord]) -> None:
        self.anchor(False)
        await self.query(MessageView).remove()
        self.set_system_prompt(system_prompt)
        views = [MessageView(r.role, r.content, message_id=r.id, stats=r.stats,
                             finish_reason=r.finish_reason, model=r.model)
                 for r in records if r.role != "system"]
        if views:
            await self.mount_all(views)
        self._update_welcome()

    def set_system_prompt(self, system_prompt: str) -> None:
        prompt = self.query_one("#system-prompt", Static)
        prompt.update(Text.assemble(("System  ", "bold"), _one_line(system_prompt)) if system_prompt else "")
        prompt.display = bool(system_prompt)

    async def add(self, view: MessageView) -> MessageView:
        await self.mount(view)
        self._update_welcome()
        if self.is_anchored:
            self.anchor()  # a new message brings the view back to the end
        return view

    async def remove_view(self, view: MessageView) -> None:
        await view.remove()
        self._update_welcome()

    @property
    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))

    def last_assistant(self) -> MessageView | None:
        return next((v for v in reversed(self.views) if v.role == "assistant"), None)

    def _update_welcome(self) -> None:
        self.query_one("#welcome").display = not self.query(MessageView)


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
