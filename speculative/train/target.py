"""The target a train-draft run distils from, loaded with the fast kernels of an engine without a draft."""

from __future__ import annotations

import torch

from speculative.train.options import TrainOptions
from speculative.train.progress import log as _log


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
