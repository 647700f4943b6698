"""One model file of a GGUF repository on the Hub: `REPO:Q4_K_M` (a quantization's tag) or
`REPO:file.gguf` (a file's path in the repo). Such repos hold one file per quantization and no
config.json (a GGUF file carries its own config and tokenizer), so only the chosen file is
fetched."""

from __future__ import annotations

import re
from pathlib import Path

from engine.errors import UserError

_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*):(?P<pick>[^:\s]+)$")
# A quantization's tag as GGUF repos name their files: Q4_K_M, Q8_0, IQ4_XS, F16, BF16, ...
_TAG = re.compile(r"(?:^|[-._])((?:I?Q\d[A-Za-z0-9_]*?)|BF16|F16|F32)(?=[-.]|$)", re.IGNORECASE)
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def parse_gguf_spec(spec: str) -> tuple[str, str] | None:
    """(repo id, file or tag) for `REPO:PICK`; None for anything else (a plain repo id, a path)."""
    m = _SPEC.match(spec.strip())
    return (m.group("repo"), m.group("pick")) if m else None


def is_model_gguf(name: str) -> bool:
    """A .gguf file that holds a model (not a vision projector a multimodal repo ships beside it)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and not base.startswith("mmproj")


def snapshot_ggufs(folder: Path) -> list[str]:
    """The .gguf files in a cached snapshot folder, as paths in the repo."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf"))


def quant_tags(names: list[str]) -> list[str]:
    """The quantization tags of a repo's model files, in the order they come."""
    tags: list[str] = []
    for name in names:
        if is_model_gguf(name):
            stem = name.rsplit("/", 1)[-1][:-5]
            found = _TAG.findall(stem)
            tag = found[-1].upper() if found else None
            if tag and tag not in tags:
                tags.append(tag)
    return tags


def pick_gguf(names: list[str], pick: str, repo_id: str) -> str:
    """The one file of `names` (a repo's paths) that `pick` names: a path ending in .gguf, or a
    quantization tag that a single model file's name carries (case does not matter). A one-line
    UserError otherwise, saying what the repo has."""
    models = [n for n in names if is_model_gguf(n)]
    if not models:
        raise UserError(f"{repo_id} has no .gguf model file; `REPO:TAG` is for GGUF repos (drop ':{pick}' for a "
                        "safetensors repo)")
    listing = ", ".join(quant_tags(models)) or ", ".join(models[:6])
    if pick.lower().endswith(".gguf"):
        if pick not in names:
            raise UserError(f"{repo_id} has no file {pick}; its quantizations: {listing}")
        chosen = [pick]
    else:
        if not re.fullmatch(r"[A-Za-z0-9_]+", pick):
            raise UserError(f"{pick!r} is neither a quantization tag (e.g. Q4_K_M) nor a .gguf file name")
        tagged = re.compile(rf"(?:^|[-._]){re.escape(pick)}(?=[-.]|$)", re.IGNORECASE)
        chosen = [n for n in models if tagged.search(n.rsplit("/", 1)[-1])]
        if not chosen:
            raise UserError(f"no .gguf file of {repo_id} is tagged {pick}; its quantizations: {listing}")
    if any(_SPLIT.search(n) for n in chosen):
        raise UserError(f"{repo_id}'s {pick} is split into several files ({chosen[0]}, ...), which localchat cannot "
                        f"load yet: choose a quantization in one file ({listing})")
    if len(chosen) > 1:
        raise UserError(f"{len(chosen)} files of {repo_id} are tagged {pick} ({', '.join(chosen[:4])}): "
                        f"name one, as {repo_id}:FILE.gguf")
    return chosen[0]
