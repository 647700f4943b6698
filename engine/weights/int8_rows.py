"""A weight stored as int8 rows with one float scale a row: W[r] ~ q[r] * scale[r].

A draft head with a large draft vocabulary keeps its lm_head this way on disk (`train-draft
--int8-lm-head`): half the bytes of bf16, so that a head whose vocabulary covers more of what
the target writes still fits where its size is bounded (the project's own heads in assets/). The
loader widens such a weight back to floating point, so it runs as any other head; a tensor
`NAME` of dtype int8 is read with `NAME_scale`, of shape (rows,) or (rows, 1)."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from engine.errors import ModelLoadError

SCALE = "_scale"


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, scale float32): each row's largest magnitude maps to 127, values rounded to
    nearest; a row of zeros gets scale 0 and zeros."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127.0
    q = torch.round(w / scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None]).clamp_(-127, 127)
    return q.to(torch.int8).contiguous(), scale.contiguous()


def widen_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(N, K) float32 from q (N, K) int8 and scale (N,): the weight q stands for."""
    return q.float() * scale.float()[:, None]


def widen_int8_rows(tensors: Iterable[tuple[str, torch.Tensor]], source: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors as they come, except that an int8 NAME and its NAME_scale become one float32
    NAME (in either order in the file). An int8 weight without its scale is refused in one line; a
    NAME_scale with no int8 NAME passes through as it is (another format's, for the loader to judge)."""
    weights: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for name, t in tensors:
        if t.dtype == torch.int8 and t.dim() == 2:
            base = name
            weights[name] = t
        elif name.endswith(SCALE) and t.is_floating_point() and (t.dim() == 1 or (t.dim() == 2 and t.shape[1] == 1)):
            base = name[:-len(SCALE)]
            scales[base] = t  # (rows,) or (rows, 1), as channel-wise int8 checkpoints keep it
        else:
            yield name, t
            continue
        if base in weights and base in scales:
            q, scale = weights.pop(base), scales.pop(base).reshape(-1)
            if scale.shape[0] != q.shape[0]:
                raise ModelLoadError(f"{source}: {base}{SCALE} holds {scale.shape[0]} scales for {q.shape[0]} "
                                     "int8 rows")
            yield base, widen_rows(q, scale)
    for base in weights:
        raise ModelLoadError(f"{source}: {base} is int8 without its {base}{SCALE}")
    for base, scale in scales.items():
        yield base + SCALE, scale
