"""The target a train-draft run distils from, loaded with the fast kernels of an engine without a draft."""

from __future__ import annotations

import torch

import time
from dataclasses import dataclass

from speculative.train.options import TrainOptions, feature_cache_bytes
from speculative.train.progress import log as _log


@dataclass
class RunStart:
    """What every train-draft run begins with: the device, its options (with the feature cache's
    size, set once the target is on the device), the deadline, and the loaded target."""

    t_start: float
    device: torch.device
    opts: TrainOptions
    deadline: float | None
    loaded: object
    target_name: str
    target_path: object


def start_run(args, adjust=None) -> RunStart:
    """Picks the device, reads the options (`adjust(opts)` may change them before anything
    loads), seeds torch and loads the target."""
    from engine.device import pick_device

    t_start = time.perf_counter()
    dev = pick_device(getattr(args, "device", None))
    opts = TrainOptions.from_args(args, dev)
    if adjust is not None:
        opts = adjust(opts)
    deadline = None if opts.time_budget is None else t_start + opts.time_budget
    torch.manual_seed(opts.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    loaded, target_name, target_path = load_target(opts, dev)
    return RunStart(t_start, dev, feature_cache_bytes(opts, dev), deadline, loaded, target_name, target_path)


def load_target(opts: TrainOptions, dev: torch.device):
    from engine.loader import load_folder, load_gguf
    from engine.options import KernelOptions
    from engine.hub.resolve import resolve

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    src = resolve(opts.model, log=_log)
    _log(f"loading {src.name} on {dev}")
    options = KernelOptions.from_env()  # no draft: the fast kernels (Teacher.check_speculator makes its own)
    if src.is_gguf:
        from engine.weights.prepared import prepared_dir

        loaded = load_gguf(src.path, dev, dtype, opts.max_len, prepared_dir=prepared_dir(src.path, src.is_demo),
                           log=_log, options=options)
        return loaded, src.name, src.path
    return load_folder(src.path, dev, dtype, opts.max_len, options), src.name, src.path
