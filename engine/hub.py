"""Hugging Face Hub access (placeholder until the downloads module lands)."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError


def snapshot_path(repo_id: str, log=None) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"]))
    except Exception as e:
        raise UserError(f"cannot get {repo_id} from the Hub: {str(e).splitlines()[0]}") from None
