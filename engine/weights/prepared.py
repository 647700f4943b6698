"""The prepared folder of a GGUF file: the HF folder its first load writes, kept while the file is unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from engine.paths import cache_dir

STAMP = "source.json"  # which file (path, size, mtime) the folder was prepared from, and its weight format
COMPLETE = "complete"  # written last: a folder without it was cut short
DISK_MARGIN_BYTES = 2**30  # preparing never leaves the cache's disk with less than this free


def prepared_dir(gguf: Path, is_demo: bool = False) -> Path:
    """Where the prepared copy of `gguf` lives. The demo's sits beside it in the cache (also when
    it is named by its path); any other file's under cache/prepared, named by its stem and a hash
    of its absolute path (two files of one name in different folders never share a folder)."""
    from engine.hub.demo import demo_gguf_path

    gguf = Path(gguf).resolve()
    if is_demo or gguf == demo_gguf_path().resolve():
        return gguf.parent / (gguf.stem + ".prepared")
    digest = hashlib.sha256(str(gguf).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return cache_dir() / "prepared" / f"{gguf.stem}-{digest}"


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _stamp(gguf: Path, dtype) -> dict:
    st = Path(gguf).stat()
    return {"path": str(Path(gguf).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "dtype": _dtype_name(dtype)}


def is_current(folder: Path, gguf: Path, dtype) -> bool:
    """The folder is complete, was prepared from `gguf` as it is now (same path, size and
    modification time: a file rewritten in place or replaced gets prepared again), holds its
    tensors in `dtype` or in float32, which serves any load, and records the file's weight format
    (folders prepared before it did are prepared again)."""
    try:
        if not (folder / COMPLETE).is_file():
            return False
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
        want = _stamp(gguf, dtype)
        return (isinstance(stamp, dict) and stamp.get("dtype") in ("float32", want["dtype"])
                and isinstance(stamp.get("weights"), str)
                and {**stamp, "dtype": want["dtype"], "weights": None} == {**want, "weights": None})
    except (OSError, ValueError):
        return False


def prepared_weights(folder: Path) -> str:
    """The weight format of the GGUF file a current folder was prepared from ("Q4_1")."""
    return json.loads((folder / STAMP).read_text(encoding="utf-8"))["weights"]


def write_prepared(folder: Path, gguf: Path, raw_config: dict, tensors: dict, tok, dtype, weights: str,
                   log=None) -> bool:
    """Writes the prepared folder for `gguf` (config, tensors in `dtype`, tokenizer, a stamp with the
    file's weight format `weights`) and returns whether it did. `tensors` are converted to `dtype`
    in place, one at a time: a bf16 load keeps half the bytes of float32 on disk and reads half at
    every start. The folder is assembled in a sibling folder and renamed into place, so a reader
    never sees half of one; a full disk or a read-only cache only costs the next start the
    conversion again."""
    from safetensors.torch import save_file

    for name in list(tensors):
        tensors[name] = tensors[name].to(dtype)
    need = sum(t.numel() * t.element_size() for t in tensors.values())
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        free = shutil.disk_usage(folder.parent).free
    except OSError:
        free = 0
    if need + DISK_MARGIN_BYTES > free:
        if log:
            log(f"not keeping a prepared copy of {gguf.name} ({need / 1e9:.1f} GB; "
                f"{free / 1e9:.1f} GB free in {folder.parent}): it is converted again at every start")
        return False
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(raw_config, indent=1), encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"))
        tok.hf.save_pretrained(str(tmp))
        (tmp / STAMP).write_text(json.dumps({**_stamp(gguf, dtype), "weights": weights}), encoding="utf-8")
        (tmp / COMPLETE).write_text("written after every other file\n", encoding="utf-8")
        if is_current(folder, gguf, dtype):  # another process finished first and may be reading it
            return True
        shutil.rmtree(folder, ignore_errors=True)  # a stale copy, or one cut short
        os.replace(tmp, folder)
        return True
    except OSError as e:  # another process renamed its copy in first, or the disk refused
        if log and not is_current(folder, gguf, dtype):
            log(f"could not keep a prepared copy of {gguf.name} in {folder.parent}: {e.strerror or e}")
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
