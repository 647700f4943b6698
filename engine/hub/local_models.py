"""Finds downloaded models: complete snapshots in the HF cache, and the list of what is there."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.hub.catalog import DEMO_ID
from engine.weights.checkpoint import weight_files
from engine.errors import ModelLoadError
from engine.hub.cache import cache_dir
from engine.hub.pairing import is_draft_config, read_config

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def is_complete_folder(folder: Path) -> bool:
    """config.json plus every weight file it needs (all shards when there is an index, each
    named inside the folder: an index that points elsewhere makes the folder unusable)."""
    if not (folder / "config.json").is_file():
        return False
    try:
        weight_files(folder)
    except ModelLoadError:
        return False
    return True


def repo_storage(repo_id: str) -> Path:
    return cache_dir() / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot_folder(repo_id: str, revision: str | None = None) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision`, complete or not (a GGUF repo's holds
    only the files fetched from it); None where there is none."""
    storage = repo_storage(repo_id)
    rev = revision or "main"
    commit = rev if COMMIT_RE.match(rev) else None
    ref = storage / "refs" / rev
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    if commit is None or not COMMIT_RE.match(commit):
        return None
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The complete cached snapshot of `repo_id` at `revision` (a branch, tag or commit), if any."""
    snapshot = cached_snapshot_folder(repo_id, revision)
    return snapshot if snapshot is not None and is_complete_folder(snapshot) else None


@dataclass(frozen=True)
class LocalModel:
    name: str  # repo id, or the demo id
    path: Path
    size_bytes: int
    is_draft: bool
    config: dict | None


def _gguf_files(repo_id: str, snapshot: Path) -> list[LocalModel]:
    """The model files fetched from a GGUF repo (`localchat download REPO:Q4_K_M`), each named as
    --model takes it: REPO:TAG where its tag picks it alone, else REPO:FILE."""
    from engine.errors import UserError
    from engine.hub.gguf_files import is_model_gguf, pick_gguf, quant_tags, snapshot_ggufs

    names = snapshot_ggufs(snapshot)
    found = []
    for name in names:
        if not is_model_gguf(name) or not (snapshot / name).is_file():
            continue
        tags = quant_tags([name])
        pick = name
        if tags:
            try:
                pick = tags[0] if pick_gguf(names, tags[0], repo_id) == name else name
            except UserError:
                pass
        found.append(LocalModel(f"{repo_id}:{pick}", snapshot / name, (snapshot / name).stat().st_size, False, None))
    return found


def list_cached_models() -> list[LocalModel]:
    """Complete models and drafts in the HF cache (latest snapshot of each repo), the model files
    fetched from GGUF repos, and the demo."""
    from huggingface_hub import scan_cache_dir

    models: list[LocalModel] = []
    root = cache_dir()
    if root.is_dir():
        try:
            info = scan_cache_dir(root)
        except Exception:  # a cache that huggingface_hub cannot read is shown as empty
            info = None
        for repo in sorted(info.repos if info else (), key=lambda r: r.repo_id.lower()):
            if repo.repo_type != "model" or not repo.revisions:
                continue
            latest = max(repo.revisions, key=lambda r: r.last_modified)
            if not is_complete_folder(Path(latest.snapshot_path)):
                models += _gguf_files(repo.repo_id, Path(latest.snapshot_path))
                continue
            config = read_config(Path(latest.snapshot_path))
            models.append(
                LocalModel(repo.repo_id, Path(latest.snapshot_path), latest.size_on_disk, bool(config and is_draft_config(config)), config)
            )
    from engine.hub.demo import demo_gguf_path

    demo = demo_gguf_path()
    if demo.is_file() and demo.with_suffix(".verified").is_file():
        models.insert(0, LocalModel(DEMO_ID, demo, demo.stat().st_size, False, None))
    return models
