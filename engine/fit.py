"""Will a target (+ draft) fit on this GPU? Weights + KV cache for the context + draft + overhead."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .catalog import ModelShape
from .checkpoint import weight_files
from .errors import ModelLoadError

OVERHEAD_BYTES = 2**30  # CUDA context, CUDA-graph pools, activations and logits at batch 1
TIGHT_MARGIN = 0.10  # "tight" when the estimate is within 10% of the free memory
DEFAULT_CONTEXT = 8192


@dataclass(frozen=True)
class GpuMemory:
    name: str
    free_bytes: int
    total_bytes: int


def detect_gpu() -> GpuMemory | None:
    """Free and total memory of CUDA device 0, or None without a usable GPU (torch imported here)."""
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
    weights_bytes: int
    kv_bytes: int
    draft_bytes: int  # draft weights and the draft's own KV cache
    overhead_bytes: int
    available_bytes: int | None  # free GPU memory; None: no GPU

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.draft_bytes + self.overhead_bytes

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
) -> FitEstimate:
    """bf16 KV cache (2 bytes a value); the draft keeps its own cache of the same length."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    draft_kv = draft_shape.kv_bytes(context) if draft_shape is not None else 0
    return FitEstimate(
        weights_bytes=weights_bytes,
        kv_bytes=shape.kv_bytes(context),
        draft_bytes=draft_bytes + draft_kv,
        overhead_bytes=OVERHEAD_BYTES,
        available_bytes=gpu.free_bytes if gpu is not None else None,
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
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        return sum(int(t.n_elements) for t in reader.tensors) * 2
    except Exception:
        return path.stat().st_size * 4  # ~4-5 bits a weight in the usual quantizations
