"""The main screen: chats in a sidebar, the conversation, the message box and the status bar."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Label, OptionList

from engine.errors import UserError

from app.chat_lease import LEASE_RENEW_S
from app.engine_worker import EngineWorker
from app.pacing import LiveAnswer, release_when_drawn
from app.store import ChatRecord
from app.widgets.chat_list import ChatList
from app.widgets.conversation import Conversation
from app.widgets.message_view import MessageView
from app.widgets.prompt_input import PromptInput
from app.widgets.status_bar import StatusBar
from app.screens.compare_screen import CompareScreen
from app.screens.confirm_screen import ConfirmScreen
from app.screens.rename_screen import RenameScreen
from app.screens.system_prompt_screen import SystemPromptScreen


@dataclass
class _Answer:
    """The answer being generated; kept apart from the view so it is saved even if the user moves on."""

    job_id: int
    chat_id: int | None  # None: its chat was deleted, nothing to save
    view: MessageView
    live: LiveAnswer | None = None  # from the first text on
    saved: bool = False

    @property
    def text(self) -> str:
        """All the engine has written so far (the view may be a little behind)."""
        return self.live.stream.text if self.live is not None else self.view.content


SIDEBAR_MIN_SCREEN_WIDTH = 100  # narrower screens hide the chat list until asked for (Ctrl+L)


class ChatScreen(Screen):
    SAVE_RETRY_S = 2.0  # how often writes the chat history could not take are tried again

    # The footer shows the few keys a newcomer needs, short enough for 80 columns; F1 lists them all
    # (the tooltip is the longer text it shows).
    BINDINGS = [
        Binding("escape", "stop", "Stop", show=False, tooltip="Stop the answer being written"),
        Binding("ctrl+n", "new_chat", "New", tooltip="Start a new chat"),
        Binding("ctrl+t", "toggle_speculation", "Spec", tooltip="Speculative decoding on/off from the next answer"),
        Binding("ctrl+b", "compare", "Compare", tooltip="Rerun the last prompt with speculation off and on"),
        Binding("f5", "app.models", "Models", tooltip="Choose, download and load a model and its draft"),
        Binding("f1", "keys", "Keys", tooltip="List every key"),
        Binding("ctrl+r", "regenerate", "Regenerate", show=False, tooltip="Write the last answer again"),
        Binding("ctrl+o", "copy_answer", "Copy answer", show=False, tooltip="Copy the last answer"),
        Binding("ctrl+s", "export_chat", "Export", show=False, tooltip="Save this chat as Markdown"),
        Binding("ctrl+l", "toggle_sidebar", "Chats", show=False, tooltip="Show or hide the list of chats"),
        Binding("f2", "rename_chat", "Rename", show=False, tooltip="Rename this chat"),
        Binding("f8", "delete_chat", "Delete chat", show=False, tooltip="Delete this chat"),
        Binding("f3", "edit_system_prompt", "System prompt", show=False, tooltip="Edit this chat's system prompt"),
        Binding("f4", "settings", "Settings", show=False, tooltip="Sampling, draft steps, defaults"),
    ]

    def __init__(self, speculative: bool) -> None:
        super().__init__()
        self.speculative = speculative
        self.spec_default = speculative  # the settings' (or the command line's) choice, where it pays
        self.chat: ChatRecord | None = None  # None: a new chat, saved with its first message
        self.new_chat_system_prompt = ""
        self.answer: _Answer | None = None
        self.has_draft = True
        self.model_name: str | None = None
        self.is_model_ready = False  # a model is loaded and answering (not loading, not failed)
        self.spec_by_server = False  # a remote server that takes no per-request speculation switch
        self.spec_chosen = False  # the user toggled speculation in this session: no default overrides it
        # whether speculation pays on the loaded model, for greedy answers and for answers drawn at a
        # temperature (Engine.speculation_pays), with the reason where it does not
        self.spec_verdicts: dict[bool, tuple[bool, str]] = {False: (True, ""), True: (True, "")}
        self.sidebar_choice: bool | None = None  # None: shown or hidden by the screen's width

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield Label("localchat", id="app-title")
                yield Button("+ New chat", id="new-chat", compact=True)
                yield ChatList(id="chat-list")
            with Vertical(id="chat"):
                yield Conversation(id="conversation")
                yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.status.speculative = self.speculative
        self.status.model = self.app.model_label
        self.status.show_progress("Loading model…")
        self.store.on_pending = self.show_unsaved
        self.set_interval(self.SAVE_RETRY_S, self.store.flush)
        self.set_interval(LEASE_RENEW_S, self.renew_lease)
        await self.open_latest_chat()
        self.query_one(PromptInput).focus()
        self.app.runner.start(self)

    def on_resize(self) -> None:
        self._place_sidebar()

    def action_toggle_sidebar(self) -> None:
        self.sidebar_choice = not self.query_one("#sidebar").display
        self._place_sidebar()

    def _place_sidebar(self) -> None:
        shown = self.size.width >= SIDEBAR_MIN_SCREEN_WIDTH if self.sidebar_choice is None else self.sidebar_choice
        self.query_one("#sidebar").display = shown

    def action_keys(self) -> None:
        self.app.show_keys(self)

    @property
    def store(self):
        return self.app.store

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def conversation(self) -> Conversation:
        return self.query_one(Conversation)

    # Chats

    async def open_chat(self, chat: ChatRecord | None,
                        if_held: str = "Close it there first, or pick another chat.") -> bool:
        """Shows `chat` (None: a new one), which this window then holds; False, and nothing changes, when
        another localchat window has it open (two windows writing one chat would interleave)."""
        if chat is not None:
            holder = self.store.take_lease(chat.id)
            if holder is not None:
                self.notify(f"“{chat.title}” is open in another localchat window ({holder.describe()}). {if_held}",
                            severity="warning", timeout=10)
                return False
        if self.chat is not None and (chat is None or not self._same_chat(chat.id, self.chat.id)):
            self.store.release_lease(self.chat.id)
        self.action_stop()
        self.chat = chat
        self.new_chat_system_prompt = self.app.settings.system_prompt
        records = self.store.messages(chat.id) if chat else []
        await self.conversation.show(self.system_prompt, records)
        self.refresh_chat_list()
        return True

    async def open_latest_chat(self) -> None:
        """The most recent chat, or a new one when another window has that open."""
        chats = self.store.list_chats()
        if not chats or not await self.open_chat(chats[0], if_held="This window starts a new chat."):
            await self.open_chat(None)

    async def renew_lease(self) -> None:
        """Keeps this window's hold on its chat; if another window took it over (this one was silent for
        longer than a lease lasts), this one moves to a new chat rather than interleave with it."""
        if self.chat is None:
            return
        holder = self.store.renew_lease(self.chat.id)
        if holder is not None:
            self.notify(f"“{self.chat.title}” was opened in another localchat window ({holder.describe()}) "
                        "while this one was not responding: this window starts a new chat.",
                        severity="warning", timeout=20)
            self.chat = None  # its lease is not ours to release
            await self.open_chat(None)

    def _same_chat(self, a: int, b: int) -> bool:
        """Ids handed out before a chat was saved differ from its database id."""
        return self.store.resolve(a) == self.store.resolve(b)

    def show_unsaved(self, count: int) -> None:
        """The store's writes waiting for the database: on the status bar, and as * in the chat list."""
        if count == 0 and self.status.unsaved:
            self.notify("Chat history saved: everything is written now.", timeout=4)
        self.status.unsaved = count
        self.refresh_chat_list()

    @property
    def system_prompt(self) -> str:
        return self.chat.system_prompt if self.chat else self.new_chat_system_prompt

    def refresh_chat_list(self) -> None:
        self.query_one(ChatList).show(self.store.list_chats(), self.store.resolve(self.chat.id) if self.chat else None)

    @on(OptionList.OptionSelected, "#chat-list")
    async def chat_selected(self, event: OptionList.OptionSelected) -> None:
        chat_id = int(event.option_id)
        if not self.chat or not self._same_chat(self.chat.id, chat_id):
            chat = self.store.get_chat(chat_id)
            if chat is not None and not await self.open_chat(chat):
                self.refresh_chat_list()  # the highlight goes back to this window's chat, the focus stays
                return
        self.query_one(PromptInput).focus()

    @on(Button.Pressed, "#new-chat")
    async def action_new_chat(self) -> None:
        await self.open_chat(None)
        self.query_one(PromptInput).focus()

    def action_rename_chat(self) -> None:
        if self.chat is None:
            self.notify("Send a message first: a new chat is saved with its first message.")
            return
        chat = self.chat

        def done(title: str | None) -> None:
            if title:
                self.store.rename_chat(chat.id, title)
                if self.chat and self.chat.id == chat.id:
                    self.chat = self.store.get_chat(chat.id) or self.chat
                self.refresh_chat_list()

        self.app.push_screen(RenameScreen(chat.title), done)

    def action_delete_chat(self) -> None:
        if self.chat is None:
            return
        chat = self.chat

        async def done(confirmed: bool | None) -> None:
            if not confirmed:
                return
            holder = self.store.delete_chat(chat.id)
            if holder is not None:
                self.notify(f"“{chat.title}” was not deleted: it is open in another localchat window "
                            f"({holder.describe()}). Close it there first.", severity="warning", timeout=10)
                return
            if self.answer and self.answer.chat_id is not None and self._same_chat(self.answer.chat_id, chat.id):
                self.answer.chat_id = None
            # Gone from the list at once, by id, whatever else is still on its way to the screen.
            self.query_one(ChatList).forget(chat.id)
            self.notify(f"Deleted chat “{chat.title}”.", timeout=3)
            self.chat = None  # deleted with its lease
            await self.open_latest_chat()

        self.app.push_screen(ConfirmScreen(f"Delete chat “{chat.title}”?", "Delete"), done)

    def action_edit_system_prompt(self) -> None:
        def done(prompt: str | None) -> None:
            if prompt is None:
                return
            if self.chat:
                self.store.set_system_prompt(self.chat.id, prompt)
                self.chat = self.store.get_chat(self.chat.id) or self.chat
            else:
                self.new_chat_system_prompt = prompt
            self.conversation.set_system_prompt(prompt)

        self.app.push_screen(SystemPromptScreen(self.system_prompt), done)

    def action_settings(self) -> None:
        self.app.action_settings()

    # Answers

    def engine_messages(self) -> list[dict]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += [{"role": v.role, "content": v.content} for v in self.conversation.views
                     if v.role in ("user", "assistant") and "failed" not in v.classes]
        return messages

    @on(PromptInput.EditLast)
    def action_edit_last(self) -> None:
        """Puts the last message you sent back in the box; sending it replaces that message and
        everything after it (its answer)."""
        prompt = self.query_one(PromptInput)
        if self.answer is not None:
            self.notify("Wait for the answer to finish, or press Esc to stop it.", severity="warning")
            return
        last = next((v for v in reversed(self.conversation.views) if v.role == "user"), None)
        if last is None:
            self.notify("No message to edit yet.")
            return
        if prompt.text.strip() and not prompt.editing:
            self.notify("Empty the message box first: editing would replace what is in it.")
            return
        prompt.start_editing(last.content)
        prompt.focus()

    @on(PromptInput.CancelEdit)
    def cancel_edit(self) -> None:
        prompt = self.query_one(PromptInput)
        prompt.stop_editing()
        prompt.clear()

    async def _drop_from(self, view: MessageView) -> None:
        """Removes `view` and every message after it, from the screen and the history."""
        views = self.conversation.views
        for v in views[views.index(view):]:
            if v.message_id is not None:
                self.store.delete_message(v.message_id)
            await self.conversation.remove_view(v)

    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.answer is not None:
            self.notify("Wait for the answer to finish, or press Esc to stop it.", severity="warning")
            return
        if self.app.runner.load_error:
            self.notify(f"No model is loaded ({self.app.runner.load_error}). Press F5 to load another model.",
                        severity="error", timeout=10)
            return
        if event.prompt_input.editing:
            event.prompt_input.stop_editing()
            last = next((v for v in reversed(self.conversation.views) if v.role == "user"), None)
            if last is not None:
                await self._drop_from(last)
        event.prompt_input.clear()
        if self.chat is None:
            title = " ".join(text.split())
            self.chat = self.store.create_chat(title[:48] + ("…" if len(title) > 48 else ""), self.system_prompt)
            self.refresh_chat_list()
        message_id = self.store.add_message(self.chat.id, "user", text)
        await self.conversation.add(MessageView("user", text, message_id=message_id))
        await self.start_answer()

    async def start_answer(self) -> None:
        assert self.chat is not None
        chat_id = self.chat.id  # before the awaits: the user may open or delete chats meanwhile
        messages = self.engine_messages()
        view = await self.conversation.add(MessageView("assistant"))
        await view.start_stream("thinking…" if self.app.runner.engine else "waiting for the model to load…")
        # Decoding starts once the new messages are laid out and drawn, not alongside that work.
        # Speculation off: plain decoding on the engine without its draft where that fits, the
        # faster kernels (the loaded target's plain steps run the batch-invariant ones its
        # verify steps need), as the compare screen's off side does.
        self.apply_spec_default()  # the temperature may have changed since the last answer
        job_id = self.app.runner.generate(self, messages, self.app.settings, self.speculative, hold=True,
                                          no_draft=not self.speculative)
        self.answer = _Answer(job_id, chat_id, view)
        release_when_drawn(self, self.app.runner, job_id)

    def action_stop(self) -> None:
        if self.answer is not None:
            self.app.runner.stop()

    async def action_regenerate(self) -> None:
        if self.answer is not None:
            self.notify("An answer is still being written: press Esc first.", severity="warning")
            return
        views = self.conversation.views
        if not views or self.chat is None or not any(v.role == "user" for v in views):
            self.notify("Nothing to regenerate yet.")
            return
        if views[-1].role == "assistant":
            if views[-1].message_id is not None:
                self.store.delete_message(views[-1].message_id)
            await self.conversation.remove_view(views[-1])
        await self.start_answer()

    def action_export_chat(self) -> None:
        """Writes this chat as Markdown into the export folder (Documents/localchat)."""
        from app.chat_export import write_export

        if self.answer is not None:
            self.notify("Wait for the answer to finish, or press Esc to stop it.", severity="warning")
            return
        messages = self.store.messages(self.chat.id) if self.chat is not None else []
        if not messages:
            self.notify("Nothing to export yet: this chat has no saved messages.")
            return
        try:
            path = write_export(self.chat, messages, self.app.paths.export_dir)
        except OSError as e:
            self.notify(f"Could not export to {self.app.paths.export_dir}: {e.strerror or e}", severity="error")
            return
        except UserError as e:  # its file name is taken by a link, folder or device
            self.notify(f"Could not export: {e}", severity="error")
            return
        self.notify(f"Exported {len(messages)} messages to {path}", timeout=6)

    def action_copy_answer(self) -> None:
        view = self.conversation.last_assistant()
        answer = self.answer if self.answer is not None and self.answer.view is view else None
        text = answer.text if answer is not None else view.content if view is not None else ""
        if not text:
            self.notify("No answer to copy yet.")
            return
        self.app.copy_to_clipboard(text)
        if answer is not None:
            self.notify(f"Copied the answer so far ({len(text)} characters): it is still being written.",
                        timeout=3)
        else:
            self.notify(f"Copied the last answer ({len(text)} characters).", timeout=2)

    def action_toggle_speculation(self) -> None:
        if self.spec_by_server:
            self.notify("This server decides on speculation itself: the switch works with a localchat server "
                        "(`localchat serve`).", timeout=4)
            return
        self.speculative = not self.speculative
        self.spec_chosen = True
        self.status.speculative = self.speculative
        state = "on" if self.speculative else "off"
        note = "" if self.has_draft else " (no draft model is loaded: answers decode plainly)"
        if self.speculative and self.status.spec_note:
            note = f" ({self.status.spec_note}: compare both with Ctrl+B)"
        self.status.spec_note = ""
        self.notify(f"Speculation {state} from the next answer{note}.", timeout=3)

    def action_compare(self) -> None:
        if self.answer is not None:
            self.notify("Wait for the answer to finish, or press Esc to stop it.", severity="warning")
            return
        messages = self.engine_messages()
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages or messages[-1]["role"] != "user":
            self.notify("Send a message first: compare reruns the last prompt.")
            return
        if self.app.runner.load_error:
            self.notify(f"No model is loaded ({self.app.runner.load_error}). Press F5 to load another model.",
                        severity="error", timeout=10)
            return
        if not self.is_model_ready:
            self.notify("The model is still loading: compare once it is ready.")
            return
        if not self.has_draft:
            if self.status.remote:
                self.notify("Compare needs a localchat server with a draft: this server cannot turn speculation "
                            "off and on per request.", timeout=6)
                return
            self.offer_wizard()
            return
        self.app.push_screen(CompareScreen(messages))

    def offer_wizard(self) -> None:
        """Compare needs a draft: without one both sides would decode the same way."""
        def done(confirmed: bool | None) -> None:
            if confirmed:
                self.app.action_models()

        question = (f"No draft model is loaded with {self.model_name or 'this model'}, so there is no speculation "
                    "to compare with. Open the model wizard (F5) to choose a model with a draft?")
        self.app.push_screen(ConfirmScreen(question, "Open the wizard", variant="primary"), done)

    def model_switching(self, model: str) -> None:
        """A new model is on its way: nothing on the status bar may describe the old one."""
        self.is_model_ready = False
        label = Path(model).name if Path(model).expanduser().exists() else model  # a path's end names it
        self.status.model = label
        self.status.model_ok = True
        self.status.remote = None
        self.spec_by_server = self.status.spec_by_server = False
        self.status.draft = None
        self.status.show_stats(None)
        self.status.show_progress(f"Loading {label}…")

    # Engine thread reports

    def on_engine_worker_load_progress(self, message: EngineWorker.LoadProgress) -> None:
        self.status.show_progress(message.text)

    def on_engine_worker_loaded(self, message: EngineWorker.Loaded) -> None:
        self.status.hide_progress()
        self.is_model_ready = True
        self.model_name = message.model_name
        self.has_draft = message.has_draft
        self.status.model = message.model_name
        self.status.weights = message.weights
        self.status.model_ok = True
        self.status.remote = message.remote
        self.spec_by_server = self.status.spec_by_server = message.spec_by_server
        self.status.draft = message.draft_name
        self.status.has_draft = message.has_draft
        self.spec_verdicts = {False: (message.spec_pays, message.spec_reason),
                              True: (message.sampled_spec_pays, message.sampled_spec_reason)}
        if self.apply_spec_default():
            self.notify(f"Speculation is off: {self.status.spec_note}. Ctrl+T turns it on.", timeout=8)
        self.status.show_stats(None)  # whatever it shows was measured on the model before
        if self.answer:
            self.answer.view.set_waiting("thinking…")

    def apply_spec_default(self) -> bool:
        """Unless the user toggled it: speculation on where it pays ("on" in the settings means on
        where it pays, for each model loaded), for the kind of answer the settings ask for now
        (greedy, or drawn at a temperature: a draft may pay for one and not the other). Returns
        whether that turned it off, the status bar saying why."""
        if self.spec_chosen:
            return False
        pays, reason = self.spec_verdicts[self.app.settings.temperature > 0]
        off_here = self.has_draft and self.spec_default and not pays
        self.speculative = self.status.speculative = self.spec_default and not off_here
        self.status.spec_note = reason if off_here else ""
        return off_here

    def on_engine_worker_load_failed(self, message: EngineWorker.LoadFailed) -> None:
        self.status.hide_progress()
        self.is_model_ready = False
        self.status.model = "no model"
        self.status.model_ok = False
        self.status.remote = None
        self.status.draft = None
        self.status.show_stats(None)
        self.notify(f"{message.error}\nPress F5 to load another model.", title="The model failed to load",
                    severity="error", timeout=30)

    async def on_engine_worker_started(self, message: EngineWorker.Started) -> None:
        answer = self.answer
        if answer is None or message.job_id != answer.job_id:
            return

        async def show(text: str, stats: Any) -> None:
            if answer.view.is_attached:  # not when the user has moved to another chat meanwhile
                await answer.view.append(text, stats)
                self.status.show_stats(stats)

        answer.live = LiveAnswer(self, message.stream, show)
        await answer.live.start()

    async def on_engine_worker_finished(self, message: EngineWorker.Finished) -> None:
        answer = self.answer
        if answer is None or message.job_id != answer.job_id:
            return
        if answer.live is not None:
            answer.live.stop()
        stats = message.stats
        if answer.chat_id is not None and self.store.get_chat(answer.chat_id) is not None:  # not deleted meanwhile
            answer.saved = True
            answer.view.message_id = self.store.add_message(
                answer.chat_id, "assistant", message.text, stats.to_json() if stats else None,
                message.finish_reason, self.model_name)
        try:
            if answer.view.is_attached:
                await answer.view.finish(message.text, stats, message.finish_reason, self.model_name)
            if stats is not None:
                self.status.show_stats(stats)
        finally:  # the answer is over once it shows as finished
            if self.answer is answer:
                self.answer = None

    def save_unfinished(self) -> None:
        """On quit: keep what the answer being written has so far, as an answer stopped by the user."""
        answer, self.answer = self.answer, None
        if answer is not None and not answer.saved and answer.chat_id is not None and answer.text:
            stats = answer.live.stream.stats() if answer.live is not None else None
            self.store.add_message(answer.chat_id, "assistant", answer.text, stats.to_json() if stats else None,
                                   "cancelled", self.model_name)

    async def on_engine_worker_failed(self, message: EngineWorker.Failed) -> None:
        answer = self.answer
        if answer is None or message.job_id != answer.job_id:
            return
        if answer.live is not None:
            answer.live.stop()
        try:
            if answer.view.is_attached:
                await answer.view.fail(message.error)
        finally:
            if self.answer is answer:
                self.answer = None
        self.notify(message.error, title="Generation failed", severity="error", timeout=15)
