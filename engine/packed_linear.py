"""PackedLinear: a decoder layer's projection whose weight stays quantized on the GPU (a
GroupedWeight), decoded inside the GEMV of each decode or verify step (kernels/packed_gemv.py).

Steps of up to 16 rows run packed_gemv, batch-invariant like the bf16 tiles, so greedy
speculation over a quantized target keeps the bits of its plain decoding. Longer steps (prefill)
dequantize the weight for that one call and run a plain matmul. The layers that hold one run
the unfused norm and activation launches (Ops.layer_kernels), since the fused kernels read a bf16
weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.weights.grouped import GroupedWeight, dequantize_grouped

MAX_ROWS = 16


class PackedLinear(nn.Module):
    def __init__(self, weight: GroupedWeight, bias: nn.Parameter | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kind, self.group, self.format = weight.kind, weight.group, weight.format
        self.register_buffer("q", weight.q)
        self.register_buffer("scale", weight.scale)
        self.register_buffer("offset", weight.offset)
        self.bias = bias

    @property
    def grouped(self) -> GroupedWeight:
        return GroupedWeight(self.kind, (self.out_features, self.in_features), self.group, self.q, self.scale,
                             self.offset, self.format)

    def shared(self) -> "PackedLinear":
        """Another module over the same tensors (a model's twin under other kernel options)."""
        return PackedLinear(self.grouped, self.bias)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_grouped(self.grouped).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if rows.is_cuda and 1 <= rows.shape[0] <= MAX_ROWS and rows.dtype in (torch.bfloat16, torch.float16):
            from engine.kernels.packed_gemv import packed_gemv

            out = packed_gemv(rows if rows.stride(1) == 1 else rows.contiguous(), self.grouped, self.bias)
        else:
            out = F.linear(rows, self.dequantized(rows.dtype), self.bias)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}"


def share_packed(source: nn.Module, twin: nn.Module) -> None:
    """Puts into `twin` (the same architecture, built with plain nn.Linear) a PackedLinear over the
    same tensors wherever `source` holds one, so that its state dict loads into it."""
    for name, module in source.named_modules():
        if isinstance(module, PackedLinear):
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, attr, module.shared())


def is_packed_layer(*linears: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in linears)
