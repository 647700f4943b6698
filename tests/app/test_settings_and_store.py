"""Unit tests of the settings file and the chat store, below the UI."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from app.paths import AppPaths
from app.settings import Settings, dumps_toml, load_settings, save_settings
from app.store import MIGRATIONS, SCHEMA_VERSION, ChatStore


def test_localchat_home_overrides_both_folders(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    paths = AppPaths.resolve()
    assert paths.db_path == tmp_path / "data" / "chats.db"
    assert paths.settings_path == tmp_path / "config" / "settings.toml"
    monkeypatch.delenv("LOCALCHAT_HOME")
    assert "localchat" in str(AppPaths.resolve().data_dir)


def test_toml_writer_round_trips_awkward_strings(tmp_path):
    settings = Settings(temperature=0.1, system_prompt='Quote " back\\slash\nnew line\ttab \x01 ünïcode #not-a-comment')
    save_settings(tmp_path / "s.toml", settings)
    assert load_settings(tmp_path / "s.toml") == (settings, [])
    assert tomllib.loads(dumps_toml({"x": 1e-7, "y": True}))["x"] == 1e-7


def test_settings_validation_and_bad_toml(tmp_path):
    with pytest.raises(ValueError, match="top_p"):
        Settings(top_p=0.0)
    with pytest.raises(ValueError, match="draft_steps"):
        Settings(draft_steps=0)
    path = tmp_path / "settings.toml"
    path.write_text("temperature = [oops")
    settings, notes = load_settings(path)
    assert settings == Settings() and "Cannot read settings" in notes[0]
    path.write_text("speculative = 1\nmax_tokens = 0\ntemperature = 1\n")
    settings, notes = load_settings(path)
    assert settings.speculative is True and settings.max_tokens == 512 and settings.temperature == 1.0
    assert len(notes) == 2


def test_unwritable_config_folder_falls_back_to_defaults(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings, notes = load_settings(blocker / "config" / "settings.toml")
    assert settings == Settings() and "cannot be created" in notes[0]


def test_store_keeps_chats_messages_and_stats(tmp_path):
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.create_chat("t", "sys")
    store.add_message(chat.id, "user", "hi")
    store.add_message(chat.id, "assistant", "yo", {"decode_tok_s": 12.5}, "stop", "m")
    store.close()
    store = ChatStore.open(tmp_path / "chats.db")
    assert store.notes == []
    messages = store.messages(chat.id)
    assert [(m.role, m.content) for m in messages] == [("user", "hi"), ("assistant", "yo")]
    assert messages[1].stats == {"decode_tok_s": 12.5} and messages[1].model == "m"
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.delete_chat(chat.id)
    assert store.messages(chat.id) == []  # messages go with their chat


def test_migrations_upgrade_an_old_database(tmp_path):
    path = tmp_path / "chats.db"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    old.executescript(MIGRATIONS[0])
    old.execute("INSERT INTO schema_version VALUES (1)")
    old.execute("INSERT INTO chats (title, system_prompt, created_at, updated_at) VALUES ('old', '', 0, 0)")
    old.execute("INSERT INTO messages (chat_id, role, content, created_at) VALUES (1, 'user', 'kept', 0)")
    old.commit()
    old.close()
    store = ChatStore.open(path)
    assert store.conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    assert store.messages(1)[0].content == "kept" and store.messages(1)[0].model is None
    store.add_message(1, "assistant", "new", model="m")
    assert store.messages(1)[1].model == "m"


def test_write_failure_is_reported_not_raised(tmp_path):
    store = ChatStore.open(tmp_path / "chats.db")
    errors = []
    store.on_error = errors.append
    assert store.add_message(12345, "user", "no such chat") is None  # foreign key fails
    assert errors and "Could not save a message" in errors[0] and "FOREIGN KEY" in errors[0]
    assert store.num_pending == 0  # refused for good: not tried again and again


def test_importing_the_app_does_not_import_torch():
    root = Path(__file__).resolve().parents[2]
    code = "import sys; import app.tui; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().temperature = 1.0  # type: ignore[misc]


def test_unopenable_database_is_left_alone(tmp_path):
    path = tmp_path / "chats.db"
    path.mkdir()  # a folder where the file should be: cannot open, must not be renamed
    store = ChatStore.open(path)
    assert store.path is None and "will not be saved" in store.notes[0]
    assert path.is_dir() and not list(tmp_path.glob("chats.db.corrupt-*"))
    chat = store.create_chat("t", "")
    assert store.get_chat(chat.id).title == "t"  # the session still works, in memory
