"""The Textual app: settings, chat history and the engine thread, around one chat screen."""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from pathlib import Path
from typing import Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from app.engine_worker import EngineFactory, EngineWorker, ProgressCallback
from app.paths import AppPaths
from app.remote import RemoteChoice, RemoteEngine
from app.screens.chat_screen import ChatScreen
from app.screens.keys_screen import KeysScreen, key_rows
from app.screens.settings_screen import SettingsScreen
from app.settings import Settings, load_settings, save_settings
from app.stop_signals import describe, exit_status, quit_on_stop_signals
from app.store import ChatStore
from app.widgets.prompt_input import PromptInput

ENGINE_SWITCH_INTERVAL_S = 0.0002
# On quit the engine thread stops at its next step: at once while it decodes, but a load phase or a long
# prefill cannot be cut short. After STOP_NOTICE_S the terminal says why the exit waits; after STOP_WAIT_S
# the process leaves without the thread (safe then: everything the app owns is saved and closed, and an
# unfinished load leaves nothing that the next load does not redo).
STOP_NOTICE_S = 1.0
STOP_WAIT_S = 15.0
STYLESHEET = Path(__file__).resolve().parent.parent / "assets" / "localchat.tcss"


class LocalChatApp(App):
    CSS_PATH = STYLESHEET
    TITLE = "localchat"
    # Textual's own Ctrl+Q, shown in the footer: a newcomer looks there for the way out.
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True, tooltip="Quit localchat")]

    def __init__(self, engine_factory: EngineFactory | None = None, *, model: str = "demo",
                 draft: str | None = None, device: str | None = None, draft_steps: int | None = None,
                 max_seq_len: int | None = None, use_graphs: bool = True,
                 speculative: bool | None = None, home: str | os.PathLike | None = None,
                 threads: int | None = None, remote: RemoteChoice | None = None, tree=None) -> None:
        super().__init__()
        # The engine thread must get the GIL back quickly after each GPU step; Python's default
        # 5 ms switch interval would let a UI redraw stall a 1 ms decode step.
        sys.setswitchinterval(ENGINE_SWITCH_INTERVAL_S)
        self.paths = AppPaths.resolve(home)
        self.settings, self.startup_notes = load_settings(self.paths.settings_path)
        self.store = ChatStore.open(self.paths.db_path)
        self.startup_notes += self.store.notes
        self.store.on_error = lambda text: self.notify(text, title="Chat history", severity="error", timeout=15)
        steps = draft_steps or self.settings.draft_steps
        self.load_kwargs = dict(device=device, draft_steps=steps, max_seq_len=max_seq_len, use_graphs=use_graphs,
                                threads=threads, tree=tree)
        if engine_factory is None:
            engine_factory = _connect(remote) if remote else _load_engine(model, draft=draft, **self.load_kwargs)
        self.runner = EngineWorker(engine_factory)
        self.model_label = remote.label if remote else model
        self.speculative = self.settings.speculative if speculative is None else speculative
        self.chat_screen: ChatScreen | None = None
        self.exit_notes: list[str] = []  # printed once the terminal is back

    def on_mount(self) -> None:
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        else:
            self.startup_notes.append(f"Unknown theme '{self.settings.theme}' in settings: using {self.theme}.")
        for note in self.startup_notes:
            self.notify(note, title="localchat", severity="warning", timeout=20)
        self.chat_screen = ChatScreen(self.speculative)
        self.push_screen(self.chat_screen)

    def on_unmount(self) -> None:
        self.runner.shutdown()
        if self.chat_screen is not None:
            self.chat_screen.save_unfinished()
        kept = self.store.close()
        if self.store.num_pending:
            self.exit_notes.append(
                f"{self.store.num_pending} change(s) could not be written to the chat history {self.paths.db_path}"
                + (f"; they are kept in {kept}." if kept else " and are lost."))
        gc.unfreeze()  # the load froze the heap (see _load_engine): let the interpreter's exit free it

    def watch_theme(self, theme: str) -> None:
        if theme != self.settings.theme and self.is_mounted:
            self.update_settings(dataclasses.replace(self.settings, theme=theme))

    def update_settings(self, settings: Settings) -> None:
        self.settings = settings
        try:
            save_settings(self.paths.settings_path, settings)
        except OSError as e:
            self.notify(f"Cannot save settings to {self.paths.settings_path}: {e}", severity="error")

    def action_settings(self) -> None:
        def done(settings: Settings | None) -> None:
            if settings is not None and settings != self.settings:
                self.update_settings(settings)
                self.notify("Settings saved.", timeout=2)

        self.push_screen(SettingsScreen(self.settings), done)

    def action_models(self) -> None:
        """The model wizard; the chosen model (and draft) replaces the loaded one."""
        from app.screens.wizard import WizardScreen

        def done(result) -> None:
            if result is None:
                return
            if isinstance(result, RemoteChoice):
                self.model_label = result.label
                if self.chat_screen is not None:
                    self.chat_screen.model_switching(result.label)
                self.runner.reload(_connect(result))
                return
            model, draft = result
            self.model_label = model
            if self.chat_screen is not None:
                self.chat_screen.model_switching(model)
            self.runner.reload(_load_engine(model, draft=draft, **self.load_kwargs))
            self.notify(f"Loading {model}" + (f" with draft {draft}" if draft else "") + "…", timeout=4)

        self.push_screen(WizardScreen(), done)

    def show_keys(self, screen: Screen) -> None:
        """The keys of `screen` in words (Textual's own Keys panel lists the focused box's cursor keys)."""
        extra = PromptInput.KEY_HELP if isinstance(screen, ChatScreen) else ()
        self.push_screen(KeysScreen(key_rows(screen, self, extra)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Keys":
                yield command
        yield SystemCommand("Keys", "What each key does here (F1)", lambda: self.show_keys(screen))
        if not isinstance(screen, ChatScreen):
            return
        yield SystemCommand("Toggle speculation", "Speculative decoding on/off from the next answer (Ctrl+T)",
                            screen.action_toggle_speculation)
        yield SystemCommand("Compare speculation off vs on", "Rerun the last prompt both ways, side by side "
                            "(Ctrl+B)", screen.action_compare)
        yield SystemCommand("Regenerate answer", "Write the last answer again (Ctrl+R)", screen.action_regenerate)
        yield SystemCommand("Edit last message", "Put your last message back in the box; sending it replaces "
                            "it and its answer (Up in an empty box)", screen.action_edit_last)
        yield SystemCommand("Stop answer", "Stop the answer being written (Esc)", screen.action_stop)
        yield SystemCommand("Copy last answer", "Copy the last answer to the clipboard (Ctrl+O)",
                            screen.action_copy_answer)
        yield SystemCommand("Export chat", f"Write this chat as Markdown into {self.paths.export_dir} (Ctrl+S)",
                            screen.action_export_chat)
        yield SystemCommand("New chat", "Start a new conversation (Ctrl+N)", screen.action_new_chat)
        yield SystemCommand("Rename chat", "Give this conversation a new title (F2)", screen.action_rename_chat)
        yield SystemCommand("Delete chat", "Delete this conversation (F8)", screen.action_delete_chat)
        yield SystemCommand("System prompt", "Edit this chat's system prompt (F3)", screen.action_edit_system_prompt)
        yield SystemCommand("Settings", "Sampling, draft steps, defaults (F4)", self.action_settings)
        yield SystemCommand("Models", "Choose, download and load a model and its draft (F5)", self.action_models)


def _load_engine(model: str, **load_kwargs) -> EngineFactory:
    def load(on_progress: ProgressCallback):
        from engine import Engine  # imports torch: only ever on the engine thread

        kwargs = dict(load_kwargs)
        tree = kwargs.pop("tree", None)
        engine = Engine.load(model, on_progress=on_progress, **kwargs)
        if tree is not None and hasattr(engine.speculator, "set_tree"):  # the app keeps MTP's chains
            engine.set_tree(tree, log=lambda text: on_progress(text, None))
        # Torch, the model and the app are a large heap that lives as long as the model: a full collection
        # of it holds the GIL for 100 ms or more, as long as a whole answer on a GPU. Freezing it keeps it
        # out of later collections (EngineWorker unfreezes before a reload lets it go).
        gc.collect()
        gc.freeze()
        return engine

    return load


def _connect(choice: RemoteChoice) -> EngineFactory:
    def connect(on_progress: ProgressCallback):
        return RemoteEngine.connect(choice, on_progress)

    return connect


def run_tui(args) -> int:
    """Entry point for `localchat` with no subcommand; `args` carries model, draft, device, no_spec, draft_steps
    (and, when present, max_seq_len and no_graphs)."""
    app = LocalChatApp(
        model=getattr(args, "model", None) or "demo",
        draft=getattr(args, "draft", None),
        device=getattr(args, "device", None),
        draft_steps=getattr(args, "draft_steps", None),
        max_seq_len=getattr(args, "max_seq_len", None),
        use_graphs=not getattr(args, "no_graphs", False),
        speculative=False if getattr(args, "no_spec", False) else None,
        threads=getattr(args, "threads", None),
        tree=getattr(args, "tree", None),
        remote=RemoteChoice(args.remote, args.remote_api_key, args.remote_model) if getattr(args, "remote", None)
        else None,
    )
    return run_app(app)


def run_app(app: LocalChatApp) -> int:
    """Runs the app until it quits (Ctrl+Q, SIGINT or SIGTERM: the same clean quit), then ends the engine
    thread before the interpreter does: torch aborts the process ("terminate called without an active
    exception") when the interpreter exits while a thread is still inside a torch call."""
    try:
        with quit_on_stop_signals(app.exit):
            app.run()
            for note in app.exit_notes:  # said after the terminal is restored
                print(f"localchat: {note}", file=sys.stderr)
            _stop_engine(app.runner, app.return_code or 0)
    except KeyboardInterrupt as stop:  # a signal before the app ran, or one more while the engine was awaited
        if not app.runner.join(0):
            print(f"localchat: {describe(stop)}", file=sys.stderr)
            _exit_now(exit_status(stop))
        raise
    return app.return_code or 0


def _stop_engine(runner: EngineWorker, status: int) -> None:
    """Stops the engine thread (an answer stops at its next step, a load at its next phase) and waits for it,
    saying so when that takes long; a thread that never comes back is left behind: the process exits with
    `status` without it."""
    runner.shutdown()  # already done when the app unmounted, unless it crashed
    if runner.join(STOP_NOTICE_S):
        return
    doing = "the model load is finishing its current phase" if runner.engine is None \
        else "the answer is finishing its current step"
    print(f"localchat: stopping… ({doing}; Ctrl+C quits at once)", file=sys.stderr, flush=True)
    if not runner.join(STOP_WAIT_S):
        print(f"localchat: the engine did not stop within {STOP_WAIT_S:.0f} s; quitting without it",
              file=sys.stderr, flush=True)
        _exit_now(status)


def _exit_now(status: int) -> None:
    """Ends the process without the interpreter's teardown, which is what aborts while the engine thread is
    inside torch. The app has already saved its chats and settings and restored the terminal."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
