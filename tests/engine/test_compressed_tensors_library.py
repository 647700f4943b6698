"""Checkpoints written by compressed-tensors itself (the library llm-compressor saves with), one per
preset its users pick, load and decode to the library's own dequantized weights.

The other tests read checkpoints this repository's packers write (tests/tiny_quant.py); this one
checks those packers' reading of the format against the library. It needs compressed-tensors,
which the test extras do not install (it pulls in its own dependencies), so it is skipped without
it: `pip install compressed-tensors` and run this file to take it.
"""

from __future__ import annotations

import shutil

import pytest
import torch

ct = pytest.importorskip("compressed_tensors")

PRESETS = [("W4A16", "pack-quantized", "CT-int4-g128"), ("W4A16_ASYM", "pack-quantized", "CT-int4-g128"),
           ("W8A16", "pack-quantized", "CT-int8-g128"), ("W8A8", "int-quantized", "CT-int8-per-channel"),
           ("FP8_DYNAMIC", "float-quantized", "CT-fp8"), ("FP8", "float-quantized", "CT-fp8"),
           ("FP8_BLOCK", "float-quantized", "CT-fp8")]


def _strategy(args) -> str:
    return str(getattr(args.strategy, "value", args.strategy))


def _min_max(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Each scale's range of weights, as the library's min-max observer takes it."""
    strategy = _strategy(args)
    if strategy == "group":
        groups = w.reshape(w.shape[0], -1, args.group_size)
        return groups.amin(-1), groups.amax(-1)
    if strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    if strategy == "block":
        rows, cols = args.block_structure
        n, k = w.shape
        padded = torch.zeros(-(-n // rows) * rows, -(-k // cols) * cols)
        padded[:n, :k] = w
        blocks = padded.reshape(padded.shape[0] // rows, rows, padded.shape[1] // cols, cols)
        return blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    return w.amin().reshape(1), w.amax().reshape(1)


def _compressed_checkpoint(src, dst, preset: str, fmt: str):
    """The float model at `src` quantized by the library with `preset` (scales from each group's
    min and max) and saved compressed in `fmt`; returns each quantized layer's QuantizationArgs."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig, QuantizationStatus, apply_quantization_config, preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                                ignore=["lm_head"], format=fmt)
    apply_quantization_config(model, config)
    args = {}
    for name, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        scale, zero = calculate_qparams(*_min_max(m.weight.data.float(), scheme.weights), scheme.weights)
        m.weight_scale.data = scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape)
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data = zero.to(m.weight_zero_point.dtype).reshape(m.weight_zero_point.shape)
        m.quantization_status = QuantizationStatus.FROZEN
        args[name] = scheme.weights
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    model.save_pretrained(dst)
    compressor.update_config(dst)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "generation_config")):
            shutil.copy(f, dst / f.name)
    return args


def _library_weight(tensors: dict, prefix: str, args) -> torch.Tensor:
    """A layer's weights as the library dequantizes its saved tensors."""
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    try:
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    except ImportError:  # releases before 0.13
        from compressed_tensors.compressors.quantized_compressors.pack_quantized import unpack_from_int32

    scale, zero = tensors[f"{prefix}.weight_scale"], tensors.get(f"{prefix}.weight_zero_point")
    if f"{prefix}.weight_packed" in tensors:
        shape = torch.Size(tensors[f"{prefix}.weight_shape"].tolist())
        q = unpack_from_int32(tensors[f"{prefix}.weight_packed"], args.num_bits, shape)
        if zero is not None and zero.dtype == torch.int32:
            zero = unpack_from_int32(zero, args.num_bits, torch.Size((shape[0], scale.shape[-1])), packed_dim=0)
    else:
        q = tensors[f"{prefix}.weight"]
    return dequantize(q, scale, zero, args, dtype=torch.float32)


@pytest.mark.parametrize("preset,fmt,label", PRESETS, ids=[p[0] for p in PRESETS])
def test_a_checkpoint_the_library_wrote_decodes_to_its_weights(preset, fmt, label, tmp_path):
    from safetensors.torch import load_file

    from engine import Engine
    from engine.config import ModelConfig
    from engine.weights.checkpoint import iter_tensors, tensor_shapes, weight_files
    from engine.weights.packed import PackedWeight, dequantize
    from engine.weights.quantized import packed_linears
    from tests.tiny import make_tiny_model

    src = make_tiny_model(tmp_path / "float", "llama", hidden=128)
    dst = tmp_path / "compressed"
    args = _compressed_checkpoint(src, dst, preset, fmt)
    engine = Engine.load(str(dst), device="cpu")
    assert engine.weights == label
    files = weight_files(dst)
    saved = {k: v for f in files for k, v in load_file(str(f)).items()}
    quant = ModelConfig.from_file(dst / "config.json").quantization
    layers = 0
    for name, t in packed_linears(iter_tensors(files), quant, dst.name, tensor_shapes(files)):
        if not isinstance(t, PackedWeight):
            continue
        prefix = name.removesuffix(".weight")
        scale_dtype = saved[f"{prefix}.weight_scale"].dtype
        want = _library_weight(saved, prefix, args[prefix])
        # the library computes in its scale's dtype; ours is exact in float32, so rounded the same way
        assert torch.equal(dequantize(t).to(scale_dtype), want.to(scale_dtype)), prefix
        layers += 1
    assert layers == 14  # two layers' seven projections
