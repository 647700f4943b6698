"""Saved chats as Markdown: `localchat chats`, `localchat export ID`, and Ctrl+S in the app."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from engine.errors import UserError

from .paths import AppPaths
from .store import ChatRecord, ChatStore, MessageRecord

ROLE_HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System"}


def chat_markdown(chat: ChatRecord, messages: list[MessageRecord], now: float | None = None) -> str:
    """One chat as a Markdown document: title, when it was exported, the system prompt, then
    each message under a heading, with the answer's speed line (model, tok/s, accepted length)."""
    from .widgets.stats_line import format_stats

    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() if now is None else now))
    count = f"{len(messages)} message" + ("" if len(messages) == 1 else "s")
    out = [f"# {chat.title.strip() or 'Untitled chat'}", "", f"*Exported from localchat on {when}, {count}.*", ""]
    if chat.system_prompt.strip():
        out += ["**System prompt:**", ""] + [f"> {line}" if line else ">" for line in
                                              chat.system_prompt.strip().splitlines()] + [""]
    for m in messages:
        out += [f"## {ROLE_HEADINGS.get(m.role, m.role.title())}", "", m.content.rstrip(), ""]
        if m.role == "assistant" and (m.stats or m.model or m.finish_reason in ("cancelled", "length")):
            out += [f"*{format_stats(m.stats, m.finish_reason, m.model)}*", ""]
    return "\n".join(out).rstrip() + "\n"


def file_name(chat: ChatRecord) -> str:
    """A file name from the title, kept to letters, digits and dashes, with the chat's id (two
    chats may share a title; one chat exported again replaces its own file)."""
    slug = re.sub(r"[^a-z0-9]+", "-", chat.title.lower()).strip("-")[:60].rstrip("-") or "chat"
    return f"{slug}-{chat.id}.md"


def _write(path: Path, text: str) -> None:
    """Through a temporary name: a failed write leaves an earlier file whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_export(chat: ChatRecord, messages: list[MessageRecord], folder: Path) -> Path:
    """Writes the chat's Markdown into `folder` (created if missing); returns the file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(chat)
    _write(path, chat_markdown(chat, messages))
    return path


def _open_store(paths: AppPaths) -> ChatStore | None:
    """The chat history, or None when there is none yet (a read never creates one)."""
    if not paths.db_path.exists():
        return None
    store = ChatStore.open(paths.db_path)
    if store.path is None:  # locked or unreadable: ChatStore fell back to memory
        raise UserError(" ".join(store.notes) or f"cannot open the chat history {paths.db_path}")
    for note in store.notes:  # e.g. a damaged file moved aside, as the app would do
        print(f"localchat: {note}", file=sys.stderr)
    return store


def cmd_chats(args) -> int:
    """`localchat chats`: the saved chats, newest first, with their ids for `localchat export`."""
    store = _open_store(AppPaths.resolve())
    chats = store.list_chats() if store else []
    if not chats:
        print("No saved chats yet.")
        return 0
    width = max(len(str(c.id)) for c in chats)
    for c in chats:
        n = len(store.messages(c.id))
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated_at))
        print(f"{c.id:>{width}}  {when}  {n:>4} msgs  {c.title}")
    return 0


def cmd_export(args) -> int:
    """`localchat export ID [--out PATH]`: one chat as Markdown on stdout, or into PATH (a file,
    or a folder that gets the chat's own file name)."""
    store = _open_store(AppPaths.resolve())
    chat = store.get_chat(args.chat_id) if store else None
    if chat is None:
        raise UserError(f"no saved chat with id {args.chat_id} (`localchat chats` lists them)")
    messages = store.messages(chat.id)
    if args.out in (None, "-"):
        sys.stdout.write(chat_markdown(chat, messages))
        return 0
    out = Path(args.out).expanduser()
    try:
        if out.is_dir():
            path = write_export(chat, messages, out)
        else:
            if not out.parent.is_dir():
                raise UserError(f"--out {out}: the folder {out.parent} does not exist")
            _write(out, chat_markdown(chat, messages))
            path = out
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    print(f"exported chat {chat.id} ({len(messages)} messages) to {path}", file=sys.stderr)
    return 0
