"""Any GGUF is converted once: later loads read its prepared folder until the file changes."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import engine.loader as loader
from engine import Engine
from engine.weights.prepared import COMPLETE, STAMP, is_current, prepared_dir
from engine.types import SamplingParams
from tests.tiny_gguf import make_tiny_gguf

MESSAGES = [{"role": "user", "content": "Hello, how are you?"}]


@pytest.fixture(scope="module")
def tiny_gguf_file(tmp_path_factory):
    base = tmp_path_factory.mktemp("gguf")
    return make_tiny_gguf(base / "tiny.gguf", base / "work")


@pytest.fixture
def gguf_file(tmp_path, tiny_gguf_file, monkeypatch):
    """A private copy of the tiny GGUF, a fresh LOCALCHAT_HOME, and a count of GGUF conversions."""
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    shutil.copy2(tiny_gguf_file, path)
    conversions = []
    real_open = loader.open_gguf

    def counting_open(p):
        conversions.append(Path(p))
        return real_open(p)

    monkeypatch.setattr(loader, "open_gguf", counting_open)
    return path, conversions


def _answer(model: str) -> list[int]:
    return Engine.load(model, device="cpu").generate(MESSAGES, SamplingParams(max_tokens=8)).token_ids


def test_a_second_load_reads_the_prepared_folder(gguf_file, tmp_path):
    path, conversions = gguf_file
    first = _answer(str(path))
    folder = prepared_dir(path)
    assert conversions == [path]
    assert folder.parent == tmp_path / "home" / "cache" / "prepared"
    assert (folder / COMPLETE).is_file() and (folder / "model.safetensors").is_file()
    assert json.loads((folder / STAMP).read_text())["size"] == path.stat().st_size
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]
    assert _answer(str(path)) == first  # same tokens from the prepared copy...
    assert conversions == [path]  # ...without reading the GGUF again


def test_a_changed_file_is_prepared_again(gguf_file):
    path, conversions = gguf_file
    _answer(str(path))
    folder = prepared_dir(path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place: a new mtime
    assert not is_current(folder, path, torch.float32)
    _answer(str(path))
    assert len(conversions) == 2 and is_current(folder, path, torch.float32)
    _answer(str(path))
    assert len(conversions) == 2


def test_files_of_one_name_in_two_folders_do_not_share(gguf_file):
    path, _ = gguf_file
    other = path.parent.parent / "elsewhere" / path.name
    other.parent.mkdir()
    shutil.copy2(path, other)
    assert prepared_dir(path) != prepared_dir(other)
    assert prepared_dir(path).name.startswith("tiny-")


def test_a_folder_without_a_stamp_is_prepared_again(gguf_file):
    """Folders written before the stamp existed (or cut short) are not trusted."""
    path, conversions = gguf_file
    _answer(str(path))
    (prepared_dir(path) / STAMP).unlink()
    _answer(str(path))
    assert len(conversions) == 2 and is_current(prepared_dir(path), path, torch.float32)


def test_no_room_on_disk_loads_without_keeping_a_copy(gguf_file, monkeypatch):
    import engine.weights.prepared as prepared

    path, conversions = gguf_file
    monkeypatch.setattr(prepared.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 0))
    said = []
    engine = Engine.load(str(path), device="cpu", on_progress=lambda msg, frac: said.append(msg))
    assert engine.generate(MESSAGES, SamplingParams(max_tokens=2)).token_ids
    assert not prepared_dir(path).exists()
    assert any("converted again at every start" in m for m in said), said


def test_a_bf16_copy_serves_bf16_loads_and_a_float32_one_serves_all(gguf_file):
    """A GPU (bf16) load keeps half the bytes; a CPU (float32) load needs float32 and prepares again."""
    from safetensors import safe_open

    path, conversions = gguf_file
    folder = prepared_dir(path)
    cpu = torch.device("cpu")
    loader.load_gguf(path, cpu, torch.bfloat16, 64, prepared_dir=folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
    assert is_current(folder, path, torch.bfloat16) and not is_current(folder, path, torch.float32)
    loader.load_gguf(path, cpu, torch.bfloat16, 64, prepared_dir=folder)
    assert len(conversions) == 1
    loader.load_gguf(path, cpu, torch.float32, 64, prepared_dir=folder)
    assert len(conversions) == 2
    assert is_current(folder, path, torch.float32) and is_current(folder, path, torch.bfloat16)


def test_the_demo_named_by_its_path_shares_the_demos_folder(monkeypatch, tmp_path):
    from engine.hub.demo import demo_gguf_path

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    demo = demo_gguf_path()
    assert prepared_dir(demo) == prepared_dir(demo, is_demo=True) == demo.parent / (demo.stem + ".prepared")
