"""Quantized safetensors checkpoints (AWQ, GPTQ, FP8): the tensors of each linear layer gathered
into one PackedWeight named `<layer>.weight`, and the step that dequantizes packed weights at load."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator

import torch

from engine.errors import ModelLoadError
from engine.quant_config import QuantConfig
from engine.weights.packed import PackedWeight, awq_weight, dequantize, fp8_weight, gptq_weight

# The tensors of one quantized linear, by method: (required, optional). A layer the quantizer left
# alone (modules_to_not_convert, ignored_layers: usually lm_head) has a plain `weight` instead.
_PARTS = {
    "awq": (("qweight", "qzeros", "scales"), ()),
    "gptq": (("qweight", "qzeros", "scales"), ("g_idx",)),
    "fp8": (("weight", "weight_scale"), ()),
}
# FP8 checkpoints with static activation scales carry them; weight-only decoding has no use for them.
_UNUSED = {"fp8": ("input_scale",)}

Tensors = Iterable[tuple[str, "torch.Tensor | PackedWeight"]]


def packed_linears(tensors: Iterable[tuple[str, torch.Tensor]], quant: QuantConfig, source: str
                   ) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
    """The checkpoint's tensors with each quantized linear's parts replaced by one PackedWeight
    named `<layer>.weight`; every other tensor passes through unchanged."""
    required, optional = _PARTS[quant.method]
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, leaf = name.rpartition(".")
        if leaf in _UNUSED.get(quant.method, ()):
            continue
        # An FP8 layer's `weight` is its float8 tensor; a plain weight (norms, embeddings) passes.
        is_part = (leaf in required + optional and not (leaf == "weight" and tensor.dtype != torch.float8_e4m3fn))
        if not is_part:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[leaf] = tensor
        if len(parts) == len(required) + len(optional):
            yield f"{prefix}.weight", _pack(quant, pending.pop(prefix), f"{source}: {prefix}")
    for prefix, parts in pending.items():  # layers without their optional parts, or incomplete ones
        missing = [p for p in required if p not in parts]
        if missing:
            raise ModelLoadError(f"{source}: {prefix} lacks {', '.join(prefix + '.' + m for m in missing)}; "
                                 f"the checkpoint is not a complete {quant.method.upper()} checkpoint")
        yield f"{prefix}.weight", _pack(quant, parts, f"{source}: {prefix}")


def _pack(quant: QuantConfig, parts: dict[str, torch.Tensor], where: str) -> PackedWeight:
    if quant.method == "awq":
        return awq_weight(parts["qweight"], parts["qzeros"], parts["scales"], quant.group_size, where)
    if quant.method == "gptq":
        return gptq_weight(parts["qweight"], parts["qzeros"], parts["scales"], parts.get("g_idx"),
                           quant.group_size, quant.zero_offset, where)
    return fp8_weight(parts["weight"], parts["weight_scale"], where)


# The weights a GPU keeps quantized: the projections of the decoder layers, an untied lm_head, and
# the embeddings (looked up by row: PackedEmbedding; a tied lm_head reads the same blocks). Norms
# are read as floats.
_LAYER_LINEAR = re.compile(r"(^|\.)layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$"
                           r"|^lm_head\.weight$|^model\.embed_tokens\.weight$")


def keeps_packed(name: str) -> bool:
    """Whether a packed tensor of this checkpoint name stays packed where the device runs packed
    weights (a decoder layer's projection, lm_head, or the embeddings)."""
    return bool(_LAYER_LINEAR.search(name))


def dequantized(tensors: Tensors, keep: Callable[[str, PackedWeight], bool] | None = None
                ) -> Iterator[tuple[str, "torch.Tensor | PackedWeight"]]:
    """Every PackedWeight replaced by the float32 weight it stands for, one at a time (so only one
    layer is ever held twice), except those `keep` keeps (a GPU that decodes them in place)."""
    for name, tensor in tensors:
        if isinstance(tensor, PackedWeight) and not (keep is not None and keep(name, tensor)):
            tensor = dequantize(tensor)
        yield name, tensor
