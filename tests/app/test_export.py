"""Chats as Markdown: Ctrl+S in the app, `localchat chats` and `localchat export ID` on the
command line (as a user runs them: a subprocess against the same LOCALCHAT_HOME)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.pilot_helpers import notes, ready, send

from app.chat_export import chat_markdown, file_name
from app.store import ChatRecord, MessageRecord

ROOT = Path(__file__).resolve().parents[2]


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALCHAT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_markdown_has_title_system_prompt_roles_and_stats():
    chat = ChatRecord(7, "Paris trip: plans!", "Be brief.\n\nUse lists.", 0.0)
    msgs = [MessageRecord(1, 7, "user", "Where should I go?"),
            MessageRecord(2, 7, "assistant", "**Louvre**, then the river.\n",
                          {"decode_tok_s": 1234.5, "ttft_s": 0.012, "generated_tokens": 9, "speculative": True,
                           "draft_steps": 5, "accept_len_mean": 3.2}, "stop", "demo"),
            MessageRecord(3, 7, "assistant", "Half an ans", None, "cancelled", None)]
    md = chat_markdown(chat, msgs, now=0)
    assert md.startswith("# Paris trip: plans!\n")
    assert "3 messages." in md and "> Be brief.\n>\n> Use lists." in md
    assert "## You\n\nWhere should I go?\n\n## Assistant\n\n**Louvre**, then the river.\n" in md
    assert "*demo · 1234.5 tok/s · TTFT 12 ms · 9 tokens · spec k=5, accept len 3.20*" in md
    assert md.rstrip().endswith("*stopped*")
    assert file_name(chat) == "paris-trip-plans-7.md"
    assert file_name(ChatRecord(8, "¿¿??", "", 0.0)) == "chat-8.md"


async def test_ctrl_s_writes_the_chat_and_the_cli_lists_and_exports_it(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert any("Nothing to export yet" in n for n in notes(app))
        await send(pilot, "hello there")
        await pilot.press("ctrl+s")
        await pilot.pause()
        chat_id = app.screen.chat.id
    path = home / "exports" / f"hello-there-{chat_id}.md"
    assert any(f"Exported 2 messages to {path}" in n for n in notes(app))
    text = path.read_text()
    assert text.startswith("# hello there\n") and "## You\n\nhello there\n" in text and "## Assistant" in text

    from app.paths import AppPaths
    from app.store import ChatStore

    running = ChatStore.open(AppPaths.resolve(home).db_path)  # as if the app were still open
    listed = _cli(home, "chats")
    running.close()
    assert listed.returncode == 0 and f"{chat_id}  " in listed.stdout and "hello there" in listed.stdout
    shown = _cli(home, "export", str(chat_id))
    assert shown.returncode == 0 and shown.stdout.split("\n", 3)[3] == text.split("\n", 3)[3]  # past the date line
    into = home / "out"
    into.mkdir()
    saved = _cli(home, "export", str(chat_id), "--out", str(into))
    assert saved.returncode == 0 and (into / path.name).is_file() and "exported chat" in saved.stderr
    missing = _cli(home, "export", "999")
    assert missing.returncode == 2 and missing.stderr.strip() == \
        "localchat: error: no saved chat with id 999 (`localchat chats` lists them)"
    bad = _cli(home, "export", str(chat_id), "--out", str(home / "nowhere" / "x.md"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_chats_on_a_fresh_home_creates_nothing(tmp_path):
    r = _cli(tmp_path, "chats")
    assert r.returncode == 0 and r.stdout.strip() == "No saved chats yet."
    assert not (tmp_path / "data").exists()


def _saved_chat(home: Path) -> int:
    from app.paths import AppPaths
    from app.store import ChatStore

    store = ChatStore.open(AppPaths.resolve(home).db_path)
    chat = store.create_chat("Keep my files", "")
    store.add_message(chat.id, "user", "hi")
    store.add_message(chat.id, "assistant", "hello")
    store.close()
    return chat.id


def _refused(r: subprocess.CompletedProcess, *words: str) -> bool:
    line = r.stderr.strip()
    return r.returncode == 2 and "\n" not in line and line.startswith("localchat: error: ") and \
        all(w in line for w in words)


def test_export_replaces_only_a_regular_file_and_only_with_force(tmp_path):
    home = tmp_path / "home"
    chat_id = str(_saved_chat(home))
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "chat.md"
    mine.write_text("my own notes")
    mine.chmod(0o640)
    (out / "chat.md.tmp").write_text("not export's temp file")

    assert _refused(_cli(home, "export", chat_id, "--out", str(mine)), "already exists", "--force")
    assert mine.read_text() == "my own notes"
    forced = _cli(home, "export", chat_id, "--out", str(mine), "--force")
    assert forced.returncode == 0, forced.stderr
    assert mine.read_text().startswith("# Keep my files\n") and (mine.stat().st_mode & 0o777) == 0o640
    assert (out / "chat.md.tmp").read_text() == "not export's temp file"

    target = out / "target.md"
    target.write_text("behind the link")
    (out / "link.md").symlink_to(target)
    (out / "dangling.md").symlink_to(out / "nothing-here.md")
    os.mkfifo(out / "fifo.md")
    (out / "folder.md").mkdir()
    # --force replaces regular files only: never a link (even a dangling one), a FIFO or a folder
    assert _refused(_cli(home, "export", chat_id, "--out", str(out / "link.md"), "--force"), "symbolic link")
    assert _refused(_cli(home, "export", chat_id, "--out", str(out / "dangling.md")), "symbolic link")
    assert _refused(_cli(home, "export", chat_id, "--out", str(out / "fifo.md"), "--force"), "not a regular file")
    into = _cli(home, "export", chat_id, "--out", str(out / "folder.md"))  # a folder: a new file inside it
    assert into.returncode == 0 and (out / "folder.md" / f"keep-my-files-{chat_id}.md").is_file()
    assert (out / "link.md").is_symlink() and target.read_text() == "behind the link"
    assert (out / "dangling.md").is_symlink() and not (out / "nothing-here.md").exists()
    assert stat.S_ISFIFO(os.lstat(out / "fifo.md").st_mode)
    assert sorted(p.name for p in out.iterdir()) == ["chat.md", "chat.md.tmp", "dangling.md", "fifo.md",
                                                     "folder.md", "link.md", "target.md"]  # no temp left


def test_export_into_a_folder_refuses_to_overwrite_without_force(tmp_path):
    home = tmp_path / "home"
    chat_id = str(_saved_chat(home))
    folder = tmp_path / "exports"
    folder.mkdir()
    first = _cli(home, "export", chat_id, "--out", str(folder))
    path = folder / f"keep-my-files-{chat_id}.md"
    assert first.returncode == 0 and path.is_file()
    path.write_text("edited by hand")
    assert _refused(_cli(home, "export", chat_id, "--out", str(folder)), str(path), "--force")
    assert path.read_text() == "edited by hand"
    assert _cli(home, "export", chat_id, "--out", str(folder), "--force").returncode == 0
    assert path.read_text().startswith("# Keep my files")
    path.unlink()
    path.mkdir()  # the chat's own file name taken by a folder: never replaced, even with --force
    assert _refused(_cli(home, "export", chat_id, "--out", str(folder), "--force"), "is a folder")
    assert "--force" in _cli(home, "export", "--help").stdout


def test_a_failed_export_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    from app import chat_export

    chat = ChatRecord(3, "t", "", 0.0)
    old = tmp_path / "t-3.md"
    old.write_text("old export")

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chat_export.os, "replace", disk_full)
    with pytest.raises(OSError):
        chat_export.write_export(chat, [], tmp_path, force=True)
    assert old.read_text() == "old export" and [p.name for p in tmp_path.iterdir()] == ["t-3.md"]
