"""The chat store against other processes: a lock held by another program, a full disk, two windows
opening the same history at once, and a chat deleted while another window has it open."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from app.store import ChatStore

# Holds the write lock of the database in argv[1] until a line arrives on stdin, or for argv[2] seconds.
LOCK_HOLDER = """
import sqlite3, sys, select
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def _hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path), str(seconds)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def _saved(path: Path) -> tuple[list[tuple], list[tuple]]:
    conn = sqlite3.connect(path)
    try:
        chats = conn.execute("SELECT id, title, system_prompt FROM chats ORDER BY id").fetchall()
        messages = conn.execute("SELECT chat_id, role, content FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()
    return chats, messages


def _new_db(tmp_path: Path) -> Path:
    path = tmp_path / "chats.db"
    ChatStore.open(path).close()
    return path


def test_a_lock_held_longer_than_the_old_timeout_costs_no_message(tmp_path):
    path = _new_db(tmp_path)
    store = ChatStore.open(path)
    errors: list[str] = []
    store.on_error = errors.append
    holder = _hold_lock(path, 1.5)  # the old store gave up after 1 s
    start = time.monotonic()
    chat = store.create_chat("written after the lock", "")
    for i in range(3):
        store.add_message(chat.id, "user" if i % 2 == 0 else "assistant", f"m{i}")
    waited = time.monotonic() - start
    holder.wait(timeout=10)
    assert errors == [] and store.num_pending == 0 and chat.id > 0 and waited > 1.0
    store.close()
    assert _saved(path) == ([(chat.id, "written after the lock", "")],
                            [(chat.id, "user", "m0"), (chat.id, "assistant", "m1"), (chat.id, "user", "m2")])


def test_writes_wait_in_memory_until_the_lock_is_gone_then_are_saved_in_order(tmp_path):
    path = _new_db(tmp_path)
    store = ChatStore.open(path, timeout_s=0.2)
    errors: list[str] = []
    counts: list[int] = []
    store.on_error, store.on_pending = errors.append, counts.append
    holder = _hold_lock(path, 60)
    try:
        chat = store.create_chat("while locked", "sys")
        ids = [store.add_message(chat.id, role, text) for role, text in
               [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "four")]]
        store.delete_message(ids[3])  # a regenerate: the answer goes before it was ever saved
        store.add_message(chat.id, "assistant", "four again")
        store.rename_chat(chat.id, "renamed while locked")
        assert chat.id < 0 and all(i < 0 for i in ids) and not chat.is_saved
        assert len(errors) == 1 and "database is locked" in errors[0] and "kept" in errors[0]
        assert counts == [1, 2, 3, 4, 5, 6, 7, 8] and store.num_pending == 8
        # reads show the writes still waiting
        assert [(c.title, c.is_saved) for c in store.list_chats()] == [("renamed while locked", False)]
        assert [m.content for m in store.messages(chat.id)] == ["one", "two", "three", "four again"]
        store.flush()
        assert store.num_pending == 8 and _saved(path) == ([], [])
    finally:
        holder.communicate("release\n", timeout=10)
    store.flush()
    assert store.num_pending == 0 and counts[-1] == 0 and len(errors) == 1
    chat_id = store.resolve(chat.id)
    assert chat_id > 0 and store.get_chat(chat.id).is_saved
    assert _saved(path) == ([(chat_id, "renamed while locked", "sys")],
                            [(chat_id, r, t) for r, t in [("user", "one"), ("assistant", "two"), ("user", "three"),
                                                          ("assistant", "four again")]])
    store.add_message(chat.id, "user", "after")  # the provisional id goes on working
    assert store.messages(chat_id)[-1].content == "after" and store.messages(chat_id)[-1].id > 0


def test_a_full_disk_keeps_messages_until_there_is_room(tmp_path):
    store = ChatStore.open(tmp_path / "chats.db")
    errors: list[str] = []
    store.on_error = errors.append
    chat = store.create_chat("big", "")
    pages = store.conn.execute("PRAGMA page_count").fetchone()[0]
    store.conn.execute(f"PRAGMA max_page_count = {pages}")  # what SQLite sees when the disk is full
    for i in range(20):
        store.add_message(chat.id, "user", f"{i} " + "x" * 2000)
    assert store.num_pending > 0 and "full" in errors[0] and len(errors) == 1
    assert [m.content.split()[0] for m in store.messages(chat.id)] == [str(i) for i in range(20)]
    store.conn.execute("PRAGMA max_page_count = 1000000")
    store.flush()
    assert store.num_pending == 0
    store.close()
    assert [m[2].split()[0] for m in _saved(tmp_path / "chats.db")[1]] == [str(i) for i in range(20)]


def test_writes_still_unwritable_at_close_are_kept_in_a_file(tmp_path):
    path = _new_db(tmp_path)
    store = ChatStore.open(path, timeout_s=0.1)
    holder = _hold_lock(path, 60)
    try:
        chat = store.create_chat("never written", "")
        store.add_message(chat.id, "user", "keep me")
        kept = store.close()
    finally:
        holder.communicate("release\n", timeout=10)
    writes = json.loads(kept.read_text())
    assert kept.parent == tmp_path and kept.name.startswith("chats.db.unsaved-")
    assert [(w["write"], w.get("title"), w.get("content")) for w in writes] == \
        [("NewChat", "never written", None), ("NewMessage", None, "keep me")]


# Two windows at once. Children are forked: each opens its own store, as a second app would.

def _open_latest(path: str, barrier, results) -> None:
    barrier.wait()  # both open the history at the same moment
    store = ChatStore.open(Path(path))
    chats = store.list_chats()
    holder = store.take_lease(chats[0].id) if chats else None
    results.put((os.getpid(), store.path is not None and not store.notes, holder.pid if holder else None,
                 len(chats)))
    barrier.wait()  # both keep their store open until both have tried
    store.close()


def _run_two(path: Path) -> list[tuple]:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_open_latest, args=(str(path), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    out = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return out


def test_two_apps_opening_at_once_do_not_share_the_latest_chat(tmp_path):
    path = tmp_path / "chats.db"
    fresh = _run_two(path)  # a fresh history: both create and migrate it at once
    assert [(ok, chats) for _, ok, _, chats in fresh] == [(True, 0), (True, 0)]
    store = ChatStore.open(path)
    store.create_chat("latest", "")
    store.close()  # gives up its lease

    results = _run_two(path)
    winners = [pid for pid, ok, holder, _ in results if holder is None]
    refused = [holder for pid, ok, holder, _ in results if holder is not None]
    assert all(ok for _, ok, _, _ in results)
    assert len(winners) == 1 and refused == winners  # the other is told which window has it

    store = ChatStore.open(path)  # both closed: the chat is free again
    assert store.take_lease(store.list_chats()[0].id) is None


def _hold_chat(path: str, chat_id: int, ready, go, exit_without_closing: bool) -> None:
    store = ChatStore.open(Path(path))
    assert store.take_lease(chat_id) is None
    ready.set()
    if exit_without_closing:
        os._exit(0)  # as if killed: the lease row stays, its pid is gone
    go.wait(30)
    store.add_message(chat_id, "user", "written after the other window tried to delete")
    store.close()


def test_a_chat_open_in_another_window_is_not_deleted_and_a_dead_window_lets_go(tmp_path):
    ctx = multiprocessing.get_context("fork")
    path = tmp_path / "chats.db"
    store = ChatStore.open(path)
    chat = store.create_chat("shared", "")
    store.release_lease(chat.id)

    ready, go = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_chat, args=(str(path), chat.id, ready, go, False))
    other.start()
    assert ready.wait(30)
    holder = store.delete_chat(chat.id)
    assert holder is not None and holder.pid == other.pid and "pid" in holder.describe()
    assert store.take_lease(chat.id).pid == other.pid
    go.set()
    other.join(30)
    assert [m.content for m in store.messages(chat.id)] == ["written after the other window tried to delete"]
    assert store.delete_chat(chat.id) is None and store.get_chat(chat.id) is None

    chat = store.create_chat("left behind", "")
    store.release_lease(chat.id)
    ready = ctx.Event()
    dead = ctx.Process(target=_hold_chat, args=(str(path), chat.id, ready, go, True))
    dead.start()
    dead.join(30)
    assert ready.is_set() and store.conn.execute("SELECT pid FROM chat_leases").fetchall() == [(dead.pid,)]
    assert store.take_lease(chat.id) is None  # its pid is gone: the lease is taken over
