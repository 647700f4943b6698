"""Saved chats as Markdown: `localchat chats`, `localchat export ID`, and Ctrl+S in the app."""

from __future__ import annotations

import os
import re
import secrets
import stat
import sys
import time
from pathlib import Path

from engine.errors import UserError

from app.paths import AppPaths
from app.store import ChatRecord, ChatStore, MessageRecord

ROLE_HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System"}


def chat_markdown(chat: ChatRecord, messages: list[MessageRecord], now: float | None = None) -> str:
    """One chat as a Markdown document: title, when it was exported, the system prompt, then
    each message under a heading, with the answer's speed line (model, tok/s, accepted length)."""
    from app.widgets.stats_line import format_stats

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


def _write(path: Path, text: str, force: bool) -> None:
    """Writes `path` whole or not at all, through a temporary file of its own beside it (a `path.tmp`
    already there is someone else's). Replaces only a regular file, and only with `force`."""
    existing = _existing(path, force)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if existing is not None:  # a replaced file keeps its permissions
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
        if force:
            os.replace(tmp, path)
        else:
            _place_new(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _existing(path: Path, force: bool) -> os.stat_result | None:
    """What is at `path` now (None: nothing); refuses anything that is not a regular file, and a
    regular file without `force`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise UserError(f"{path} is a symbolic link: export never replaces one; give the file it points to, "
                        "or another path")
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path} is a folder, not a file: give another path")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path} is not a regular file (a device, FIFO or socket): export never replaces one; "
                        "give another path")
    if not force:
        raise UserError(f"{path} already exists: add --force to replace it, or give another path")
    return st


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, unique file beside `path`, created with the user's umask (mkstemp's would make it 0600)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def _place_new(tmp: Path, path: Path) -> None:
    """Moves `tmp` to `path` only if nothing is there: a hard link cannot replace a file that appeared
    since the check, a rename could."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        _existing(path, force=False)  # says what is there
        raise UserError(f"{path} already exists: add --force to replace it, or give another path") from None
    except OSError:  # no hard links on this file system (FAT, some network shares): check, then rename
        _existing(path, force=False)
        os.replace(tmp, path)
        return
    tmp.unlink()


def write_export(chat: ChatRecord, messages: list[MessageRecord], folder: Path, force: bool = True) -> Path:
    """Writes the chat's Markdown into `folder` (created if missing); returns the file's path. With
    `force`, an earlier export of the same chat (a regular file) is replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(chat)
    _write(path, chat_markdown(chat, messages), force)
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
    """`localchat export ID [--out PATH] [--force]`: one chat as Markdown on stdout, or into PATH (a file,
    or a folder that gets the chat's own file name). An existing file is replaced only with --force."""
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
            path = write_export(chat, messages, out, force=args.force)
        else:
            if not out.parent.is_dir():
                raise UserError(f"--out {out}: the folder {out.parent} does not exist")
            _write(out, chat_markdown(chat, messages), args.force)
            path = out
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    print(f"exported chat {chat.id} ({len(messages)} messages) to {path}", file=sys.stderr)
    return 0
