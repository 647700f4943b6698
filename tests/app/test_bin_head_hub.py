"""A catalog head that ships only pytorch_model.bin (as the catalog's EAGLE-3 heads do), end to
end through the fake Hub: download, `models` listing and fit, then `run` with speculation on,
answering with the same tokens as without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from app.cli import main
from engine.hub.catalog import Catalog, CatalogEntry
from tests.hub_fixtures import fake_hub, hub_env  # noqa: F401
from tests.hub_server import FakeRepo
from tests.speculative.heads import head_tensors, write_head
from tests.tiny import make_tiny_model, read_config

TARGET, DRAFT = "tiny/bin-target", "tiny/bin-eagle3"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A 4-layer target (the official EAGLE format picks aux layers 2, L/2, L-3) and its head,
    in the official format (LlamaForCausalLM + draft_vocab_size), as a bf16 pytorch_model.bin."""
    base = tmp_path_factory.mktemp("bin_hub")
    target = make_tiny_model(base / "target", "llama", num_layers=4, seed=3)
    cfg = read_config(target)
    head = write_head(base / "head", cfg, "eagle", head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64, None)
    tensors = load_file(head / "model.safetensors")
    torch.save({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()},
               head / "pytorch_model.bin")
    (head / "model.safetensors").unlink()
    return target, head


@pytest.fixture
def published(hub_env, fake_hub, folders, monkeypatch):
    """Both repos on the fake Hub, and a catalog that pairs them with the head marked allow_bin."""
    import engine.hub.catalog
    import engine.hub.pairing

    for repo, folder in zip((TARGET, DRAFT), folders):
        fake_hub.add(FakeRepo(repo, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}))
    shape = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 16}
    entry = CatalogEntry.from_json({
        "id": "tiny-bin", "label": "tiny target + .bin head",
        "target": dict(shape, repo=TARGET, size_bytes=10**6),
        "draft": dict(shape, repo=DRAFT, kind="eagle3", allow_bin=True, size_bytes=10**6, num_layers=1),
    })
    catalog = Catalog(engine.hub.catalog.load_catalog().entries + (entry,))
    for module in (engine.hub.catalog, engine.hub.pairing):
        monkeypatch.setattr(module, "load_catalog", lambda path=None: catalog)
    return hub_env


def run_json(capsys, *argv: str) -> dict:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


COMMON = ["--model", TARGET, "--device", "cpu", "--json", "--max-tokens", "24", "The quick brown fox"]


def test_download_list_and_speculate_with_a_bin_only_catalog_head(published, fake_hub, capsys, monkeypatch):
    from huggingface_hub import constants

    assert main(["download", TARGET, "--draft", DRAFT]) == 0  # no --allow-bin: the catalog says so
    target_dir, draft_dir = (Path(p) for p in capsys.readouterr().out.splitlines())
    assert sorted(p.name for p in draft_dir.iterdir()) == ["config.json", "pytorch_model.bin"]
    assert (target_dir / "model.safetensors").is_file()

    listing = run_json(capsys, "models", "--json")
    local = {m["name"]: m for m in listing["local"]}
    assert local[DRAFT]["kind"] == "draft"
    assert local[DRAFT]["size_bytes"] >= (draft_dir / "pytorch_model.bin").stat().st_size
    assert local[TARGET]["need_bytes"] >= (target_dir / "model.safetensors").stat().st_size
    assert next(r for r in listing["catalog"] if r["id"] == "tiny-bin")["cached"]

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub.requests.clear()
    plain = run_json(capsys, "run", "--no-spec", *COMMON)
    spec = run_json(capsys, "run", "--draft", DRAFT, *COMMON)
    assert fake_hub.requests == []
    assert spec["stats"]["speculative"] and spec["stats"]["verify_steps"] > 0
    assert spec["token_ids"] == plain["token_ids"] and len(plain["token_ids"]) == 24


def test_run_fetches_a_bin_only_catalog_head_on_demand(published, capsys):
    spec = run_json(capsys, "run", "--draft", DRAFT, *COMMON)
    plain = run_json(capsys, "run", "--no-spec", *COMMON)
    assert spec["stats"]["speculative"] and spec["token_ids"] == plain["token_ids"]
