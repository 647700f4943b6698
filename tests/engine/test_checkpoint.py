"""Weight files: pytorch_model*.bin read as plain tensors only (never their pickle code), shard
paths confined to the model folder, safetensors preferred, fit sizes from the files loaded."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main
from engine.weights.checkpoint import iter_tensors, weight_files
from engine.errors import ModelLoadError
from engine.hub.fit import local_weights_bytes
from engine.loader import load_folder
from engine.hub.local_models import is_complete_folder
from tests.tiny import make_tiny_model

CPU = torch.device("cpu")


class RunsCode:
    """Pickles as a call to os.system: what a hostile checkpoint would hide in its pickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class CustomClass:
    """Pickles as an instance of a class of ours: more than tensors, though harmless."""

    def __init__(self):
        self.value = 1


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ckpt") / "llama", "llama", seed=5)


def bare_copy(src: Path, dst: Path) -> Path:
    """The folder without its weights: config and tokenizer files only."""
    return Path(shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json")))


def write_sharded(folder: Path, tensors: dict[str, torch.Tensor], fmt: str, shards: int = 2, **save_kw) -> list[str]:
    """Writes `tensors` in `shards` files plus the index transformers would write; returns the shard names."""
    names = sorted(tensors)
    ext = "safetensors" if fmt == "safetensors" else "bin"
    stem = "model" if fmt == "safetensors" else "pytorch_model"
    files = [f"{stem}-{i + 1:05d}-of-{shards:05d}.{ext}" for i in range(shards)]
    weight_map = {n: files[i * shards // len(names)] for i, n in enumerate(names)}
    for f in files:
        part = {n: tensors[n].contiguous() for n in names if weight_map[n] == f}
        if fmt == "safetensors":
            save_file(part, str(folder / f))
        else:
            torch.save(part, folder / f, **save_kw)
    (folder / f"{stem}.{ext}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def as_bin(src: Path, dst: Path, layout: str) -> Path:
    folder = bare_copy(src, dst)
    tensors = load_file(src / "model.safetensors")
    if layout == "single":
        torch.save(tensors, folder / "pytorch_model.bin")
    elif layout == "sharded":
        write_sharded(folder, tensors, "bin")
    elif layout == "legacy":  # torch < 1.6 format: not a zip, so read without mmap
        torch.save(tensors, folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    elif layout == "bf16":
        torch.save({k: v.to(torch.bfloat16) for k, v in tensors.items()}, folder / "pytorch_model.bin")
    return folder


def params(folder: Path) -> dict[str, torch.Tensor]:
    return dict(load_folder(folder, CPU, torch.float32, 64).model.named_parameters())


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("layout", ["single", "sharded", "legacy"])
def test_a_bin_target_loads_the_same_weights_as_its_safetensors(tmp_path, original, layout):
    folder = as_bin(original, tmp_path / layout, layout)
    assert all(f.suffix == ".bin" for f in weight_files(folder))
    assert_same_params(params(folder), params(original))


def test_a_bf16_bin_is_cast_like_the_same_weights_in_safetensors(tmp_path, original):
    folder = as_bin(original, tmp_path / "bf16", "bf16")
    st = bare_copy(original, tmp_path / "bf16_st")
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(original / "model.safetensors").items()},
              str(st / "model.safetensors"))
    assert_same_params(params(folder), params(st))


def error_line(code: int, err: str) -> str:
    """The one error line of a CLI run that had to exit 2 (progress lines aside)."""
    lines = [line for line in err.splitlines() if line.startswith("localchat:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_sharded_bin_target_answers_like_the_safetensors_one(tmp_path, original, capsys):
    folder = as_bin(original, tmp_path / "sharded", "sharded")
    args = ["--device", "cpu", "--json", "--no-spec", "--max-tokens", "16", "Hello, how are you today?"]
    from_bin = run_json(capsys, "run", "--model", str(folder), *args)
    from_st = run_json(capsys, "run", "--model", str(original), *args)
    assert from_bin["token_ids"] == from_st["token_ids"] and len(from_st["token_ids"]) == 16


def test_safetensors_are_preferred_and_the_bin_beside_them_is_never_read(tmp_path, original):
    folder = Path(shutil.copytree(original, tmp_path / "both"))
    marker = tmp_path / "ran"
    torch.save({"model.norm.weight": RunsCode(marker)}, folder / "pytorch_model.bin")
    assert weight_files(folder) == [folder / "model.safetensors"]
    assert_same_params(params(folder), params(original))
    assert not marker.exists()


HOSTILE = {  # kind -> writes a hostile .bin at `path` whose code would create `marker`
    "os.system": lambda path, marker: torch.save({"w": torch.ones(2), "x": RunsCode(marker)}, path),
    "legacy os.system": lambda path, marker: path.write_bytes(pickle.dumps({"w": RunsCode(marker)}, protocol=2)),
    "custom class": lambda path, marker: torch.save({"w": torch.ones(2), "x": CustomClass()}, path),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_pickle_that_needs_code_is_refused_without_running_it(tmp_path, original, capsys, kind):
    folder = bare_copy(original, tmp_path / "hostile")
    marker = tmp_path / "ran"
    HOSTILE[kind](folder / "pytorch_model.bin", marker)
    with pytest.raises(ModelLoadError, match="refused to load .*pytorch_model.bin"):
        load_folder(folder, CPU, torch.float32, 64)
    code = main(["run", "--model", str(folder), "--device", "cpu", "--no-spec", "hi"])
    line = error_line(code, capsys.readouterr().err)
    assert str(folder / "pytorch_model.bin") in line and "plain tensors" in line
    assert not marker.exists()


@pytest.mark.parametrize("content,match", [
    ({"model.norm.weight": torch.ones(64), "step": 3}, "not a plain mapping of names to tensors"),
    ({"state_dict": {"model.norm.weight": torch.ones(64)}}, "not a plain mapping of names to tensors"),
    ([torch.ones(2)], "not a plain mapping of names to tensors"),
])
def test_a_bin_that_is_not_a_flat_tensor_mapping_is_refused(tmp_path, original, content, match):
    folder = bare_copy(original, tmp_path / "odd")
    torch.save(content, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=match):
        list(iter_tensors(weight_files(folder)))


def test_a_truncated_bin_is_a_clear_error(tmp_path, original):
    folder = as_bin(original, tmp_path / "cut", "single")
    path = folder / "pytorch_model.bin"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=f"cannot read {path}"):
        load_folder(folder, CPU, torch.float32, 64)


def sharded_copy(original: Path, dst: Path, fmt: str) -> tuple[Path, list[str]]:
    folder = bare_copy(original, dst)
    return folder, write_sharded(folder, load_file(original / "model.safetensors"), fmt)


def point_index_at(folder: Path, fmt: str, shard: str, name: str) -> Path:
    """Rewrites the index so that the tensors of `shard` are looked up at `name` instead."""
    index = folder / ("model.safetensors.index.json" if fmt == "safetensors" else "pytorch_model.bin.index.json")
    data = json.loads(index.read_text())
    data["weight_map"] = {k: (name if v == shard else v) for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    return index


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("escape", ["parent", "absolute", "symlink", "not a shard"])
def test_shard_paths_outside_the_model_folder_are_refused_before_reading(tmp_path, original, monkeypatch, capsys,
                                                                          fmt, escape):
    folder, shards = sharded_copy(original, tmp_path / "model", fmt)
    outside = tmp_path / "other"
    outside.mkdir()
    shutil.copy(folder / shards[0], outside / shards[0])  # a real shard, readable if the loader went there
    name = {"parent": f"../other/{shards[0]}", "absolute": str(outside / shards[0]),
            "symlink": f"linked-{shards[0]}", "not a shard": "config.json"}[escape]
    if escape == "symlink":
        (folder / name).symlink_to(outside / shards[0])
    index = point_index_at(folder, fmt, shards[0], name)
    with pytest.raises(ModelLoadError, match=f"{index} names the shard"):
        weight_files(folder)
    assert not is_complete_folder(folder)
    reads = []
    monkeypatch.setattr("engine.loader.iter_tensors", lambda files: reads.append(files) or iter(()))
    code = main(["run", "--model", str(folder), "--device", "cpu", "--no-spec", "hi"])
    assert repr(name) in error_line(code, capsys.readouterr().err)
    assert reads == []


def test_hub_cache_snapshots_may_link_into_their_blob_store(tmp_path, original):
    """huggingface_hub's layout: snapshots/<commit>/<file> -> ../../blobs/<hash>."""
    repo = tmp_path / "models--tiny--llama"
    staging, shards = sharded_copy(original, tmp_path / "staging", "safetensors")
    snapshot = repo / "snapshots" / ("c" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(p.name for p in staging.iterdir())):
        shutil.copy(staging / f, repo / "blobs" / f"blob{i}")
        (snapshot / f).symlink_to(Path("../../blobs") / f"blob{i}")
    assert weight_files(snapshot) == [snapshot / s for s in shards]
    assert is_complete_folder(snapshot)
    assert_same_params(params(snapshot), params(original))


def test_fit_counts_the_files_the_loader_reads(tmp_path, original):
    folder, shards = sharded_copy(original, tmp_path / "bin", "bin")
    assert local_weights_bytes(folder) == sum((folder / s).stat().st_size for s in shards) > 0
    assert is_complete_folder(folder)
    both = Path(shutil.copytree(original, tmp_path / "both"))
    torch.save(load_file(original / "model.safetensors"), both / "pytorch_model.bin")
    assert local_weights_bytes(both) == (both / "model.safetensors").stat().st_size
    (folder / shards[1]).unlink()
    assert not is_complete_folder(folder)
    with pytest.raises(ModelLoadError, match=f"shard {shards[1]} named in pytorch_model.bin.index.json is missing"):
        weight_files(folder)


def test_bin_names_are_matched_exactly_like_safetensors_names(tmp_path, original):
    folder = bare_copy(original, tmp_path / "renamed")
    tensors = load_file(original / "model.safetensors")
    tensors["model.final_norm.weight"] = tensors.pop("model.norm.weight")
    torch.save(tensors, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="missing tensors: model.norm.weight; unexpected tensors: model.final_norm"):
        load_folder(folder, CPU, torch.float32, 64)
