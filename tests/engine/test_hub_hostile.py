"""engine.hub.download against a broken or hostile Hub: bad commits, ETags and names, wrong bytes, corrupt caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ModelLoadError, UserError
from engine.hub.download import plan_download, run_download
from engine.hub.errors import DownloadCorrupt
from engine.hub.metadata import HubAnswerError, check_repo_path
from engine.hub.local_models import cached_snapshot
from tests.hub_fixtures import cache_files, fake_hub, hub_env  # noqa: F401
from tests.hub_server import Tamper

SHARD = "model-00002-of-00002.safetensors"


def files_outside(top: Path, *allowed: Path) -> list[str]:
    """Every file under `top` that is not under one of `allowed`."""
    found = []
    for p in top.rglob("*"):
        if (p.is_file() or p.is_symlink()) and not any(p.is_relative_to(a) for a in allowed):
            found.append(str(p.relative_to(top)))
    return found


def assert_one_line(exc: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("name, etag", [
    (SHARD, '"../../../../escaped"'),  # LFS: the blob would be named after X-Linked-Etag
    ("tokenizer.json", 'W/"../../../../escaped"'),  # a git file: named after the ETag
    (SHARD, '"' + "A" * 64 + '"'),  # uppercase is not what the Hub sends
    ("tokenizer.json", '"' + "0" * 64 + '"'),  # a sha256 where a git sha1 belongs
])
def test_a_bad_etag_is_refused_and_nothing_lands_outside_the_cache(hub_env, fake_hub, tmp_path, name, etag):
    fake_hub.tampers[("tiny/llama", name)] = Tamper(etag=etag)
    plan = plan_download("tiny/llama")
    with pytest.raises(HubAnswerError) as exc:
        run_download(plan)
    assert_one_line(exc, f"invalid ETag for tiny/llama/{name}", "nothing was written")
    assert files_outside(tmp_path, hub_env, tmp_path / "localchat") == []
    digest = next(f for f in plan.target.files if f.name == name).listed.digest.hex
    assert not any(digest in f or "escaped" in f or f.endswith(name) for f in cache_files(hub_env))
    assert cached_snapshot("tiny/llama") is None


def test_an_etag_that_differs_from_the_listing_is_refused(hub_env, fake_hub):
    fake_hub.tampers[("tiny/llama", SHARD)] = Tamper(etag='"' + "ab" * 32 + '"')
    with pytest.raises(HubAnswerError, match=r"ETag for tiny/llama/model-00002.*differs from its file listing"):
        run_download(plan_download("tiny/llama"))


@pytest.mark.parametrize("commit", ["../../../../escaped", "A" * 40, "abc123", "0" * 64])
def test_a_bad_commit_in_the_model_info_is_refused_before_anything_is_written(hub_env, fake_hub, tmp_path, commit):
    fake_hub.info_commits["tiny/llama"] = commit
    with pytest.raises(HubAnswerError) as exc:
        plan_download("tiny/llama")
    assert_one_line(exc, "invalid commit hash for tiny/llama")
    assert cache_files(hub_env) == []
    assert fake_hub.file_gets() == []


def test_a_bad_commit_in_a_file_answer_is_refused(hub_env, fake_hub, tmp_path):
    fake_hub.tampers[("tiny/llama", "config.json")] = Tamper(commit="../../../../escaped")
    with pytest.raises(HubAnswerError, match=r"invalid commit hash for tiny/llama"):
        run_download(plan_download("tiny/llama"))
    assert cache_files(hub_env) == []
    fake_hub.tampers[("tiny/llama", "config.json")] = Tamper(commit="f" * 40)  # well-formed, but not the one asked
    with pytest.raises(HubAnswerError, match=r"answered commit f{40} for tiny/llama/config.json, asked for"):
        run_download(plan_download("tiny/llama"))
    assert cache_files(hub_env) == []


@pytest.mark.parametrize("listed", ["../../outside.json", "/etc/outside.json", "a\\..\\..\\x.json", "a//b.json",
                                    "./x.json", "sub/../../x.json", "sub/", "bad\nname.json"])
def test_a_listed_name_outside_the_repo_is_refused(hub_env, fake_hub, listed):
    fake_hub.tampers[("tiny/llama", "README.md")] = Tamper(listed_name=listed)  # even a file we would not fetch
    with pytest.raises(HubAnswerError) as exc:
        plan_download("tiny/llama")
    assert_one_line(exc, "invalid file name in tiny/llama")
    assert cache_files(hub_env) == []


def test_good_names_pass():
    for name in ("config.json", "sub/dir/model.gguf", "a.b-c_d.safetensors", "weird name (1).json"):
        assert check_repo_path(name, "o/n") == name


def test_a_revision_that_leaves_refs_is_refused(hub_env, fake_hub):
    for revision in ("../../../escaped", "a/../../b", "a\\b"):
        with pytest.raises(UserError, match=r"--revision .* is not a branch, tag or commit name"):
            plan_download("tiny/llama", revision=revision)
    assert fake_hub.requests == []


@pytest.mark.parametrize("name", [SHARD, "tokenizer.json"])
def test_wrong_bytes_of_the_right_size_are_deleted_and_the_next_download_completes(hub_env, fake_hub, name):
    good = fake_hub.repos["tiny/llama"].files[name]
    fake_hub.tampers[("tiny/llama", name)] = Tamper(body=bytes(b ^ 0xFF for b in good[:64]) + good[64:])
    plan = plan_download("tiny/llama")
    kind = "sha256" if name.endswith(".safetensors") else "git blob sha1"
    with pytest.raises(DownloadCorrupt) as exc:
        run_download(plan)
    assert_one_line(exc, f"tiny/llama/{name} does not match the {kind} the Hub lists", "deleted it")
    digest = next(f for f in plan.target.files if f.name == name).listed.digest.hex
    kept = [f for f in cache_files(hub_env) if not f.startswith(".locks/")]  # an empty lock file may stay
    assert not any(digest in f or f.endswith(name) for f in kept)
    assert cached_snapshot("tiny/llama") is None
    fake_hub.tampers.clear()
    retry = plan_download("tiny/llama")
    assert name in [f.name for f in retry.target.files if not f.is_cached]
    assert retry.missing_bytes < plan.missing_bytes  # finished files were kept
    result = run_download(retry)
    assert (result.target / name).read_bytes() == good


def corrupt_in_place(path: Path) -> None:
    """Same size, different bytes, as a bad disk or an old download without checks leaves a file."""
    blob = path.resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))


def test_a_corrupt_cached_file_is_found_by_the_next_plan_and_repaired(hub_env, fake_hub):
    good = fake_hub.repos["tiny/llama"].files[SHARD]
    snapshot = run_download(plan_download("tiny/llama")).target
    assert plan_download("tiny/llama").missing_bytes == 0
    corrupt_in_place(snapshot / SHARD)
    hashed = []
    plan = plan_download("tiny/llama", on_hash=lambda name, size: hashed.append(name))
    assert hashed == [f"tiny/llama/{SHARD}"]  # only the rewritten file is hashed again
    assert [f.name for f in plan.target.corrupt] == [SHARD]
    assert plan.missing_bytes == len(good)
    result = run_download(plan)
    assert (result.target / SHARD).read_bytes() == good
    assert plan_download("tiny/llama").missing_bytes == 0


def test_a_file_checked_once_is_not_hashed_again(hub_env, fake_hub, monkeypatch, tmp_path):
    import shutil

    from engine.hub.metadata import Digest

    run_download(plan_download("tiny/llama"))
    shutil.rmtree(tmp_path / "localchat" / "cache" / "hub-verified")  # as if another tool had downloaded it
    hashed = []
    assert plan_download("tiny/llama", on_hash=lambda name, size: hashed.append(name)).missing_bytes == 0
    assert len(hashed) == 7  # every needed file, once

    def no_hashing(self, path):
        raise AssertionError(f"hashed {path} again")

    monkeypatch.setattr(Digest, "of_file", no_hashing)
    assert plan_download("tiny/llama").missing_bytes == 0


def test_a_truncated_file_is_corrupt_too(hub_env, fake_hub):
    snapshot = run_download(plan_download("tiny/llama")).target
    blob = (snapshot / SHARD).resolve()
    blob.write_bytes(blob.read_bytes()[:-10])
    assert [f.name for f in plan_download("tiny/llama").target.corrupt] == [SHARD]


def test_an_unreadable_cached_file_names_its_path_and_the_repair(hub_env, fake_hub):
    from engine.weights.load import iter_safetensors

    snapshot = run_download(plan_download("tiny/llama")).target
    blob = (snapshot / SHARD).resolve()
    data = bytearray(blob.read_bytes())
    data[8:16] = b"\xff" * 8  # a header that is not JSON
    blob.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError) as exc:
        list(iter_safetensors([snapshot / SHARD]))
    assert_one_line(exc, str(snapshot / SHARD), "file truncated or corrupt?", "`localchat download tiny/llama`")
    plan = plan_download("tiny/llama")
    assert [f.name for f in plan.target.corrupt] == [SHARD]
    result = run_download(plan)
    assert dict(iter_safetensors([result.target / SHARD]))  # readable again


def test_an_unreadable_gguf_names_its_path(tmp_path):
    from engine.weights.gguf import open_gguf

    path = tmp_path / "models--some--repo" / "snapshots" / ("c" * 40) / "m.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF" + b"\x00" * 12)
    with pytest.raises(ModelLoadError) as exc:
        open_gguf(path)
    assert_one_line(exc, str(path), "file truncated or corrupt?", "`localchat download some/repo`")


def test_partial_files_left_by_a_killed_process_are_removed_unless_held(hub_env, fake_hub):
    from filelock import FileLock

    plan = plan_download("tiny/llama")
    blobs = hub_env / "models--tiny--llama" / "blobs"
    blobs.mkdir(parents=True)
    stale, held = blobs / ("1" * 64 + ".incomplete"), blobs / ("2" * 64 + ".incomplete")
    stale.write_bytes(b"x" * 1000)
    held.write_bytes(b"x" * 1000)
    lock = hub_env / ".locks" / "models--tiny--llama" / ("2" * 64 + ".lock")
    lock.parent.mkdir(parents=True)
    with FileLock(str(lock)):  # another download is busy with this one
        run_download(plan)
    assert not stale.exists() and held.exists()
    assert cached_snapshot("tiny/llama") is not None


def test_a_resume_answered_with_the_whole_body_starts_the_file_over(hub_env, fake_hub):
    from tests.hub_server import Drop

    good = fake_hub.repos["tiny/llama"].files[SHARD]
    fake_hub.drops[("tiny/llama", SHARD)] = Drop(after_bytes=5000, times=1)
    fake_hub.tampers[("tiny/llama", SHARD)] = Tamper(ignore_range=True)
    seen = []
    plan = plan_download("tiny/llama")
    result = run_download(plan, on_progress=seen.append)
    assert (result.target / SHARD).read_bytes() == good
    assert seen[-1].done_bytes == plan.missing_bytes  # the 5000 bytes thrown away are not counted twice
