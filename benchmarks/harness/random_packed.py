"""Random quantized weights of a model's shape, for timing the packed kernels without a checkpoint:
GGUF blocks of random bytes with sane scale fields, AWQ words of random nibbles, laid out as the
files lay them (so they go through the same GroupedWeight conversion a real load does).

`pack_model(model, layout)` replaces every decoder-layer projection of a model with random
packed weights of that layout, and for the GGUF layouts the embeddings and lm_head too, as the
files keep them (token_embd in the layout's type, Q4_K for Q4_K_M; output in Q6_K for the
k-quants, else the layout's type; a tied lm_head reads the embeddings' blocks):
    Q4_K_M   llama.cpp's mix: Q4_K, with attn_v and ffn_down in Q6_K on the layers its
             use_more_bits rule picks (the first and last eighth, and every third between)
    Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, Q8_0   every projection of that type
    AWQ      4-bit, group 128, zero points (AutoAWQ's GEMM layout); embeddings and lm_head bf16,
             as AWQ checkpoints keep them
    FP8      float8 e4m3 with one scale per output channel; embeddings and lm_head bf16, as FP8
             checkpoints keep them
    FP8-block  float8 e4m3 with one scale a 128 x 128 block (DeepSeek-V3's and Qwen3's FP8 files)
    W4A16    compressed-tensors' int4, group 128, symmetric (no zero points: llm-compressor's
             W4A16 preset)
"""

from __future__ import annotations

import torch

from engine.errors import UserError
from engine.weights.gguf_blocks import BLOCKS
from engine.weights.packed import PackedWeight, awq_weight, fp8_weight, gguf_weight, int_weight

LAYOUTS = ("Q4_K_M", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "AWQ", "FP8", "FP8-block", "W4A16")
FLOAT_TABLES = ("AWQ", "FP8", "FP8-block", "W4A16")  # layouts whose checkpoints keep embeddings and lm_head bf16
# Byte offsets of each block type's fp16 scale fields (d, and dmin or m where there is one).
_SCALE_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
                 "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}


def random_gguf(kind: str, n: int, k: int, device, gen: torch.Generator) -> PackedWeight:
    block, nbytes = BLOCKS[kind]
    blocks = torch.randint(0, 256, (n * k // block, nbytes), dtype=torch.uint8, device=device, generator=gen)
    for offset in _SCALE_FIELDS[kind]:
        scale = (torch.rand(blocks.shape[0], device=device, generator=gen) * 0.002 + 0.001).half()
        blocks[:, offset:offset + 2] = scale.view(torch.uint8).reshape(-1, 2)
    return gguf_weight(kind, blocks.reshape(n, -1), (n, k))


def random_awq(n: int, k: int, device, gen: torch.Generator, group: int = 128) -> PackedWeight:
    words = lambda rows: torch.randint(-2**31, 2**31 - 1, (rows, n // 8), dtype=torch.int32,  # noqa: E731
                                       device=device, generator=gen)
    scales = (torch.rand(k // group, n, device=device, generator=gen) * 0.002 + 0.001).half()
    return awq_weight(words(k), words(k // group), scales, group, "random")


def random_fp8(n: int, k: int, device, gen: torch.Generator, block: tuple[int, int] | None = None) -> PackedWeight:
    """Normal values over e4m3's range (subnormals included), one scale an output channel or a block."""
    values = torch.randn(n, k, device=device, generator=gen).mul_(64).clamp_(-448, 448)
    grid = (n,) if block is None else (-(-n // block[0]), -(-k // block[1]))
    scales = torch.rand(grid, device=device, generator=gen) * 2e-5 + 1e-5
    return fp8_weight(values.to(torch.float8_e4m3fn), scales, "random", block)


def random_int4(n: int, k: int, device, gen: torch.Generator, group: int = 128) -> PackedWeight:
    """compressed-tensors' packed int4 (random words), a bf16 scale a group, no zero points."""
    words = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, device=device, generator=gen)
    scales = (torch.rand(n, k // group, device=device, generator=gen) * 0.002 + 0.001).bfloat16()
    return int_weight(words, scales, None, torch.tensor([n, k]), None, "random")


def block_inputs(layout: str) -> int:
    """The inputs one block (or group) of a layout covers, which every K it packs must be a
    multiple of: GGUF's block of the layout's type (256 for the k-quants), 128 for AWQ's and
    W4A16's groups, 1 for FP8 (per channel, or blocks that may end past K)."""
    if layout in ("AWQ", "W4A16"):
        return 128
    if layout in ("FP8", "FP8-block"):
        return 1
    return BLOCKS["Q4_K" if layout == "Q4_K_M" else layout][0]


def check_layout(layout: str, cfg) -> None:
    """UserError in one line where `layout` cannot pack this model: an unknown layout, or one whose
    blocks do not divide the hidden, attention or MLP width (every projection's K)."""
    if layout not in LAYOUTS:
        raise UserError(f"--random-quant {layout!r}: choose one of {', '.join(LAYOUTS)}")
    block = block_inputs(layout)
    widths = {"hidden": cfg.hidden_size, "attention": cfg.q_size, "MLP": cfg.intermediate_size}
    odd = [f"{name} {width}" for name, width in widths.items() if width % block]
    if odd:
        raise UserError(f"--random-quant {layout}: its blocks of {block} inputs do not divide this model's "
                        f"{', '.join(odd)}; choose a layout with smaller blocks (e.g. Q4_1, Q8_0)")


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v and ffn_down a Q4_K_M file keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def layer_parts(layout: str, layer: int, layers: int, cfg, device, gen) -> dict[str, list[PackedWeight]]:
    """The packed parts of one decoder layer's projections, by the model's fused names (a layout
    check_layout accepted)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.q_size, cfg.kv_size

    def part(role: str, n: int, k: int) -> PackedWeight:
        if layout == "AWQ":
            return random_awq(n, k, device, gen)
        if layout == "FP8":
            return random_fp8(n, k, device, gen)
        if layout == "FP8-block":
            return random_fp8(n, k, device, gen, (128, 128))
        if layout == "W4A16":
            return random_int4(n, k, device, gen)
        kind = layout
        if layout == "Q4_K_M":
            kind = "Q6_K" if role in ("v", "down") and use_more_bits(layer, layers) else "Q4_K"
        return random_gguf(kind, n, k, device, gen)

    return {"self_attn.qkv_proj": [part("q", q, h), part("k", kv, h), part("v", kv, h)],
            "self_attn.o_proj": [part("o", h, q)],
            "mlp.gate_up_proj": [part("gate", i, h), part("up", i, h)],
            "mlp.down_proj": [part("down", h, i)]}


def table_kinds(layout: str) -> tuple[str, str] | None:
    """(the embeddings' type, lm_head's) of a GGUF layout's file; None: the safetensors layouts
    (embeddings and lm_head stay bf16)."""
    if layout in FLOAT_TABLES:
        return None
    embed = "Q4_K" if layout == "Q4_K_M" else layout
    return embed, ("Q6_K" if layout in ("Q4_K_M", "Q4_K", "Q5_K", "Q6_K") else layout)


@torch.no_grad()
def pack_model(model, layout: str, seed: int = 0) -> int:
    """Every decoder-layer projection of `model` replaced by a PackedLinear of random `layout`
    weights, and the embeddings and lm_head by packed ones where the layout's files pack them
    (table_kinds); the bf16 weights they replace are freed. Returns the packed bytes."""
    from engine.packed_linear import PackedEmbedding, PackedLinear
    from engine.weights.grouped import grouped_blocks

    check_layout(layout, model.config)  # once, before any layer is replaced
    layers = model.model.layers
    device = model.model.embed_tokens.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    total = 0
    for index, layer in enumerate(layers):
        for path, parts in layer_parts(layout, index, len(layers), model.config, device, gen).items():
            parent_path, _, attr = path.rpartition(".")
            parent = layer.get_submodule(parent_path)
            packed = PackedLinear(grouped_blocks(parts), getattr(parent, attr).bias)
            setattr(parent, attr, packed)
            total += packed.nbytes
        torch.cuda.empty_cache() if device.type == "cuda" else None
    kinds = table_kinds(layout)
    if kinds is not None:
        cfg, dtype = model.config, model.model.norm.weight.dtype
        embed = PackedEmbedding(grouped_blocks([random_gguf(kinds[0], cfg.vocab_size, cfg.hidden_size, device,
                                                            gen)])[0], dtype)
        model.model.embed_tokens = embed
        total += embed.nbytes
        if cfg.tie_word_embeddings:
            model.lm_head = embed.as_linear()
        else:
            model.lm_head = PackedLinear(grouped_blocks([random_gguf(kinds[1], cfg.vocab_size, cfg.hidden_size,
                                                                     device, gen)]))
            total += model.lm_head.nbytes
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return total
