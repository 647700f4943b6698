"""engine.hub.download against the fake Hub: what is fetched, errors, interruption, disk, offline, cancel."""

from __future__ import annotations

import threading
from collections import namedtuple
from pathlib import Path

import pytest

from engine.hub.progress import DownloadCancelled
from engine.errors import UserError
from engine.hub.download import plan_download, run_download, select_files
from engine.hub.errors import DownloadInterrupted
from engine.hub.local_models import cached_snapshot
from engine.hub.resolve import resolve
from tests.hub_fixtures import cache_files, fake_hub, hub_env  # noqa: F401

NEEDED = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
}


def snapshot_names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_select_files_skips_pickles_and_subfolders():
    names = ["config.json", "model.safetensors", "pytorch_model.bin", "original/consolidated.pth", "x.gguf", "README.md"]
    assert select_files(names) == ["config.json", "model.safetensors"]
    assert select_files(["config.json", "pytorch_model.bin"], allow_bin=True) == ["config.json", "pytorch_model.bin"]
    assert "x.gguf" in select_files(names, include=("*.gguf",))


def test_download_fetches_only_needed_files(hub_env, fake_hub):
    seen = []
    plan = plan_download("tiny/llama", draft="tiny/llama-eagle3")
    assert plan.missing_bytes == sum(r.total_bytes for r in plan.repos) > 0
    result = run_download(plan, on_progress=seen.append)
    assert snapshot_names(result.target) == NEEDED
    assert snapshot_names(result.draft) == {"config.json", "model.safetensors"}
    assert seen[-1].finished and seen[-1].done_bytes == seen[-1].total_bytes == plan.missing_bytes
    fetched = " ".join(fake_hub.file_gets())
    assert "pytorch_model.bin" not in fetched and "consolidated" not in fetched and "README" not in fetched
    assert resolve("tiny/llama").path == result.target == cached_snapshot("tiny/llama")
    # a second plan sees everything cached and downloads nothing
    again = plan_download("tiny/llama", draft="tiny/llama-eagle3")
    assert again.missing_bytes == 0
    fake_hub.requests.clear()
    run_download(again)
    assert fake_hub.file_gets() == []


def test_gated_repo_without_token_says_how_to_log_in(hub_env, fake_hub):
    plan = plan_download("tiny/gated-llama")
    with pytest.raises(UserError, match=r"tiny/gated-llama is gated.*hf auth login.*HF_TOKEN"):
        run_download(plan)
    assert cached_snapshot("tiny/gated-llama") is None
    assert not any(".incomplete" in f or "blobs" in f for f in cache_files(hub_env))


def test_gated_repo_with_token_downloads(hub_env, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", fake_hub.token)
    result = run_download(plan_download("tiny/gated-llama"))
    assert snapshot_names(result.target) == NEEDED


def test_missing_repo_and_missing_revision(hub_env):
    with pytest.raises(UserError, match=r"no model repository 'tiny/nope' on the Hub"):
        plan_download("tiny/nope")
    with pytest.raises(UserError, match=r"tiny/llama has no revision 'v9'"):
        plan_download("tiny/llama", revision="v9")
    with pytest.raises(UserError, match=r"not a Hub repository id"):
        plan_download("no-slash")


def test_missing_file_is_reported_by_name(hub_env, fake_hub):
    plan = plan_download("tiny/llama")
    del fake_hub.repos["tiny/llama"].files["tokenizer.json"]  # listed in the plan, gone on the server
    try:
        with pytest.raises(UserError, match=r"tiny/llama has no file 'tokenizer.json'"):
            run_download(plan)
    finally:
        from tests.hub_fixtures import tiny_llama_files

        fake_hub.repos["tiny/llama"].files["tokenizer.json"] = tiny_llama_files()["tokenizer.json"]
    assert cached_snapshot("tiny/llama") is None


def test_repo_without_weights_is_refused(hub_env):
    with pytest.raises(UserError, match=r"tiny/no-weights has no \.safetensors weights"):
        plan_download("tiny/no-weights")


def test_dropped_connection_then_next_attempt_completes(hub_env, fake_hub):
    from tests.hub_server import Drop

    shard = "model-00002-of-00002.safetensors"
    # more drops than huggingface_hub's own resume attempts, so this attempt fails
    fake_hub.drops[("tiny/llama", shard)] = Drop(after_bytes=1000, times=10)
    plan = plan_download("tiny/llama")
    with pytest.raises(DownloadInterrupted, match=r"connection dropped while downloading tiny/llama/" + shard):
        run_download(plan)
    files = cache_files(hub_env)
    assert not any(f.endswith(".incomplete") for f in files)
    assert not any(f.endswith(shard) for f in files)  # no partial file under the final name
    assert cached_snapshot("tiny/llama") is None
    fake_hub.drops.clear()
    retry = plan_download("tiny/llama")
    assert 0 < retry.missing_bytes < plan.missing_bytes  # finished files were kept
    result = run_download(retry)
    assert (result.target / shard).read_bytes() == fake_hub.repos["tiny/llama"].files[shard]


def test_a_short_drop_is_resumed_within_one_attempt(hub_env, fake_hub):
    from tests.hub_server import Drop

    shard = "model-00001-of-00002.safetensors"
    fake_hub.drops[("tiny/llama", shard)] = Drop(after_bytes=5000, times=1)
    result = run_download(plan_download("tiny/llama"))
    assert (result.target / shard).read_bytes() == fake_hub.repos["tiny/llama"].files[shard]


def test_not_enough_disk_is_refused_before_any_byte(hub_env, fake_hub, monkeypatch):
    import shutil

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    plan = plan_download("tiny/llama", draft="tiny/llama-eagle3")
    assert not plan.is_disk_enough
    with pytest.raises(UserError, match=r"not enough free disk for tiny/llama: need .* free in"):
        run_download(plan)
    assert fake_hub.file_gets() == []
    assert cache_files(hub_env) == []


def test_mismatched_draft_is_refused_naming_both(hub_env, fake_hub):
    plan = plan_download("tiny/llama", draft="tiny/wide-eagle3")
    with pytest.raises(UserError, match=r"draft tiny/wide-eagle3 does not match target tiny/llama: hidden size 96 vs 64"):
        run_download(plan)
    assert not any(".safetensors" in p for p in fake_hub.file_gets())  # only the two config.json


def test_cancel_stops_and_keeps_nothing_partial(hub_env, fake_hub):
    cancel = threading.Event()

    def on_progress(p):
        if p.done_bytes > 20_000:
            cancel.set()

    plan = plan_download("tiny/llama")
    with pytest.raises(DownloadCancelled):
        run_download(plan, on_progress, cancel)
    assert not any(f.endswith(".incomplete") for f in cache_files(hub_env))
    assert cached_snapshot("tiny/llama") is None


def test_offline_uses_the_cache_or_says_it_is_not_there(hub_env, fake_hub, monkeypatch):
    from huggingface_hub import constants

    run_download(plan_download("tiny/llama"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub.requests.clear()
    assert resolve("tiny/llama").path == cached_snapshot("tiny/llama")
    with pytest.raises(UserError, match=r"tiny/llama-eagle3 is not in the local cache and HF_HUB_OFFLINE is set"):
        resolve("tiny/llama-eagle3", what="draft")
    with pytest.raises(UserError, match=r"HF_HUB_OFFLINE is set"):
        plan_download("tiny/llama-eagle3")
    assert fake_hub.requests == []


def test_loading_a_repo_id_downloads_it_once(hub_env, fake_hub):
    lines = []
    source = resolve("tiny/llama", log=lambda message, fraction: lines.append(message))
    assert source.path == cached_snapshot("tiny/llama")
    assert lines and lines[-1].startswith("downloading tiny/llama:") and "ETA" in lines[-1]
    fake_hub.requests.clear()
    assert resolve("tiny/llama").path == source.path
    assert fake_hub.requests == []  # the cache answers; no Hub call


def test_incomplete_snapshot_is_not_used(hub_env, fake_hub):
    run_download(plan_download("tiny/llama"))
    snapshot = cached_snapshot("tiny/llama")
    (snapshot / "model-00002-of-00002.safetensors").unlink()
    assert cached_snapshot("tiny/llama") is None
    assert resolve("tiny/llama").path == snapshot  # fetched again
    assert (snapshot / "model-00002-of-00002.safetensors").is_file()


def test_localchat_home_moves_the_hub_cache_unless_hf_home_is_set(hub_env, tmp_path, monkeypatch):
    from engine.hub.cache import cache_dir

    assert cache_dir() == hub_env  # HF_HOME is set by the fixture: the user's choice wins
    monkeypatch.delenv("HF_HOME")
    assert cache_dir() == tmp_path / "localchat" / "cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_env))
    assert cache_dir() == hub_env
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("LOCALCHAT_HOME")
    assert cache_dir() == hub_env  # neither: huggingface_hub's own default


def test_download_list_and_load_agree_on_the_moved_cache(hub_env, tmp_path, monkeypatch):
    from engine.hub.local_models import list_cached_models

    monkeypatch.delenv("HF_HOME")
    moved = tmp_path / "localchat" / "cache" / "huggingface" / "hub"
    result = run_download(plan_download("tiny/llama", draft="tiny/llama-eagle3"))
    assert result.target.is_relative_to(moved) and result.draft.is_relative_to(moved)
    assert not hub_env.exists()  # nothing went to huggingface_hub's default
    listed = {m.name: m.path for m in list_cached_models()}
    assert listed["tiny/llama"] == result.target and listed["tiny/llama-eagle3"] == result.draft
    assert resolve("tiny/llama").path == result.target == cached_snapshot("tiny/llama")
    assert plan_download("tiny/llama").missing_bytes == 0
