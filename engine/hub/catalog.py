"""The catalog of known target + draft pairs (assets/catalog.json) as frozen dataclasses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CATALOG_PATH = Path(__file__).resolve().parents[2] / "assets" / "catalog.json"

DEMO_ID = "demo"
MTP_BUILTIN = "mtp:builtin"  # draft spec meaning "the target's own MTP layers"


@dataclass(frozen=True)
class ModelShape:
    """What the KV-cache estimate needs: K and V per layer are (num_kv_heads, head_dim) per token."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_kv_heads, self.head_dim) < 1:
            raise ValueError(f"model shape must be positive, got {self}")

    def kv_bytes(self, context: int, dtype_bytes: int = 2) -> int:
        # K and V, every layer, every position: 2 * L * H_kv * D * T * bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * context * dtype_bytes


@dataclass(frozen=True)
class CatalogModel:
    repo: str  # Hub repo id, "demo", or "mtp:builtin"
    size_bytes: int  # approximate weights size; plans use the Hub's exact figure
    licence: str
    is_gated: bool
    shape: ModelShape
    kind: str = "target"  # "target" | "eagle3" | "mtp"
    hidden_size: int | None = None
    vocab_size: int | None = None
    max_context: int | None = None
    allow_bin: bool = False  # the repo ships only pytorch_model*.bin, read as plain tensors (engine/weights/checkpoint.py)
    is_shipped: bool = False  # weights ship inside this package (the demo head)
    gpu_weights_bytes: int | None = None  # when it differs from the download (GGUF is dequantized at load)
    weights: str | None = None  # a quantized variant's format (Q4_K_M, Q8_0, AWQ); None: the checkpoint's own

    @classmethod
    def from_json(cls, data: dict, kind: str) -> CatalogModel:
        return cls(
            repo=data["repo"],
            size_bytes=int(data.get("size_bytes") or 0),
            licence=data.get("licence", "see model card"),
            is_gated=bool(data.get("gated", False)),
            shape=ModelShape(data["num_layers"], data["num_kv_heads"], data["head_dim"]),
            kind=data.get("kind", kind),
            hidden_size=data.get("hidden_size"),
            vocab_size=data.get("vocab_size"),
            max_context=data.get("max_context"),
            allow_bin=bool(data.get("allow_bin", False)),
            is_shipped=bool(data.get("shipped", False)),
            gpu_weights_bytes=data.get("gpu_weights_bytes"),
            weights=data.get("weights"),
        )

    @property
    def weights_bytes(self) -> int:
        """Bytes the weights take in GPU memory."""
        return self.gpu_weights_bytes or self.size_bytes

    @property
    def needs_download(self) -> bool:
        return not (self.is_shipped or self.repo == MTP_BUILTIN)


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    label: str
    target: CatalogModel
    draft: CatalogModel | None
    variant_of: str | None = None  # a quantized variant: the id of the entry whose model it quantizes

    @classmethod
    def from_json(cls, data: dict) -> CatalogEntry:
        draft = data.get("draft")
        return cls(
            id=data["id"],
            label=data["label"],
            target=CatalogModel.from_json(data["target"], "target"),
            draft=CatalogModel.from_json(draft, "eagle3") if draft else None,
            variant_of=data.get("variant_of"),
        )

    @property
    def download_bytes(self) -> int:
        draft = self.draft.size_bytes if self.draft is not None and self.draft.needs_download else 0
        return self.target.size_bytes + draft


@dataclass(frozen=True)
class Catalog:
    entries: tuple[CatalogEntry, ...]

    def by_id(self, entry_id: str) -> CatalogEntry | None:
        return next((e for e in self.entries if e.id == entry_id), None)

    def for_target(self, repo: str) -> CatalogEntry | None:
        return next((e for e in self.entries if e.target.repo.lower() == repo.lower()), None)

    def pairs(self, target: str, draft: str) -> bool:
        """Whether some entry pairs this target with this draft (a draft serves its model's quantized
        variants too)."""
        return any(e.draft is not None and e.target.repo.lower() == target.lower()
                   and e.draft.repo.lower() == draft.lower() for e in self.entries)

    def for_draft(self, repo: str) -> CatalogEntry | None:
        """The entry whose draft is `repo` (shipped and built-in drafts are not Hub repos)."""
        return next(
            (e for e in self.entries if e.draft is not None and e.draft.needs_download and e.draft.repo.lower() == repo.lower()),
            None,
        )


@lru_cache(maxsize=4)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return Catalog(tuple(CatalogEntry.from_json(e) for e in data["entries"]))
