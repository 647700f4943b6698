"""AWQ, GPTQ and FP8 weights for tests, packed by this file's own packers.

The packers follow the quantizers' own code, not engine/weights/int4.py, so a test that unpacks
their words with the engine checks the engine against the formats:
- AWQ: AutoAWQ's `WQLinear_GEMM.from_linear` (awq/modules/linear/gemm.py) packs qweight (K, N/8)
  and qzeros (K/G, N/8) with `order_map = [0, 2, 4, 6, 1, 3, 5, 7]`: column c*8 + order_map[i]
  into bits 4i of word c. Zero points as they are.
- GPTQ: AutoGPTQ's `QuantLinear.pack` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py) packs
  qweight (K/8, N) along K (input 8r + j into bits 4j of row r) after `zeros -= 1`, and qzeros
  (K/G, N/8) along N in order; GPTQModel's gptq_v2 format skips the `- 1`.
- The weight they stand for: w[n, k] = (q[k, n] - zero[k // G, n]) * scale[k // G, n].
- compressed-tensors (`pack_to_int32` in compressed_tensors' pack_quantized compressor): signed
  q (int4 -8..7, int8 -128..127) stored as q + 2^(bits - 1), 32 / bits a word along K, the first
  lowest, zero-padded; a packed zero point the same way along N (0.9.4 on), earlier int8 (N, G);
  int-quantized checkpoints keep q as int8 one a byte. w[n, k] = (q - zp) * scale per group.
- FP8 blocks (DeepSeek-V3's `weight_dequant`): one scale a (rows, inputs) block, the edges' blocks
  cut short, stored as `weight_scale_inv` and multiplied.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

AWQ_ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]
# The linear layers AWQ and GPTQ quantize in a Llama decoder layer (lm_head and embeddings stay float).
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pack_awq(values: np.ndarray) -> np.ndarray:
    """(R, C) values 0-15 -> (R, C/8) int32, AutoAWQ's order."""
    words = np.zeros((values.shape[0], values.shape[1] // 8), dtype=np.uint32)
    for col in range(words.shape[1]):
        for i in range(8):
            words[:, col] |= values[:, col * 8 + AWQ_ORDER_MAP[i]].astype(np.uint32) << (4 * i)
    return words.view(np.int32)


def pack_gptq_rows(values: np.ndarray) -> np.ndarray:
    """(K, N) values 0-15 -> (K/8, N) int32: 8 consecutive rows per word, the first in the low bits."""
    words = np.zeros((values.shape[0] // 8, values.shape[1]), dtype=np.uint32)
    for row in range(words.shape[0]):
        for j in range(8):
            words[row] |= values[row * 8 + j].astype(np.uint32) << (4 * j)
    return words.view(np.int32)


def pack_gptq_cols(values: np.ndarray) -> np.ndarray:
    """(R, N) values 0-15 -> (R, N/8) int32: 8 consecutive columns per word, the first in the low bits."""
    words = np.zeros((values.shape[0], values.shape[1] // 8), dtype=np.uint32)
    for col in range(words.shape[1]):
        for j in range(8):
            words[:, col] |= values[:, col * 8 + j].astype(np.uint32) << (4 * j)
    return words.view(np.int32)


def quantize_int4(w: np.ndarray, group_size: int, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w (N, K) float -> q (K, N), zeros (K/G, N) as ints 0-15, scales (K/G, N) float16: min-max
    quantization per group of G inputs (G = K for -1); `sym`: the zero point is 8 everywhere."""
    n, k = w.shape
    g = k if group_size == -1 else group_size
    groups = w.reshape(n, k // g, g)
    if sym:
        scale = np.abs(groups).max(-1) / 7.5
        zero = np.full(scale.shape, 8)
    else:
        lo, hi = groups.min(-1), groups.max(-1)
        scale = (hi - lo) / 15
        zero = np.clip(np.round(-lo / np.maximum(scale, 1e-8)), 0, 15)
    scale = np.maximum(scale, 1e-6).astype(np.float16)
    q = np.clip(np.round(groups / scale.astype(np.float32)[..., None]) + zero[..., None], 0, 15)
    return (q.reshape(n, k).T.astype(np.int64), zero.T.astype(np.int64), scale.T.copy())


def int4_weight(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """The documented formula, element by element of its definition: (N, K) float32."""
    k = q.shape[0]
    g = k if group_size == -1 else group_size
    group = np.arange(k) // g
    return ((q - zeros[group]).astype(np.float32) * scales[group].astype(np.float32)).T.copy()


def awq_tensors(w: np.ndarray, group_size: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The AWQ tensors of one linear layer, and the weight they stand for."""
    q, zeros, scales = quantize_int4(w, group_size, sym=False)
    return ({"qweight": pack_awq(q), "qzeros": pack_awq(zeros), "scales": scales},
            int4_weight(q, zeros, scales, group_size))


def gptq_tensors(w: np.ndarray, group_size: int, sym: bool, v2: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The GPTQ tensors of one linear layer (the original format, or gptq_v2), and the weight they stand for."""
    q, zeros, scales = quantize_int4(w, group_size, sym)
    k = q.shape[0]
    g_idx = (np.arange(k) // (k if group_size == -1 else group_size)).astype(np.int32)
    assert v2 or zeros.min() >= 1, "the original format cannot store a zero point of 0"
    stored = zeros if v2 else zeros - 1  # AutoGPTQ's pack: `zeros -= 1`
    return ({"qweight": pack_gptq_rows(q), "qzeros": pack_gptq_cols(stored), "scales": scales,
             "g_idx": g_idx}, int4_weight(q, zeros, scales, group_size))


def fp8_tensors(w: torch.Tensor, per_channel: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The FP8 tensors of one linear layer (weight, weight_scale, and a static input_scale), and
    the weight they stand for: weight.float() * scale."""
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().max()
    scale = (amax / 448.0).clamp(min=1e-8).float()
    w8 = (w / scale).to(torch.float8_e4m3fn)
    return ({"weight": w8, "weight_scale": scale, "input_scale": torch.tensor(0.01)},
            w8.float() * scale)


def pack_ct(values: np.ndarray, bits: int) -> np.ndarray:
    """(R, C) signed values -> (R, ceil(C * bits / 32)) int32: value + 2^(bits - 1), 32 / bits a
    word along C, the first in the lowest bits, zero bits past C."""
    per = 32 // bits
    rows, cols = values.shape
    words = np.zeros((rows, -(-cols // per)), dtype=np.uint32)
    for c in range(cols):
        words[:, c // per] |= (values[:, c].astype(np.int64) + (1 << (bits - 1))).astype(np.uint32) << (bits * (c % per))
    return words.view(np.int32)


def ct_int_tensors(w: np.ndarray, bits: int, group_size: int, sym: bool, layout: str = "packed",
                   zp_packed: bool = True) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """compressed-tensors integer tensors of one linear layer (layout "packed": pack-quantized's
    weight_packed and weight_shape; "int8": int-quantized's weight), and the weight they stand for.
    Min-max quantization per group of G inputs (-1: per channel)."""
    n, k = w.shape
    g = k if group_size == -1 else group_size
    lo_q, hi_q = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    groups = w.reshape(n, k // g, g).astype(np.float32)
    if sym:
        scale = np.abs(groups).max(-1) / ((hi_q - lo_q) / 2)
        zp = np.zeros(scale.shape, dtype=np.int64)
    else:
        lo, hi = groups.min(-1), groups.max(-1)
        scale = (hi - lo) / (hi_q - lo_q)
        zp = np.clip(np.round(lo_q - lo / np.maximum(scale, 1e-8)), lo_q, hi_q).astype(np.int64)
    scale = np.maximum(scale, 1e-6).astype(np.float16)
    q = np.clip(np.round(groups / scale.astype(np.float32)[..., None]) + zp[..., None], lo_q, hi_q).astype(np.int64)
    meant = ((q - zp[..., None]).astype(np.float32) * scale.astype(np.float32)[..., None]).reshape(n, k)
    q = q.reshape(n, k)
    if layout == "packed":
        out = {"weight_packed": pack_ct(q, bits), "weight_shape": np.array([n, k], dtype=np.int64)}
    else:
        out = {"weight": q.astype(np.int8)}
    out["weight_scale"] = scale
    if not sym:
        out["weight_zero_point"] = pack_ct(zp.T.copy(), bits).T.copy() if zp_packed else zp.astype(np.int8)
    return out, meant


def fp8_block_tensors(w: torch.Tensor, block: tuple[int, int], scale_dtype: torch.dtype = torch.float32,
                      name: str = "weight_scale_inv") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """FP8 with one scale a block of (rows, inputs): weight and its (ceil(N / rows), ceil(K / inputs))
    scales under `name`, and the weight they stand for."""
    n, k = w.shape
    rows, cols = block
    grid_n, grid_k = -(-n // rows), -(-k // cols)
    padded = torch.zeros(grid_n * rows, grid_k * cols)
    padded[:n, :k] = w.abs()
    grid = padded.reshape(grid_n, rows, grid_k, cols).amax(dim=(1, 3)) / 448.0
    grid = grid.clamp(min=1e-8).to(scale_dtype)
    full = grid.float().repeat_interleave(rows, dim=0)[:n].repeat_interleave(cols, dim=1)[:, :k]
    w8 = (w / full).to(torch.float8_e4m3fn)
    return {"weight": w8, name: grid}, w8.float() * full


def quantized_folder(src: Path, dst: Path, method: str, quantization_config: dict, **options
                     ) -> dict[str, torch.Tensor]:
    """Copies the tiny model folder `src` to `dst` with its decoder linears quantized by `method`
    ("awq", "gptq", "fp8", "fp8_block", "ct_int", "ct_fp8"; options for the packer) and
    config.json's quantization_config; returns
    the float32 weights the checkpoint stands for, under their HF names (every tensor)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(str(src / "model.safetensors"))
    out, meant = {}, {}
    for name, t in state.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf != "weight" or prefix.rpartition(".")[2] not in LINEARS:
            out[name], meant[name] = t, t.float()
            continue
        if method == "fp8":
            parts, w = fp8_tensors(t.float(), **options)
        elif method in ("fp8_block", "ct_fp8"):
            if options.get("block"):
                parts, w = fp8_block_tensors(t.float(), **options)
            else:
                parts, w = fp8_tensors(t.float(), **options)
                parts.pop("input_scale")
        elif method == "ct_int":
            arrays, w = ct_int_tensors(t.float().numpy(), **options)
            parts, w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}, torch.from_numpy(w)
        else:
            make = awq_tensors if method == "awq" else gptq_tensors
            arrays, w = make(t.float().numpy(), **options)
            parts, w = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}, torch.from_numpy(w)
        out.update({f"{prefix}.{k}": v for k, v in parts.items()})
        meant[name] = w
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(cfg))
    return meant


def awq_target_with_head(base: Path) -> tuple[Path, Path]:
    """A tiny 3-layer Llama (hidden 128) as an AWQ g64 checkpoint and a random EAGLE-3 head for it:
    (the AWQ folder, the head folder), both under `base`."""
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import make_tiny_model, read_config

    src = make_tiny_model(base / "float", "llama", num_layers=3, hidden=128, seed=5)
    awq = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
    quantized_folder(src, base / "awq", "awq", awq, group_size=64)
    cfg = read_config(src)
    head = write_head(base / "head", cfg, "sglang", head_tensors(128, 128, 3, cfg["vocab_size"], 200, seed=1),
                      128, (1, 2, 3))
    return base / "awq", head
