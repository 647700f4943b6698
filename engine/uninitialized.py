"""build_uninitialized: a module built on a device with its parameters allocated but not initialized."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def build_uninitialized(make: Callable[[], nn.Module], device: torch.device, dtype: torch.dtype) -> nn.Module:
    """make() on `device` with its floating parameters in `dtype` and left uninitialized: the
    checkpoint fills them next. (Building on the meta device and then loading costs about a second
    of lazy torch imports at every start, and building in fp32 and casting doubles peak memory.)
    On the meta device it allocates nothing and runs no kernel: the first meta kernel a process
    runs, an initializer's, imports seconds of torch's Python. Float buffers a constructor
    computes come out in `dtype` too: recompute any that need fp32."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters, torch.get_default_dtype()
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = _no_init
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return make()
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved[:2]
        torch.set_default_dtype(saved[2])


def _no_init(module: nn.Module) -> None:
    pass
