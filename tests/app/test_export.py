"""Chats as Markdown: Ctrl+S in the app, `localchat chats` and `localchat export ID` on the
command line (as a user runs them: a subprocess against the same LOCALCHAT_HOME)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
