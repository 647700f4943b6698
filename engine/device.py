"""The device a model runs on: --device, or the GPU when PyTorch sees one."""

from __future__ import annotations

import torch

from engine.errors import UserError


def pick_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA GPU is visible to PyTorch (try --device cpu)")
    return torch.device(device)
