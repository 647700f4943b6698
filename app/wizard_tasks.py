"""The model wizard's blocking work (Hub calls, GPU probe, file checks), kept free of widgets.

Each function runs on a worker thread and returns plain data for the screen to show.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.hub.catalog import DEMO_ID, MTP_BUILTIN, Catalog, load_catalog
from engine.errors import UserError
from engine.hub.fit import FitEstimate, GpuMemory, detect_gpu, estimate_fit, gguf_gpu_bytes, packed_catalog_bytes
from engine.hub.gguf_files import parse_gguf_spec
from engine.hub.download import DownloadPlan, cache_dir, free_disk_bytes, is_offline, plan_download
from engine.hub.local_models import LocalModel, cached_snapshot, list_cached_models
from engine.units import format_bytes

from app.widgets.hub_search import SearchHit

CONTEXT = 8192  # the fit column assumes this context; the chat screen may choose another


@dataclass(frozen=True)
class Environment:
    gpu: GpuMemory | None
    fits: dict[str, FitEstimate]  # catalog id -> estimate
    cached: set[str]  # catalog ids whose target is downloaded
    free_disk: int
    is_offline: bool
    local: tuple[LocalModel, ...] = ()  # downloaded models and drafts

    def describe(self) -> str:
        gpu = f"GPU {self.gpu.name}: {format_bytes(self.gpu.free_bytes)} free" if self.gpu else "no GPU (CPU only)"
        disk = f"{format_bytes(self.free_disk)} free disk"
        mode = " · offline (HF_HUB_OFFLINE): downloaded models only" if self.is_offline else ""
        return f"{gpu} · {disk}{mode}"


def probe_environment(catalog: Catalog | None = None) -> Environment:
    """GPU memory (imports torch), fits of every catalog pair, and what is already downloaded."""
    catalog = catalog or load_catalog()
    gpu = detect_gpu()
    local_models = tuple(list_cached_models())
    local = {m.name.lower() for m in local_models}
    fits, cached = {}, set()
    for e in catalog.entries:
        d = e.draft
        context = min(CONTEXT, e.target.max_context or CONTEXT)
        t = e.target
        fits[e.id] = estimate_fit(t.weights_bytes, t.shape, context,
                                  draft_bytes=d.weights_bytes if d else 0, draft_shape=d.shape if d else None, gpu=gpu,
                                  packed_weights_bytes=packed_catalog_bytes(t.weights_bytes, t.weights, t.hidden_size,
                                                                            t.vocab_size))
        if e.target.repo.lower() in local:
            cached.add(e.id)
    return Environment(gpu, fits, cached, free_disk_bytes(cache_dir()), is_offline(), local_models)


def search_hub(text: str, limit: int = 40) -> list[SearchHit]:
    from huggingface_hub import HfApi

    from engine.hub.errors import hub_errors

    with hub_errors(text):
        models = HfApi().list_models(search=text, limit=limit, sort="downloads")
        return [SearchHit(m.id, m.downloads or 0, bool(m.gated)) for m in models]


@dataclass(frozen=True)
class Choice:
    """What the user picked and what it takes: a plan when something must be downloaded."""

    target: str
    draft: str | None
    plan: DownloadPlan | None
    summary: str

    @property
    def needs_download(self) -> bool:
        return self.plan is not None and self.plan.missing_bytes > 0 or self.is_demo_missing

    @property
    def is_demo_missing(self) -> bool:
        from engine.hub.demo import demo_gguf_path

        return self.target == DEMO_ID and not demo_gguf_path().with_suffix(".verified").is_file()


def _fit_text(target: str, weights_bytes: int, draft_bytes: int, gpu: GpuMemory | None) -> str:
    entry = load_catalog().for_target(target) or load_catalog().by_id(target)
    if entry is None:
        return f"weights take {format_bytes(weights_bytes + draft_bytes)} of GPU memory, plus the KV cache"
    d = entry.draft
    t = entry.target
    fit = estimate_fit(weights_bytes, t.shape, min(CONTEXT, t.max_context or CONTEXT),
                       draft_bytes=draft_bytes, draft_shape=d.shape if d else None, gpu=gpu,
                       packed_weights_bytes=packed_catalog_bytes(weights_bytes, t.weights, t.hidden_size, t.vocab_size))
    return f"{fit.as_text}: needs {format_bytes(fit.need_bytes)} at {CONTEXT} tokens"


def is_missing_path(spec: str) -> bool:
    """`spec` names a file or folder that is not there: it is no Hub repo id (OWNER/NAME), as the command line
    decides (engine.hub.resolve), and nothing is at that path."""
    from pathlib import Path

    if spec in (DEMO_ID, MTP_BUILTIN, "none") or Path(spec).expanduser().exists() or parse_gguf_spec(spec):
        return False  # REPO:Q4_K_M or REPO:FILE.gguf: one file of a GGUF repo on the Hub
    return spec.startswith(("/", "~", ".")) or spec.count("/") != 1 or spec.lower().endswith(".gguf")


def _is_cached(spec: str) -> bool:
    gguf = parse_gguf_spec(spec)
    if gguf is None:
        return cached_snapshot(spec) is not None
    from engine.hub.download import gguf_file_path

    try:
        return gguf_file_path(*gguf).is_file()  # offline: the cached file, or a UserError
    except UserError:
        return False


def plan_choice(target: str, draft: str | None, gpu: GpuMemory | None, is_local: bool = False) -> Choice:
    """Local paths and cached repos need nothing; otherwise ask the Hub what to fetch. is_local: `target` was
    typed as a path, so it is never taken for a Hub repo id."""
    from pathlib import Path

    if is_missing_path(target) or is_local and target != DEMO_ID and not Path(target).expanduser().exists():
        raise UserError(f"no such file or folder: {target} (give a model folder or a .gguf file)")
    if draft and is_missing_path(draft):
        raise UserError(f"no such file or folder: {draft} (a draft is a folder, a Hub repo id or mtp:builtin)")
    if target == DEMO_ID:
        entry = load_catalog().by_id(DEMO_ID)
        return Choice(target, None, None, f"demo model with its shipped draft head · {format_bytes(entry.target.size_bytes)} from PyPI")
    if Path(target).expanduser().exists():
        from engine.hub.resolve import resolve

        source = resolve(target)  # a path: checked here, nothing fetched
        kind = "GGUF file" if source.is_gguf else "model folder"
        return Choice(target, draft, None, f"{kind} {source.name} on this machine · nothing to download")
    if is_offline():
        missing = [r for r in (target, draft) if r and r != MTP_BUILTIN and not _is_cached(r)]
        if missing:
            raise UserError(f"{', '.join(missing)} not in the cache and HF_HUB_OFFLINE is set: choose a downloaded model")
        return Choice(target, draft, None, "downloaded · offline mode uses the cache")
    gguf = parse_gguf_spec(target)
    plan = plan_download(gguf[0], draft, gguf=gguf[1]) if gguf else plan_download(target, draft)
    names = " + ".join(f"{r.repo_id}/{r.gguf}" if r.gguf else r.repo_id for r in plan.repos)
    names += " + built-in MTP" if draft == MTP_BUILTIN else ""
    weights = plan.target.weight_bytes
    if gguf:  # dequantized to bf16 at load: the catalog's figure, else one from the file's size
        entry = load_catalog().for_target(target)
        weights = (entry.target.weights_bytes if entry else None) or gguf_gpu_bytes(weights, gguf[1]) or weights
    fit = _fit_text(target, weights, plan.draft.weight_bytes if plan.draft else 0, gpu)
    if plan.missing_bytes == 0:
        return Choice(target, draft, plan, f"{names} · already downloaded · {fit}")
    disk = f"{format_bytes(plan.free_bytes)} free on disk" + ("" if plan.is_disk_enough else " [b red](not enough)[/]")
    return Choice(target, draft, plan, f"{names} · {format_bytes(plan.missing_bytes)} to download · {disk} · {fit}")
