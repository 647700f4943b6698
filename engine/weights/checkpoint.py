"""The weight files of a Hugging Face folder: which ones to read, confined to the folder, and
their tensors, from safetensors or from PyTorch `.bin` files read as plain tensors only."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterator

from engine.errors import ModelLoadError

if TYPE_CHECKING:
    import torch

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
BIN_PATTERN = "pytorch_model*.bin"
# Safetensors first: when a repo ships both, the format that cannot carry code wins.
LAYOUTS = ((SAFETENSORS_INDEX, "*.safetensors"), (BIN_INDEX, BIN_PATTERN))
SHARD_SUFFIXES = (".safetensors", ".bin")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's zip format (the default since torch 1.6)


def weight_files(folder: Path) -> list[Path]:
    """The files to load: an index's shards, else every file of the layout, safetensors first.
    Only the index is read here; every shard it names is checked to stay inside `folder`."""
    folder = Path(folder)
    for index_name, pattern in LAYOUTS:
        index = folder / index_name
        if index.is_file():
            files = index_shards(folder, index)
            for f in files:
                if not f.is_file():
                    raise ModelLoadError(f"{folder}: shard {f.name} named in {index.name} is missing")
            return files
        files = sorted(folder.glob(pattern))
        if files:
            return files
    raise ModelLoadError(f"{folder} has no weights: expected *.safetensors files, or pytorch_model*.bin files "
                         "(with their index when sharded)")


def index_shards(folder: Path, index: Path) -> list[Path]:
    """The shard paths `index` names, refused unless each one is a file name inside `folder`."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelLoadError(f"{index} is not a valid weight index ({type(e).__name__}: {e}); "
                             "re-download the model or remove the broken index") from None
    return [confined_shard(folder, name, index) for name in names]


def confined_shard(folder: Path, name: object, index: Path) -> Path:
    """folder/name, when `name` is a relative .safetensors/.bin path that stays inside the folder
    once symlinks are followed (a Hub cache snapshot may also link into its repo's blob store)."""
    bad = _bad_shard_name(name)
    if bad:
        raise ModelLoadError(f"{index} names the shard {name!r}, {bad}; refusing to read it: "
                             "shards must be files inside the model folder")
    path = folder / name
    try:
        real = path.resolve()
        roots = [folder.resolve()] + _blob_store(folder)
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise ModelLoadError(f"{index} names the shard {name!r}, which cannot be resolved ({e})") from None
    if not any(real.is_relative_to(root) for root in roots):
        raise ModelLoadError(f"{index} names the shard {name!r}, a link to {real} outside {folder}; "
                             "refusing to read it: shards must be files inside the model folder")
    return path


def _bad_shard_name(name: object) -> str | None:
    """Why a shard name is refused, or None."""
    if not isinstance(name, str) or not name:
        return "which is not a file name"
    if "\x00" in name or "\\" in name:
        return "which holds a NUL or a backslash"
    rel = PurePosixPath(name)
    if rel.is_absolute() or re.match(r"^[A-Za-z]:", name):
        return "an absolute path"
    if ".." in rel.parts:
        return "which leaves the model folder"
    if not name.endswith(SHARD_SUFFIXES):
        return "which is not a .safetensors or .bin file"
    return None


def _blob_store(folder: Path) -> list[Path]:
    """huggingface_hub's cache keeps files in <repo>/blobs and links snapshots/<commit>/* there."""
    if folder.parent.name == "snapshots" and (folder.parent.parent / "blobs").is_dir():
        return [(folder.parent.parent / "blobs").resolve()]
    return []


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every file in order; .bin tensors are views of a read-only file mapping."""
    from engine.weights.load import iter_safetensors

    for path in files:
        if path.name.endswith(".bin"):
            yield from load_bin(path).items()
        else:
            yield from iter_safetensors([path])


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, so a config can be checked against the checkpoint before
    anything is allocated: safetensors from their headers, .bin files through a memory map."""
    from engine.weights.load import safetensors_shapes

    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        if path.name.endswith(".bin"):
            shapes.update((name, tuple(t.shape)) for name, t in load_bin(path).items())
        else:
            shapes.update(safetensors_shapes([path]))
    return shapes


def load_bin(path: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model*.bin as {name: tensor}, through torch's weights-only unpickler: a pickle
    that needs any class or function beyond tensors and plain containers is refused, not run."""
    import pickle
    import warnings

    import torch

    try:
        with open(path, "rb") as f:
            is_zip = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror}") from None
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's concern
            warnings.simplefilter("ignore")
            # mmap needs the zip format; a legacy (pre-1.6, non-zip) file is read into memory
            # instead, through the same weights-only unpickler, so it is as safe, only slower.
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL (\S+)", str(e))
        what = f"it calls {found.group(1)}" if found else "its pickle holds more than tensors"
        raise ModelLoadError(f"refused to load {path}: {what}; localchat reads .bin weights as plain tensors "
                             "only: use a safetensors copy of this model") from None
    except Exception as e:  # a crafted or truncated file can fail anywhere inside torch's reader
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ModelLoadError(f"cannot read {path}: {first} (not a PyTorch weights file, or truncated?)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ModelLoadError(f"refused to load {path}: it is not a plain mapping of names to tensors "
                             f"(found {type(state).__name__}); use a safetensors copy of this model")
    return state
