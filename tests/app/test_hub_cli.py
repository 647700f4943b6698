"""`localchat download` and `localchat models` against the fake Hub: exit codes, one-line errors, progress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

from app.cli import main
from tests.hub_fixtures import cache_files, fake_hub, hub_env  # noqa: F401
from tests.hub_server import Drop

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("localchat:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_download_prints_progress_and_paths(hub_env, capsys):
    code, out, err = run_cli(capsys, "download", "tiny/llama", "--draft", "tiny/llama-eagle3")
    assert code == 0, err
    target, draft = out.splitlines()
    assert (Path(target) / "model-00002-of-00002.safetensors").is_file()
    assert (Path(draft) / "model.safetensors").is_file()
    assert "tiny/llama + tiny/llama-eagle3:" in err and "to download" in err
    assert "ETA" in err and "/s" in err and "[####" in err


def test_download_in_a_real_process_uses_hf_endpoint(fake_hub, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "app.cli", "download", "tiny/llama"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(tmp_path / "hf" / "hub")
    assert "100%" not in done.stderr and "ETA 0:00" in done.stderr  # our bar, not tqdm's


def test_gated_repo_exits_2_with_login_hint(hub_env, capsys):
    code, _, err = run_cli(capsys, "download", "tiny/gated-llama")
    assert code == 2
    assert_one_line_error(err, "tiny/gated-llama is gated", "hf auth login", "HF_TOKEN")


def test_missing_repo_and_bad_id_exit_2(hub_env, capsys):
    code, _, err = run_cli(capsys, "download", "tiny/nope")
    assert code == 2
    assert_one_line_error(err, "no model repository 'tiny/nope'")
    code, _, err = run_cli(capsys, "download", "not a repo")
    assert code == 2
    assert_one_line_error(err, "not a Hub repository id")


def test_mismatched_draft_exits_2_naming_both(hub_env, capsys):
    code, _, err = run_cli(capsys, "download", "tiny/llama", "--draft", "tiny/wide-eagle3")
    assert code == 2
    assert_one_line_error(err, "tiny/wide-eagle3", "tiny/llama", "does not match")


def test_not_enough_disk_exits_2_before_downloading(hub_env, fake_hub, capsys, monkeypatch):
    import shutil

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 10, 10))
    code, _, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 2
    assert_one_line_error(err, "not enough free disk", "HF_HOME")
    assert fake_hub.file_gets() == [] and cache_files(hub_env) == []


def test_dropped_connection_exits_1_and_rerun_completes(hub_env, fake_hub, capsys):
    fake_hub.drops[("tiny/llama", "model-00001-of-00002.safetensors")] = Drop(after_bytes=100, times=10)
    code, _, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 1
    assert_one_line_error(err, "connection dropped", "run the same command again")
    assert not any(f.endswith(".incomplete") for f in cache_files(hub_env))
    fake_hub.drops.clear()
    code, out, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 0, err
    assert (Path(out.strip()) / "model-00001-of-00002.safetensors").is_file()


def test_models_lists_local_models_drafts_and_catalog(hub_env, capsys):
    assert main(["download", "tiny/llama", "--draft", "tiny/llama-eagle3"]) == 0
    capsys.readouterr()
    code, out, _ = run_cli(capsys, "models", "--json")
    assert code == 0
    data = json.loads(out)
    kinds = {m["name"]: m["kind"] for m in data["local"]}
    assert kinds == {"tiny/llama": "model", "tiny/llama-eagle3": "draft"}
    ids = {e["id"] for e in data["catalog"]}
    assert {"demo", "llama-3.1-8b", "qwen3-8b", "qwen3-1.7b", "qwen3-4b", "r1-distill-llama-8b", "mimo-7b-rl"} <= ids
    assert all(e["fit"] in ("fits", "tight", "does not fit", "no GPU") for e in data["catalog"])
    code, out, _ = run_cli(capsys, "models")
    assert "tiny/llama-eagle3" in out and "draft" in out and "Qwen/Qwen3-8B" in out
    code, _, err = run_cli(capsys, "models", "--context", "0")
    assert code == 2
    assert_one_line_error(err, "--context must be >= 1")


def test_catalog_id_brings_its_draft(hub_env, capsys):
    code, _, err = run_cli(capsys, "download", "qwen3-8b")
    assert code == 2  # the fake Hub has no Qwen; the message shows which repo was asked for
    assert_one_line_error(err, "no model repository 'Qwen/Qwen3-8B'")


def test_pickled_only_draft_needs_allow_bin(hub_env, capsys):
    code, _, err = run_cli(capsys, "download", "tiny/llama", "--draft", "tiny/bin-only-eagle3")
    assert code == 2
    assert_one_line_error(err, "tiny/bin-only-eagle3 has no .safetensors weights", "--allow-bin")
    code, out, err = run_cli(capsys, "download", "tiny/llama", "--draft", "tiny/bin-only-eagle3", "--allow-bin")
    assert code == 0, err
    assert (Path(out.splitlines()[1]) / "pytorch_model.bin").is_file()
    assert not (Path(out.splitlines()[0]) / "pytorch_model.bin").exists()  # the target has safetensors


def test_a_hostile_etag_exits_2_and_writes_nothing_outside_the_cache(hub_env, fake_hub, capsys, tmp_path):
    from tests.hub_server import Tamper

    fake_hub.tampers[("tiny/llama", "model-00001-of-00002.safetensors")] = Tamper(etag='"../../../../escaped"')
    code, out, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 2 and out == ""
    assert_one_line_error(err, "invalid ETag for tiny/llama/model-00001-of-00002.safetensors", "nothing was written")
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(hub_env)
               and not p.is_relative_to(tmp_path / "localchat")]
    assert outside == []


def test_a_bad_commit_exits_2(hub_env, fake_hub, capsys):
    fake_hub.info_commits["tiny/llama"] = "../../escaped"
    code, _, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 2
    assert_one_line_error(err, "invalid commit hash for tiny/llama")
    assert cache_files(hub_env) == []


def test_wrong_bytes_exit_1_and_the_rerun_repairs(hub_env, fake_hub, capsys):
    from tests.hub_server import Tamper

    name = "model-00002-of-00002.safetensors"
    good = fake_hub.repos["tiny/llama"].files[name]
    fake_hub.tampers[("tiny/llama", name)] = Tamper(body=good[:-4] + b"\0\0\0\0")
    code, _, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 1
    assert_one_line_error(err, f"tiny/llama/{name} does not match the sha256", "run the same command again")
    fake_hub.tampers.clear()
    code, out, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 0, err
    assert (Path(out.strip()) / name).read_bytes() == good


def test_a_corrupt_cached_file_is_not_0_bytes_to_download(hub_env, fake_hub, capsys):
    name = "model-00001-of-00002.safetensors"
    good = fake_hub.repos["tiny/llama"].files[name]
    assert main(["download", "tiny/llama"]) == 0
    snapshot = Path(capsys.readouterr().out.strip())
    blob = (snapshot / name).resolve()
    blob.write_bytes(good[:100] + bytes(b ^ 1 for b in good[100:200]) + good[200:])
    code, out, err = run_cli(capsys, "download", "tiny/llama")
    assert code == 0, err
    assert f"the cached tiny/llama/{name} does not match the Hub's sha256: fetching it again" in err
    from engine.units import format_bytes

    assert f"tiny/llama: {format_bytes(len(good))} to download" in err
    assert (snapshot / name).read_bytes() == good
    code, out, err = run_cli(capsys, "download", "tiny/llama")
    assert "tiny/llama: 0 B to download" in err and "checking" not in err  # known good now: not hashed again


def test_localchat_home_alone_puts_downloads_under_it(fake_hub, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "XDG_"))}
    env |= {"HF_ENDPOINT": fake_hub.url, "LOCALCHAT_HOME": str(tmp_path / "lc"), "PYTHONPATH": str(ROOT),
            "HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "app.cli", "download", "tiny/llama"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(tmp_path / "lc" / "cache" / "huggingface" / "hub")
    assert not (tmp_path / "home").exists()  # not ~/.cache/huggingface
    listed = subprocess.run([sys.executable, "-m", "app.cli", "models", "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert [m["path"] for m in json.loads(listed.stdout)["local"] if m["name"] == "tiny/llama"] == [done.stdout.strip()]
