"""The sidebar list of conversations, most recent first."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from app.store import ChatRecord


class ChatList(OptionList):
    def show(self, chats: list[ChatRecord], current_id: int | None) -> None:
        self.clear_options()
        self.add_options(Option(_title(chat), id=str(chat.id)) for chat in chats)
        self.select(current_id)

    def select(self, chat_id: int | None) -> None:
        """Highlight `chat_id` (None: a new chat not saved yet, nothing highlighted)."""
        if chat_id is None:
            self.highlighted = None
            return
        try:
            self.highlighted = self.get_option_index(str(chat_id))
        except OptionDoesNotExist:
            self.highlighted = None

    def forget(self, chat_id: int) -> None:
        """Drop one chat's row (a deleted chat), leaving the others as they are."""
        try:
            self.remove_option(str(chat_id))
        except OptionDoesNotExist:
            pass

    @property
    def titles(self) -> list[str]:
        return [str(self.get_option_at_index(i).prompt) for i in range(self.option_count)]


def _title(chat: ChatRecord) -> Text:
    """The title, marked with * (as editors mark an unsaved file) while some of the chat is not saved yet."""
    title = Text(chat.title, no_wrap=True, overflow="ellipsis")
    if not chat.is_saved:
        title = Text.assemble(("* ", "bold red"), title, no_wrap=True, overflow="ellipsis")
    return title
