"""Each GGUF block type's torch reference equals the gguf package's dequantize, bit for bit."""

import numpy as np
import pytest
import torch

from engine.weights.gguf_blocks import BLOCKS
from engine.weights.packed import PackedWeight, dequantize, gguf_weight
from tests.tiny_gguf import random_blocks

KINDS = list(BLOCKS)
# The types gguf can quantize (the others it only dequantizes).
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def _gguf_dequantize(blocks: np.ndarray, kind: str) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[kind])


def _same_bits(ours: torch.Tensor, ref: np.ndarray) -> bool:
    ref = torch.from_numpy(np.ascontiguousarray(ref, dtype=np.float32))
    return ours.dtype == torch.float32 and ours.shape == ref.shape and torch.equal(ours.view(torch.int32),
                                                                                   ref.view(torch.int32))


@pytest.mark.parametrize("kind", KINDS)
def test_sizes_are_ggmls(kind):
    import gguf

    assert BLOCKS[kind] == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]


@pytest.mark.parametrize("kind", KINDS)
def test_random_blocks_decode_as_gguf_does(kind):
    """Any bytes, scales of any sign and size (subnormals too): the references decode them alike."""
    rng = np.random.default_rng(KINDS.index(kind))
    block = BLOCKS[kind][0]
    rows, cols = 24, 4 * block
    blocks = random_blocks(kind, rows, cols, rng, sane=False)
    packed = gguf_weight(kind, torch.from_numpy(blocks), (rows, cols))
    assert packed.group_size == block and packed.nbytes == blocks.nbytes
    assert _same_bits(dequantize(packed), _gguf_dequantize(blocks, kind))


@pytest.mark.parametrize("kind", QUANTIZABLE)
def test_quantized_weights_decode_as_gguf_does(kind):
    """Blocks as a converter writes them, from gguf's own quantize."""
    import gguf

    rng = np.random.default_rng(1)
    w = (rng.standard_normal((32, 256)) * rng.uniform(0.01, 1.0, size=(32, 1))).astype(np.float32)
    w[3] = 0.0  # an all-zero block has scale 0
    blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind])
    ours = dequantize(gguf_weight(kind, torch.from_numpy(blocks), w.shape))
    assert _same_bits(ours, _gguf_dequantize(blocks, kind))
    assert torch.allclose(ours, torch.from_numpy(w), atol=0.1 * float(np.abs(w).max()))  # and near the weights


def test_a_packed_weight_keeps_the_blocks_as_the_file_stores_them():
    rng = np.random.default_rng(2)
    blocks = random_blocks("Q4_K", 8, 512, rng)
    packed = gguf_weight("Q4_K", torch.from_numpy(blocks), (8, 512))
    assert packed.data.dtype == torch.uint8 and tuple(packed.data.shape) == (8, 2 * 144)
    assert packed.scales is None and packed.zeros is None
    moved = packed.to("cpu")
    assert isinstance(moved, PackedWeight) and torch.equal(moved.data, packed.data)
