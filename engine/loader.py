"""Builds a CausalLM on a device from a Hugging Face folder or a GGUF file."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch

from engine.weights.checkpoint import iter_tensors, tensor_shapes, weight_files
from engine.config import ModelConfig
from engine.config_checks import read_json, token_ids
from engine.errors import ModelLoadError
from engine.weights.gguf import (check_gguf_types, gguf_shapes, gguf_weights_label, hf_config, iter_gguf_tensors,
                                 open_gguf)
from engine.model import CausalLM
from engine.ops import Ops
from engine.options import KernelOptions
from engine.packed_linear import projections_on_meta
from engine.weights.prepared import is_current, prepared_weights, write_prepared
from engine.weights.quantized import dequantized, keeps_packed, packed_linears
from engine.tokenizer import Tokenizer
from engine.weights.load import load_weights
from engine.uninitialized import build_uninitialized

# Float dtypes as the weight format is reported.
_DTYPE_LABELS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    config: ModelConfig
    source: Path
    # The checkpoint's weight format: "bf16", "Q4_K_M", "AWQ-int4-g128".
    weights: str
    # What the decoder layers' projections run in: the checkpoint's format where a GPU decodes it in
    # place (packed_weights), else the dtype it was dequantized to ("bf16", "fp32").
    runs_as: str = ""


def build_model(cfg: ModelConfig, tensors, source: str, device: torch.device, dtype: torch.dtype,
                max_len: int, options: KernelOptions = KernelOptions(), packed: bool = False) -> CausalLM:
    """packed: the decoder layers' projections come as PackedWeights (allocated on the meta device
    until then, so the dense weights never take memory)."""
    with projections_on_meta(packed):
        model = build_uninitialized(lambda: CausalLM(cfg, max_len, Ops.for_device(device, options)), device, dtype)
    load_weights(model, tensors, source)
    return model.eval().requires_grad_(False)


# With no draft loaded, a model whose projections run the one-row kernel (GGUF blocks, AWQ, GPTQ
# or, on a GPU with FP8, FP8 over widths of 2,048 and more) decodes faster packed than as bf16, in
# a third to three fifths of the memory (on an H200, the 8B shape: Q4_K_M 1.74x, Q6_K 1.41x, Q8_0
# 1.59x, AWQ 1.90x, FP8 1.45x; Qwen2.5-7B's Q4_K_M 1.58x; docs/performance.md), so auto packs it
# even where the dense model fits when at
# least this share of its projections' weights would run that kernel. A loaded draft verifies on
# the batch-invariant packed kernel, slower than bf16's: there the memory rule alone.
ONE_ROW_SHARE = 0.75


def packs_weights(device: torch.device, dtype: torch.dtype, options: KernelOptions,
                  cfg: ModelConfig | None = None, max_len: int | None = None, one_row_share: float = 0.0) -> bool:
    """Whether this load keeps quantized projections packed: CUDA with Triton, a 16-bit model, and
    KernelOptions.packed_weights True, or None (auto) with either a dense model of `cfg` (its
    weights, a KV cache of max_len positions, 1 GiB for the rest) that would not fit in 90% of the
    GPU's free memory (the rule the fit estimate follows: engine/hub/fit.py), or, with no draft
    loaded and the one-row kernel on, one_row_share (the share of the projections' weights that
    kernel would run: gguf_one_row_share, quant_one_row_share) of at least ONE_ROW_SHARE."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16) or options.packed_weights is False:
        return False
    if not _has_triton():
        return False
    if options.packed_weights is None:
        if cfg is None:
            return False
        if one_row_share >= ONE_ROW_SHARE and options.packed_row and not options.batch_invariant:
            return True
        from engine.hub.catalog import ModelShape
        from engine.hub.fit import OVERHEAD_BYTES, dense_fits

        positions = max_len or min(cfg.max_position_embeddings, 8192)
        kv = ModelShape(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim).kv_bytes(positions, _element_size(dtype))
        return not dense_fits(dense_bytes(cfg, dtype) + kv + OVERHEAD_BYTES, torch.cuda.mem_get_info(device)[0])
    return True


def gguf_one_row_share(reader) -> float:
    """The share of a GGUF's projection weights (every matrix but the token embeddings) that the
    one-row kernel would run packed: the block types a packing load keeps packed (all of
    gguf_blocks.BLOCKS) over a K that fills its four warps (row_kernel_wide); float tensors stay dense."""
    from engine.kernels.packed_gemv import row_kernel_wide
    from engine.weights.gguf_blocks import BLOCKS

    served = total = 0
    for t in reader.tensors:
        if len(t.shape) != 2 or t.name.startswith("token_embd"):
            continue
        n, kind = int(t.n_elements), t.tensor_type.name
        total += n
        if kind in BLOCKS and row_kernel_wide(int(t.shape[0]), 32):
            served += n
    return served / total if total else 0.0


def quant_one_row_share(cfg: ModelConfig, fp8: bool = True) -> float:
    """The same for a folder's quantization_config: AWQ, GPTQ, FP8 and compressed-tensors quantize every projection, so
    the share of their projections' weights whose K (hidden, attention or MLP width) fills the
    kernel's steps. fp8: whether the GPU keeps FP8 packed (fp8_gpu); without, FP8 runs none."""
    from engine.kernels.packed_gemv import row_kernel_wide, tile_group

    q = cfg.quantization
    if q is None or (q.all_fp8 and not fp8):
        return 0.0
    h, i = cfg.hidden_size, cfg.intermediate_size
    # (weights, K): qkv and gate_up over the hidden size, o_proj over the heads, down over the MLP
    parts = [(h * (cfg.q_size + 2 * cfg.kv_size + 2 * i), h), (cfg.q_size * h, cfg.q_size), (i * h, i)]
    group = q.row_group
    served = sum(n for n, k in parts if row_kernel_wide(k, tile_group(k, k) if group == -1 else group))
    return served / sum(n for n, _ in parts)


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def dense_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """The bytes of the model's weights in `dtype` (embeddings, lm_head, the layers' projections)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    layer = h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * i
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return (cfg.num_layers * layer + embed) * _element_size(dtype)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def fp8_gpu(device: torch.device) -> bool:
    """Whether the device decodes FP8 weights natively (compute capability 8.9 and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _keep(device: torch.device):
    """The packed tensors a packing load keeps: decoder-layer projections (FP8 where the GPU has it)."""
    fp8 = fp8_gpu(device)
    return lambda name, p: keeps_packed(name) and (p.format != "FP8" or fp8)


def _runs_as(model: torch.nn.Module, label: str, dtype: torch.dtype) -> str:
    from engine.packed_linear import PackedLinear

    if any(isinstance(m, PackedLinear) for m in model.modules()):
        return label
    return _DTYPE_LABELS.get(dtype, str(dtype).removeprefix("torch."))


def load_folder(folder: Path, device: torch.device, dtype: torch.dtype, max_len: int | None,
                options: KernelOptions = KernelOptions()) -> LoadedModel:
    if not (folder / "config.json").exists():
        raise ModelLoadError(f"{folder} has no config.json; point --model at a Hugging Face model folder, "
                             "a .gguf file, a Hub repo id or 'demo'")
    cfg = ModelConfig.from_file(folder / "config.json")
    files = weight_files(folder)
    shapes = tensor_shapes(files)
    cfg.check_tensors(shapes, folder.name)
    max_len = max_len or min(cfg.max_position_embeddings, 8192)
    matrices: Counter = Counter()
    tensors = _counting_matrices(iter_tensors(files), matrices)
    packed = cfg.quantization is not None and packs_weights(device, dtype, options, cfg, max_len,
                                                            quant_one_row_share(cfg, fp8_gpu(device)))
    if cfg.quantization is not None:
        tensors = dequantized(packed_linears(tensors, cfg.quantization, folder.name, shapes), _keep(device) if packed else None)
    model = build_model(cfg, tensors, folder.name, device, dtype, max_len, options, packed)
    eos = _generation_eos(folder) or cfg.eos_token_ids
    weights = cfg.quantization.label if cfg.quantization else _dtype_label(matrices)
    return LoadedModel(model, Tokenizer.from_folder(folder, eos), cfg, folder, weights,
                       _runs_as(model, weights, dtype))


def _counting_matrices(tensors: Iterable[tuple[str, torch.Tensor]], counts: Counter
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors, counting the elements of the matrices by dtype as they pass."""
    for name, tensor in tensors:
        if tensor.dim() == 2:
            counts[tensor.dtype] += tensor.numel()
        yield name, tensor


def _dtype_label(matrices: Counter) -> str:
    """The dtype most matrix elements are stored in: "bf16"."""
    if not matrices:
        return "unknown"
    dtype = matrices.most_common(1)[0][0]
    return _DTYPE_LABELS.get(dtype, str(dtype).removeprefix("torch."))


def load_gguf(path: Path, device: torch.device, dtype: torch.dtype, max_len: int | None,
              prepared_dir: Path | None = None, log=None, options: KernelOptions = KernelOptions()) -> LoadedModel:
    """Loads a GGUF file. With `prepared_dir`, the first load also writes there an HF folder
    (config, the dequantized tensors in `dtype`, the converted tokenizer) and later loads read that
    instead while the file is unchanged: parsing the GGUF vocabulary and dequantizing cost
    seconds at every start (engine/weights/prepared.py)."""
    reader = None
    if prepared_dir is not None and is_current(prepared_dir, path, dtype):
        prepared_cfg = ModelConfig.from_file(prepared_dir / "config.json")

        def packs(share: float) -> bool:
            return packs_weights(device, dtype, options, prepared_cfg, max_len, share)

        # The prepared copy is dense: it serves a load that does not pack. Only where packing turns
        # on the file's tensor types is the file opened to count them.
        if packs(1.0) and not packs(0.0):
            reader = open_gguf(path)
        if not packs(gguf_one_row_share(reader) if reader is not None else 0.0):
            loaded = load_folder(prepared_dir, device, dtype, max_len, options)
            return dataclasses.replace(loaded, weights=prepared_weights(prepared_dir))
    if reader is None:
        reader = open_gguf(path)
    raw = hf_config(reader, path)
    cfg = ModelConfig.from_hf(raw, path.name)
    packed = packs_weights(device, dtype, options, cfg, max_len, gguf_one_row_share(reader))
    if packed:
        prepared_dir = None  # the prepared copy holds dequantized weights; a packing load reads the blocks
    cfg.check_tensors(gguf_shapes(reader), path.name, "block_count")
    check_gguf_types(reader, path)
    weights = gguf_weights_label(reader)
    max_len = max_len or min(cfg.max_position_embeddings, 8192)
    # Quantized tensors arrive as their blocks; those a packing load keeps stay so, the rest are
    # dequantized one at a time.
    tensors = dequantized(iter_gguf_tensors(reader, raw), _keep(device) if packed else None)
    if prepared_dir is not None:
        tensors = dict(tensors)
    model = build_model(cfg, iter(tensors.items()) if isinstance(tensors, dict) else tensors, path.name,
                        device, dtype, max_len, options, packed)
    tok = Tokenizer.from_folder(path.parent, cfg.eos_token_ids, gguf_file=path.name)
    if prepared_dir is not None:
        write_prepared(prepared_dir, path, raw, tensors, tok, dtype, weights, log)
    return LoadedModel(model, tok, cfg, path, weights, _runs_as(model, weights, dtype))


def _generation_eos(folder: Path) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    if not path.exists():
        return ()
    return token_ids(read_json(path).get("eos_token_id"), "eos_token_id", f"{folder.name}/{path.name}")
