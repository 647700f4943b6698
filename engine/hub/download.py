"""Downloads a target (and its draft) from the Hugging Face Hub into the shared HF cache.

Only the files the engine reads are fetched. The order is: plan (model info, sizes, what is
already cached and good) -> free-disk check -> config.json of both -> draft/target check -> the
rest, weights last. Every value the Hub sends is checked before it names a path (`hub_metadata`),
and every file is hashed against the listed digest before it enters the cache (`hub_transfer`), so
an interrupted, cancelled or corrupted download never leaves a file where a good one is expected.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.hub.catalog import MTP_BUILTIN
from engine.hub.progress import ProgressCallback, ProgressMeter
from engine.errors import UserError
from engine.hub.cache import cache_dir, cached_file_state, is_inside, remove_stale_parts, repo_folder, snapshot_file
from engine.hub.errors import hub_errors
from engine.hub.metadata import ListedFile, check_commit, check_repo_path, check_revision, listed_file

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.json", "chat_template.jinja",
)
SAFETENSORS_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
# Pickled weights are fetched only when asked (--allow-bin, or a catalog head marked allow_bin) and
# only from repos without safetensors; engine/weights/checkpoint.py reads them as plain tensors
# (torch.load(weights_only=True)), so a pickle that needs code is refused, never run.
BIN_PATTERNS = ("pytorch_model*.bin", "pytorch_model.bin.index.json")
DISK_SLACK_BYTES = 64 * 2**20  # refs, locks, and a margin so the disk is not filled to the last byte

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_repo_id(repo_id: str) -> str:
    if not REPO_ID_RE.match(repo_id) or ".." in repo_id:
        raise UserError(f"{repo_id!r} is not a Hub repository id: expected OWNER/NAME, e.g. Qwen/Qwen3-8B")
    return repo_id


def is_offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the volume that holds `path` (or its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


def select_files(names: list[str], allow_bin: bool = False, include: tuple[str, ...] = ()) -> list[str]:
    """The repo files the engine needs: configs, tokenizer, safetensors (root folder only).

    `include` adds glob patterns the user asked for (e.g. "*Q4_K_M.gguf").
    """
    root = [n for n in names if "/" not in n]
    wanted = set(CONFIG_FILES) | set(TOKENIZER_FILES)
    patterns = list(SAFETENSORS_PATTERNS)
    if allow_bin and not any(fnmatch.fnmatch(n, "*.safetensors") for n in root):
        patterns += BIN_PATTERNS
    chosen = [n for n in root if n in wanted or any(fnmatch.fnmatch(n, p) for p in patterns)]
    chosen += [n for n in names if n not in chosen and any(fnmatch.fnmatch(n, p) for p in include)]
    return chosen


def is_weight_file(name: str) -> bool:
    return name.endswith((".safetensors", ".bin", ".gguf"))


@dataclass(frozen=True)
class RemoteFile:
    listed: ListedFile
    state: str  # in the cache: "ok", "missing", or "corrupt" (wrong size or bytes; fetched again)

    @property
    def name(self) -> str:
        return self.listed.name

    @property
    def size(self) -> int:
        return self.listed.size

    @property
    def is_cached(self) -> bool:
        return self.state == "ok"


@dataclass(frozen=True)
class RepoPlan:
    repo_id: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]
    is_gated: bool
    gguf: str | None = None  # a GGUF repo's one model file (gguf_files.pick_gguf): the only file fetched

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if is_weight_file(f.name))

    @property
    def missing_bytes(self) -> int:
        return sum(f.size for f in self.files if not f.is_cached)

    @property
    def corrupt(self) -> list[RemoteFile]:
        return [f for f in self.files if f.state == "corrupt"]

    def ordered_missing(self) -> list[RemoteFile]:
        """Configs first (the draft check reads them), weights last."""
        missing = [f for f in self.files if not f.is_cached]
        return sorted(missing, key=lambda f: (f.name != "config.json", is_weight_file(f.name), f.name))


@dataclass(frozen=True)
class DownloadPlan:
    target: RepoPlan
    draft: RepoPlan | None
    draft_spec: str | None  # the draft as given: a repo id, "mtp:builtin", or None
    cache_dir: Path
    free_bytes: int

    @property
    def repos(self) -> tuple[RepoPlan, ...]:
        return (self.target,) if self.draft is None else (self.target, self.draft)

    @property
    def missing_bytes(self) -> int:
        return sum(r.missing_bytes for r in self.repos)

    @property
    def is_disk_enough(self) -> bool:
        return self.missing_bytes == 0 or self.missing_bytes + DISK_SLACK_BYTES <= self.free_bytes

    def check_disk(self) -> None:
        if not self.is_disk_enough:
            from engine.units import format_bytes

            raise UserError(
                f"not enough free disk for {self.target.repo_id}: need {format_bytes(self.missing_bytes)}, "
                f"{format_bytes(self.free_bytes)} free in {self.cache_dir}; free some space or set HF_HOME "
                "to a larger disk"
            )


@dataclass(frozen=True)
class DownloadResult:
    target: Path
    draft: Path | str | None  # a folder, "mtp:builtin", or None


def plan_repo(
    repo_id: str,
    revision: str | None = None,
    allow_bin: bool = False,
    include: tuple[str, ...] = (),
    on_hash: Callable[[str, int], None] | None = None,
    gguf: str | None = None,
) -> RepoPlan:
    """Ask the Hub which files `repo_id` has at `revision` and which of the needed ones are cached and good.

    `on_hash(name, size)` is called before a cached file is hashed (once per file; see hub_cache).
    gguf: a quantization tag or .gguf file name (gguf_files.pick_gguf): that one file of a GGUF repo.
    """
    from huggingface_hub import HfApi

    check_repo_id(repo_id)
    if revision is not None:
        check_revision(revision)
    if is_offline():
        raise UserError(f"cannot download {repo_id}: HF_HUB_OFFLINE is set; unset it to download")
    with hub_errors(repo_id, revision=revision):
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    commit = check_commit(info.sha, repo_id)
    siblings = {check_repo_path(s.rfilename, repo_id): s for s in info.siblings or []}
    picked = None
    if gguf is not None:
        from engine.hub.gguf_files import pick_gguf

        picked = pick_gguf(list(siblings), gguf, repo_id)
        names = [picked]
    else:
        names = select_files(list(siblings), allow_bin=allow_bin, include=include)
    if picked is not None:
        pass  # a GGUF file carries its own config and tokenizer
    elif "config.json" not in names:
        raise UserError(f"{repo_id} has no config.json: it is not a Hugging Face model folder")
    if not any(is_weight_file(n) for n in names):
        has_bin = any(fnmatch.fnmatch(n, BIN_PATTERNS[0]) for n in siblings)
        hint = "; it has only pickled .bin weights: pass --allow-bin to fetch them" if has_bin else ""
        raise UserError(f"{repo_id} has no .safetensors weights{hint}")
    root = cache_dir()
    files = []
    for name in names:
        listed = listed_file(siblings[name], repo_id)
        hook = (lambda f=listed: on_hash(f"{repo_id}/{f.name}", f.size)) if on_hash is not None else None
        files.append(RemoteFile(listed, cached_file_state(root, repo_id, commit, listed, hook)))
    return RepoPlan(repo_id, revision or "main", commit, tuple(files), bool(info.gated), picked)


def plan_download(
    repo_id: str,
    draft: str | None = None,
    revision: str | None = None,
    allow_bin: bool = False,
    include: tuple[str, ...] = (),
    on_hash: Callable[[str, int], None] | None = None,
    gguf: str | None = None,
) -> DownloadPlan:
    """Plan the download of a target and optionally its draft (a repo id or "mtp:builtin");
    gguf: the target is that one file of a GGUF repo (plan_repo)."""
    from engine.hub.catalog import load_catalog

    target = plan_repo(repo_id, revision, allow_bin=allow_bin, include=include, on_hash=on_hash, gguf=gguf)
    draft_plan = None
    if draft is not None and draft != MTP_BUILTIN:
        entry = load_catalog().for_draft(draft)
        draft_bin = allow_bin or (entry is not None and entry.draft is not None and entry.draft.allow_bin)
        draft_plan = plan_repo(draft, allow_bin=draft_bin, on_hash=on_hash)
    root = cache_dir()
    return DownloadPlan(target, draft_plan, draft, root, free_disk_bytes(root))


def _fetch(root: Path, repo: RepoPlan, file: RemoteFile, meter: ProgressMeter) -> Path:
    from engine.hub.transfer import fetch

    meter.start_file(f"{repo.repo_id}/{file.name}")
    with hub_errors(repo.repo_id, file.name, repo.revision):
        return fetch(root, repo.repo_id, repo.commit, file.listed, meter)


def run_download(
    plan: DownloadPlan,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> DownloadResult:
    """Fetch what `plan` lists as missing or corrupt. Raises UserError (or DownloadCancelled, or
    KeyboardInterrupt) with the cache intact: finished files stay, nothing partial does."""
    from engine.hub.pairing import check_draft_pair, read_config

    plan.check_disk()
    root = plan.cache_dir
    meter = ProgressMeter(plan.missing_bytes, on_progress, cancel)
    missing = {r.repo_id: r.ordered_missing() for r in plan.repos}
    for repo in plan.repos:
        remove_stale_parts(root, repo.repo_id)
    for repo in plan.repos:  # config.json first, for the draft check (a GGUF file has none apart)
        config = next((f for f in repo.files if f.name == "config.json"), None)
        if config is None:
            continue
        if not config.is_cached:
            _fetch(root, repo, config, meter)
        elif not snapshot_file(root, repo.repo_id, repo.commit, "config.json").is_file():
            raise UserError(f"{repo.repo_id}/config.json vanished from the cache during the download: try again")
    folders = {r.repo_id: snapshot_file(root, r.repo_id, r.commit, "config.json").parent for r in plan.repos}
    if plan.draft_spec is not None and plan.target.gguf is None:  # a GGUF target's pair is checked at load
        draft_config = read_config(folders[plan.draft.repo_id]) if plan.draft is not None else None
        check_draft_pair(plan.target.repo_id, read_config(folders[plan.target.repo_id]), plan.draft_spec, draft_config)
    for repo in plan.repos:
        for f in missing[repo.repo_id]:
            if f.name != "config.json":
                _fetch(root, repo, f, meter)
    for repo in plan.repos:
        _write_ref(root, repo)
    meter.finish()
    draft_out: Path | str | None = folders[plan.draft.repo_id] if plan.draft is not None else plan.draft_spec
    target = plan.target
    if target.gguf is not None:
        return DownloadResult(snapshot_file(root, target.repo_id, target.commit, target.gguf), draft_out)
    return DownloadResult(folders[target.repo_id], draft_out)


def _write_ref(root: Path, repo: RepoPlan) -> None:
    """Point refs/<revision> at the commit, once its files are all in: resolving "main" then finds them.

    Files are fetched by commit hash (so a push during the download cannot mix two versions),
    which leaves writing the ref to us. Written atomically, like huggingface_hub does.
    """
    if repo.revision == repo.commit:
        return
    ref = repo_folder(root, repo.repo_id) / "refs" / repo.revision
    if not is_inside(root, ref):  # check_revision keeps '..' out; a link planted in refs/ is not followed
        raise UserError(f"--revision {repo.revision!r} leads outside the cache: use a branch, tag or commit name")
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(ref.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(repo.commit)
        os.replace(tmp, ref)
    finally:
        tmp.unlink(missing_ok=True)


def gguf_file_path(repo_id: str, pick: str, log=None) -> Path:
    """The local path of one model file of a GGUF repo (`REPO:Q4_K_M`, `REPO:file.gguf`): the
    cached one when there is one, else a download of that file alone."""
    from engine.hub.gguf_files import pick_gguf, snapshot_ggufs
    from engine.hub.local_models import cached_snapshot_folder

    check_repo_id(repo_id)
    folder = cached_snapshot_folder(repo_id)
    if folder is not None:
        try:
            return folder / pick_gguf(snapshot_ggufs(folder), pick, repo_id)
        except UserError:
            pass  # not among the files fetched so far: the Hub says what the repo has
    if is_offline():
        raise UserError(f"{repo_id}:{pick} is not in the local cache and HF_HUB_OFFLINE is set: unset it and run "
                        f"`localchat download {repo_id}:{pick}`")
    plan = plan_download(repo_id, gguf=pick)
    return run_download(plan, _progress_logger(repo_id, log)).target


def _progress_logger(repo_id: str, log):
    last = [float("-inf")]

    def report(p) -> None:
        now = time.monotonic()
        if log is not None and (p.finished or now - last[0] >= 2.0):  # a line every 2 s is plenty
            last[0] = now
            from engine.units import format_bytes, format_eta, format_speed

            log(f"downloading {repo_id}: {format_bytes(p.done_bytes)} of {format_bytes(p.total_bytes)}, "
                f"{format_speed(p.speed)}, ETA {format_eta(p.eta_s)}", p.fraction * 0.1)

    return report


def snapshot_path(repo_id: str, log=None, revision: str | None = None) -> Path:
    """The local folder of a Hub model for loading: the cache when complete, else a download.

    `log(message, fraction)` gets the download progress. Offline (HF_HUB_OFFLINE) only the
    cache is used, with a clear error when the model is not there.
    """
    from engine.hub.local_models import cached_snapshot

    check_repo_id(repo_id)
    cached = cached_snapshot(repo_id, revision)
    if cached is not None:
        return cached
    if is_offline():
        rev = f" at revision {revision}" if revision else ""
        raise UserError(
            f"{repo_id}{rev} is not in the local cache and HF_HUB_OFFLINE is set: unset it and run "
            f"`localchat download {repo_id}`"
        )
    from engine.hub.catalog import load_catalog

    entry = load_catalog().for_draft(repo_id)  # catalog heads that ship only .bin may be fetched as such
    plan = plan_download(repo_id, revision=revision, allow_bin=bool(entry and entry.draft.allow_bin))
    return run_download(plan, _progress_logger(repo_id, log)).target
