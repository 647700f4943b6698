"""Quantized safetensors checkpoints (AWQ, GPTQ, FP8, compressed-tensors): the tensors of each
linear layer gathered into one PackedWeight named `<layer>.weight`, and the step that dequantizes
packed weights at load."""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator

import torch

from engine.errors import ModelLoadError
from engine.quant_config import QuantConfig
from engine.weights.packed import PackedWeight, awq_weight, dequantize, fp8_weight, gptq_weight, int_weight

# The tensors one quantized linear may have, by method (_PARTS), and those that mark a layer as
# quantized (_MARKERS): a layer the quantizer left alone (modules_to_not_convert, ignored_layers,
# ignore: usually lm_head) has a plain `weight` and no marker. _UNUSED: activation and KV-cache
# scales a checkpoint may carry, which weight-only decoding has no use for.
_PARTS = {
    "awq": ("qweight", "qzeros", "scales"),
    "gptq": ("qweight", "qzeros", "scales", "g_idx"),
    "fp8": ("weight", "weight_scale", "weight_scale_inv"),
    "compressed-tensors": ("weight_scale", "weight_packed", "weight", "weight_shape", "weight_zero_point",
                           "weight_g_idx"),
}
_MARKERS = {"awq": ("qweight",), "gptq": ("qweight",), "fp8": ("weight_scale", "weight_scale_inv"),
            "compressed-tensors": ("weight_scale",)}
_UNUSED = ("input_scale", "input_zero_point", "activation_scale", "output_scale", "output_zero_point",
           "k_scale", "v_scale", "input_global_scale")

Tensors = Iterable[tuple[str, "torch.Tensor | PackedWeight"]]


def packed_linears(tensors: Iterable[tuple[str, torch.Tensor]], quant: QuantConfig, source: str,
                   names: Iterable[str]) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
    """The checkpoint's tensors with each quantized linear's parts replaced by one PackedWeight
    named `<layer>.weight`, as soon as its last part has passed; every other tensor passes through
    unchanged, but for the activation and KV-cache scales, which are dropped. `names`: every tensor
    name of the checkpoint (its headers), which say which parts each layer has."""
    parts_of = _PARTS[quant.method]
    leaves: dict[str, set[str]] = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        leaves.setdefault(prefix, set()).add(leaf)
    expected = {prefix: have & set(parts_of) for prefix, have in leaves.items()
                if have & set(_MARKERS[quant.method])}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        prefix, _, leaf = name.rpartition(".")
        if leaf in _UNUSED:
            continue
        if prefix not in expected or leaf not in expected[prefix]:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[leaf] = tensor
        if len(parts) == len(expected[prefix]):
            yield f"{prefix}.weight", _pack(quant, pending.pop(prefix), f"{source}: {prefix}")
    for prefix, parts in pending.items():  # the headers named a part the files did not hold
        missing = sorted(expected[prefix] - set(parts))
        raise ModelLoadError(f"{source}: {prefix} lacks {', '.join(prefix + '.' + m for m in missing)}; "
                             f"the checkpoint's files do not hold every tensor their headers name")


def _need(parts: dict[str, torch.Tensor], where: str, method: str, *leaves: str) -> list[torch.Tensor]:
    missing = [leaf for leaf in leaves if leaf not in parts]
    if missing:
        raise ModelLoadError(f"{where} lacks {', '.join(where.rpartition(': ')[2] + '.' + m for m in missing)}; "
                             f"the checkpoint is not a complete {method} checkpoint")
    return [parts[leaf] for leaf in leaves]


def _pack(quant: QuantConfig, parts: dict[str, torch.Tensor], where: str) -> PackedWeight:
    if quant.method == "awq":
        qweight, qzeros, scales = _need(parts, where, "AWQ", "qweight", "qzeros", "scales")
        return awq_weight(qweight, qzeros, scales, quant.group_size, where)
    if quant.method == "gptq":
        qweight, qzeros, scales = _need(parts, where, "GPTQ", "qweight", "qzeros", "scales")
        return gptq_weight(qweight, qzeros, scales, parts.get("g_idx"), quant.group_size, quant.zero_offset, where)
    if quant.method == "fp8":
        scale_name = "weight_scale_inv" if "weight_scale_inv" in parts else "weight_scale"
        weight, scale = _need(parts, where, "FP8", "weight", scale_name)
        return fp8_weight(weight, scale, where, quant.block, scale_name)
    # compressed-tensors: FP8 or int8 `weight`, or int32 `weight_packed`
    (scale,) = _need(parts, where, "compressed-tensors", "weight_scale")
    if "weight_packed" in parts:
        data, shape = _need(parts, where, "compressed-tensors", "weight_packed", "weight_shape")
    else:
        (data,), shape = _need(parts, where, "compressed-tensors", "weight"), None
    if data.dtype == torch.float8_e4m3fn:
        return fp8_weight(data, scale, where, quant.block)
    return int_weight(data, scale, parts.get("weight_zero_point"), shape, parts.get("weight_g_idx"), where)


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
