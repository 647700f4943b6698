"""Turns a --model / --draft argument into a local path: 'demo', a folder, a .gguf file or a Hub repo."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class ModelSource:
    path: Path  # a folder with config.json, or a .gguf file
    name: str  # what the UI shows
    is_demo: bool = False

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix.lower() == ".gguf"


def resolve(spec: str, log=None, what: str = "model") -> ModelSource:
    spec = spec.strip()
    if not spec:
        raise UserError(f"--{what} is empty; give a folder, a .gguf file, a Hub repo id or 'demo'")
    if spec == "demo" and what == "model":
        from engine.hub.demo import NAME, ensure_demo

        return ModelSource(ensure_demo(log), NAME, is_demo=True)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir():
            if not (path / "config.json").exists():
                raise UserError(f"{path} has no config.json; a {what} folder needs config.json and "
                                "*.safetensors or pytorch_model*.bin")
            return ModelSource(path.resolve(), path.name)
        if path.suffix.lower() == ".gguf":
            # absolute, but not resolved: a Hub cache's file is a link to a blob named by its hash,
            # and the loader knows a GGUF by its name
            return ModelSource(path.absolute(), path.name)
        raise UserError(f"{path} is a file but not a .gguf; give its folder, a .gguf file or a Hub repo id")
    from engine.hub.gguf_files import parse_gguf_spec

    gguf = parse_gguf_spec(spec)
    if gguf is not None:
        from engine.hub.download import gguf_file_path

        return ModelSource(gguf_file_path(*gguf, log=log), spec)
    if _REPO_ID.match(spec) and not spec.startswith((".", "~")):
        from engine.hub.download import snapshot_path

        return ModelSource(snapshot_path(spec, log=log), spec)
    raise UserError(f"no such file or folder: {spec} (a {what} is a folder, a .gguf file, a Hub repo id, "
                    "REPO:Q4_K_M for one file of a GGUF repo, or 'demo')")
