"""Will a target (+ draft) fit on this GPU? Weights + KV cache for the context + draft + overhead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.hub.catalog import ModelShape
from engine.weights.checkpoint import weight_files
from engine.errors import ModelLoadError
from engine.options import cuda_visible_devices

OVERHEAD_BYTES = 2**30  # CUDA context, CUDA-graph pools, activations and logits at batch 1
TIGHT_MARGIN = 0.10  # "tight" when the estimate is within 10% of the free memory
DENSE_SHARE = 0.9  # a quantized model runs dense while that form needs at most this share of the free memory


def dense_fits(need_bytes: int, free_bytes: int) -> bool:
    """Whether a quantized model's dense form (bf16 weights, KV cache, overhead) fits: else its
    weights are kept packed (engine/loader.py: packs_weights; FitEstimate.packed)."""
    return need_bytes <= DENSE_SHARE * free_bytes
DEFAULT_CONTEXT = 8192


@dataclass(frozen=True)
class GpuMemory:
    name: str
    free_bytes: int
    total_bytes: int


def detect_gpu() -> GpuMemory | None:
    """Free and total memory of the GPU that CUDA numbers 0, or None without a usable GPU.

    nvidia-smi answers in a fraction of a second where importing torch takes seconds, so torch
    is asked only where a GPU driver is present but nvidia-smi cannot answer (no binary on the
    PATH, a MIG or ROCm device)."""
    visible = cuda_visible_devices()
    first = None
    if visible is not None:
        first = visible.split(",")[0].strip()
        if not first or first.startswith("-"):  # "" or "-1": CUDA sees no device
            return None
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        answer = _ask_nvidia_smi(smi, first)
        if answer is not None:
            return answer
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in _LINUX_GPU_DRIVERS):
        return None
    return _ask_torch()


_LINUX_GPU_DRIVERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")  # NVIDIA, AMD ROCm
NVIDIA_SMI_TIMEOUT_S = 3.0  # it answers in ~0.1 s; a wedged driver must not hang `localchat models`


def _ask_nvidia_smi(smi: str, device: str | None) -> GpuMemory | None:
    """nvidia-smi's name and memory of `device` (an index or UUID; its first GPU when None), or
    None when it cannot say. Without CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA may number unlike GPUs in
    another order than nvidia-smi; the fit estimate only needs a GPU of the machine's kind."""
    cmd = [smi, "--query-gpu=name,memory.free,memory.total", "--format=csv,noheader,nounits"]
    if device:
        cmd += ["-i", device]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return None
    try:
        name, free_mib, total_mib = (part.strip() for part in lines[0].rsplit(",", 2))
        return GpuMemory(name, int(float(free_mib) * 2**20), int(float(total_mib) * 2**20))
    except ValueError:  # "[N/A]" fields, or a format this version does not write
        return None


def _ask_torch() -> GpuMemory | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(0)
        return GpuMemory(torch.cuda.get_device_name(0), int(free), int(total))
    except Exception:  # no driver, no torch build with CUDA: same answer for the user
        return None


@dataclass(frozen=True)
class FitEstimate:
    weights_bytes: int  # dense: as bf16
    kv_bytes: int
    draft_bytes: int  # draft weights and the draft's own KV cache
    overhead_bytes: int
    available_bytes: int | None  # free GPU memory; None: no GPU
    packed_weights_bytes: int | None = None  # a quantized model's weights kept packed; None: not quantized

    @property
    def packed(self) -> bool:
        """Whether the load keeps the weights packed: quantized, and a dense model that would not
        fit in 90% of the free memory (engine/loader.py: packs_weights). A load with no draft
        also packs a large 4-bit model that fits, for speed; the estimate leaves that out, which
        only overstates what such a load needs."""
        dense = self.weights_bytes + self.kv_bytes + self.draft_bytes + self.overhead_bytes
        return (self.available_bytes is not None and self.packed_weights_bytes is not None
                and not dense_fits(dense, self.available_bytes))

    @property
    def need_bytes(self) -> int:
        weights = self.packed_weights_bytes if self.packed else self.weights_bytes
        return weights + self.kv_bytes + self.draft_bytes + self.overhead_bytes

    @property
    def as_text(self) -> str:
        """"fits", "tight (packed)", ...: the verdict, and how the weights would run."""
        return self.verdict + (" (packed)" if self.packed else "")

    @property
    def verdict(self) -> str:
        """"fits", "tight", "does not fit", or "no GPU"."""
        if self.available_bytes is None:
            return "no GPU"
        if self.need_bytes > self.available_bytes:
            return "does not fit"
        if self.need_bytes > (1 - TIGHT_MARGIN) * self.available_bytes:
            return "tight"
        return "fits"


def estimate_fit(
    weights_bytes: int,
    shape: ModelShape,
    context: int = DEFAULT_CONTEXT,
    draft_bytes: int = 0,
    draft_shape: ModelShape | None = None,
    gpu: GpuMemory | None = None,
    packed_weights_bytes: int | None = None,
) -> FitEstimate:
    """bf16 KV cache (2 bytes a value); the draft keeps its own cache of the same length.
    packed_weights_bytes: a quantized model's weights as the GPU keeps them packed (where the
    dense ones do not fit)."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    draft_kv = draft_shape.kv_bytes(context) if draft_shape is not None else 0
    return FitEstimate(
        weights_bytes=weights_bytes,
        kv_bytes=shape.kv_bytes(context),
        draft_bytes=draft_bytes + draft_kv,
        overhead_bytes=OVERHEAD_BYTES,
        available_bytes=gpu.free_bytes if gpu is not None else None,
        packed_weights_bytes=packed_weights_bytes,
    )


def shape_from_config(config: dict) -> ModelShape | None:
    """The KV shape of a Hugging Face config.json (head_dim defaults to hidden / heads)."""
    text = config.get("text_config") or config.get("transformer_layer_config") or config
    try:
        heads = text["num_attention_heads"]
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
        return ModelShape(text["num_hidden_layers"], text.get("num_key_value_heads") or heads, head_dim)
    except (KeyError, TypeError, ZeroDivisionError, ValueError):
        return None


def local_weights_bytes(path: Path) -> int:
    """Bytes the weights take on the GPU: sizes of the files the loader reads (safetensors, or
    pytorch_model*.bin when there are none), bf16 of every tensor for GGUF; 0 without weights."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_bf16_bytes(path)
    try:
        files = weight_files(path)
    except ModelLoadError:
        return 0
    return sum(f.stat().st_size for f in files)


def _gguf_bf16_bytes(path: Path) -> int:
    """GGUF weights are dequantized at load, so count elements, not file bytes."""
    from engine.weights.gguf_header import read_tensor_infos

    try:
        return sum(t.n_elements for t in read_tensor_infos(path)) * 2
    except (OSError, ValueError):
        return path.stat().st_size * 4  # ~4-5 bits a weight in the usual quantizations


# Bits a weight of each GGUF quantization takes, on average over a llama.cpp mix (its block scales
# included): what a GGUF file's size says about the bf16 model it is dequantized to at load.
GGUF_BITS = {"Q2_K": 3.0, "Q3_K_S": 3.5, "Q3_K_M": 3.9, "Q3_K_L": 4.3, "Q4_0": 4.55, "Q4_1": 5.0,
             "Q4_K_S": 4.6, "Q4_K_M": 4.85, "Q5_0": 5.55, "Q5_1": 6.0, "Q5_K_S": 5.55, "Q5_K_M": 5.7,
             "Q6_K": 6.6, "Q8_0": 8.5, "F16": 16.0, "BF16": 16.0, "F32": 32.0}


def gguf_gpu_bytes(file_bytes: int, pick: str) -> int | None:
    """About how many bytes the model of a GGUF file of `file_bytes` takes in GPU memory once
    dequantized to bf16 at load; None for a quantization not in GGUF_BITS (or a file name)."""
    bits = GGUF_BITS.get(pick.upper())
    return None if bits is None else int(file_bytes * 16 / bits)


# Bits a layer weight takes kept packed on the GPU (engine/weights/grouped.py: q in 4, 5, 6 or 8
# bits, the k-quants' scales as the file's codes and fp16 units, others' fp16 where exact, else
# fp32), by GGUF block type (tests/engine/test_grouped_weights.py checks them)...
PACKED_BITS = {"Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q8_0": 8.5, "Q2_K": 5.125, "Q3_K": 4.5625,
               "Q4_K": 4.625, "Q5_K": 5.625, "Q6_K": 6.5625}
# ...and over a file's mix (Q4_K_M and Q5_K_M: about a sixth of the weights in Q6_K) or a
# checkpoint format.
PACKED_MIX_BITS = {**PACKED_BITS, "Q4_K_S": 4.7, "Q4_K_M": 4.95, "Q5_K_S": 5.7, "Q5_K_M": 5.8, "AWQ": 4.4,
                   "GPTQ": 4.4, "FP8": 8.0}
_LAYER_TENSOR = (".attn_q.", ".attn_k.", ".attn_v.", ".attn_output.", ".ffn_gate.", ".ffn_up.", ".ffn_down.")


def packed_gguf_bytes(path: Path) -> int | None:
    """A GGUF file's weights as a GPU keeps them packed: its layers' projections, lm_head and
    embeddings in the packed layout, everything else (norms) as bf16. None: unreadable, or nothing
    to pack."""
    from engine.weights.gguf_header import TYPE_NAMES, read_tensor_infos

    try:
        infos = read_tensor_infos(path)
    except (OSError, ValueError):
        return None
    total, packed = 0, False
    for t in infos:
        layer = any(k in t.name + "." for k in _LAYER_TENSOR) or t.name in ("output.weight", "token_embd.weight")
        bits = PACKED_BITS.get(TYPE_NAMES.get(t.type_id, "")) if layer else None
        packed = packed or bits is not None
        total += int(t.n_elements * (bits if bits is not None else 16) / 8)
    return total if packed else None


def packed_catalog_bytes(dense_bytes: int, weights: str | None, hidden: int | None, vocab: int | None) -> int | None:
    """About how many bytes a catalog variant's weights take packed: its layers and lm_head at the
    format's packed bits, the embeddings (vocab x hidden) too for a GGUF (a GPU keeps its
    token_embd packed), in bf16 for AWQ, GPTQ and FP8 (their checkpoints keep them so); None: not
    quantized."""
    fmt = (weights or "").upper()
    bits = PACKED_MIX_BITS.get(fmt)
    if bits is None:
        return None
    embed = 0 if fmt.startswith("Q") else 2 * (vocab or 0) * (hidden or 0)
    return int(max(0, dense_bytes - embed) * bits / 16) + embed
