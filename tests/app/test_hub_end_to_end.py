"""Download from the (fake) Hub, then load and generate offline: same tokens as the original folder."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main
from tests.hub_fixtures import fake_hub, hub_env  # noqa: F401
from tests.hub_server import FakeRepo


def publish(fake_hub, repo_id: str, folder: Path) -> None:
    fake_hub.add(FakeRepo(repo_id, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}))


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_download_then_run_offline_matches_the_original(hub_env, fake_hub, tiny_models, capsys, monkeypatch):
    from huggingface_hub import constants

    publish(fake_hub, "tiny/e2e-llama", tiny_models["llama"])
    assert main(["download", "tiny/e2e-llama"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub.requests.clear()
    args = ["run", "--device", "cpu", "--json", "--max-tokens", "12", "--no-spec", "Hello, how are you today?"]
    from_hub = run_json(capsys, "run", "--model", "tiny/e2e-llama", *args[1:])
    original = run_json(capsys, "run", "--model", str(tiny_models["llama"]), *args[1:])
    assert fake_hub.requests == []
    assert from_hub["token_ids"] == original["token_ids"] and len(from_hub["token_ids"]) > 0


def test_speculation_with_a_downloaded_draft_is_lossless(hub_env, fake_hub, tiny_models, tmp_path, capsys):
    from tests.speculative.heads import head_tensors, write_head

    target = json.loads((tiny_models["llama"] / "config.json").read_text())
    head = write_head(tmp_path / "head", target, "sglang",
                      head_tensors(target["hidden_size"], target["hidden_size"], 3, target["vocab_size"], 96),
                      hidden=target["hidden_size"], aux_input_ids=(0, 1, 2))
    publish(fake_hub, "tiny/e2e-llama", tiny_models["llama"])
    publish(fake_hub, "tiny/e2e-eagle3", head)
    assert main(["download", "tiny/e2e-llama", "--draft", "tiny/e2e-eagle3"]) == 0
    capsys.readouterr()
    common = ["--model", "tiny/e2e-llama", "--device", "cpu", "--json", "--max-tokens", "24", "The quick brown fox"]
    plain = run_json(capsys, "run", "--no-spec", *common)
    spec = run_json(capsys, "run", "--draft", "tiny/e2e-eagle3", *common)
    assert spec["stats"]["speculative"] and spec["stats"]["verify_steps"] > 0
    assert spec["token_ids"] == plain["token_ids"]
