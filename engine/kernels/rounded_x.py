"""x rounded to int8 once for the one-row packed kernel (packed_gemv.packed_row_gemv), by the
kernel before the projection (the norm, the activation) or by round_x's own launch.

The layout is packed_rows.quantize_rows' for one row: vectors of 32 inputs, each 8 int32 words
(for nibble weights the even inputs' 4 words, then the odd inputs' 4: input 8j + 2t + e is byte t
of word 4e + j; for int8 weights 4 inputs a word in order) and one fp32 scale, max|x| / 127,
each value rounded to nearest. round_helper gives the Triton function every such kernel rounds
with, so that all of them round alike.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

tl = round_vectors = store_rounded = None  # bound on first use: Triton is imported then (the interpreter looks tl up here)


@dataclass(frozen=True)
class RoundedX:
    """One row of x rounded to int8 for every projection block that reads it, so that the one-row
    kernel loads a byte an input, not two, and no program rounds x again."""
    words: torch.Tensor  # (K / 32, 1, 8) int32
    scales: torch.Tensor  # (K / 32, 1) fp32
    nibble_order: bool
    dtype: torch.dtype  # x's own: the output's

    @property
    def shape(self) -> tuple[int, int]:
        return (1, self.words.shape[0] * 32)

    @property
    def device(self) -> torch.device:
        return self.words.device


@functools.cache
def round_helper():
    """The Triton function that rounds vectors of 32 values to int8 for the integer dot products:
    round_vectors(x (V, 32) float32, V, NIBBLE_ORDER) -> (words (V, 8) int32 in the order the
    weights' words meet them, scales (V,) fp32 max|x| / 127, the rounded values (V, 32) int32).
    quantize_rows' kernel and the kernels that hand a projection x already rounded (RoundedX)
    call it, so both round alike."""
    global tl  # a name of this module too: Triton's interpreter looks for it where the function lives
    import triton
    import triton.language as tl

    @triton.jit
    def round_vectors(x, V: tl.constexpr, NIBBLE_ORDER: tl.constexpr):
        amax = tl.max(tl.abs(x), axis=1)
        inv = 127.0 / tl.maximum(amax, 1e-30)  # a vector of zeros rounds to zeros
        # + 1.5 * 2^23 rounds to an integer in the float's low bits
        q = (x * inv[:, None] + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
        b = q & 0xFF
        if NIBBLE_ORDER:  # input 8j + 2t + e -> byte t of word 4e + j: the even inputs' 4 words, then the odd's
            b = tl.permute(tl.reshape(b, (V, 4, 4, 2)), (0, 3, 1, 2))  # (v, e, j, t)
            words = tl.sum(b << (8 * tl.arange(0, 4))[None, None, None, :], axis=3)
        else:  # input 4j + t -> byte t of word j
            words = tl.sum(tl.reshape(b, (V, 8, 4)) << (8 * tl.arange(0, 4))[None, None, :], axis=2)
        return tl.reshape(words, (V, 8)), amax * (1.0 / 127.0), q

    return round_vectors


@functools.cache
def store_helper():
    """The Triton function with which a kernel hands over its row rounded (a RoundedX):
    store_rounded(x (V, 32) float32, v (V,) the vectors' indices in the row, v_ok, words_ptr,
    scales_ptr, V, NIBBLE_ORDER) rounds x with round_vectors and stores its words and scales."""
    global round_vectors, store_rounded
    import triton
    import triton.language as tl

    round_vectors = round_helper()

    @triton.jit
    def store_rounded(x, v, v_ok, words_ptr, scales_ptr, V: tl.constexpr, NIBBLE_ORDER: tl.constexpr):
        words, scales, _ = round_vectors(x, V, NIBBLE_ORDER)
        tl.store(words_ptr + v[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=v_ok[:, None])
        tl.store(scales_ptr + v, scales, mask=v_ok)

    return store_rounded


@functools.cache
def _kernel():
    global store_rounded
    import triton
    import triton.language as tl

    store_rounded = store_helper()

    @triton.jit
    def round_x_kernel(x_ptr, words_ptr, scales_ptr, vectors, NIBBLE_ORDER: tl.constexpr, BLOCK_V: tl.constexpr):
        v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = v < vectors
        x = tl.load(x_ptr + v[:, None] * 32 + tl.arange(0, 32)[None, :], mask=v_ok[:, None], other=0.0)
        store_rounded(x.to(tl.float32), v, v_ok, words_ptr, scales_ptr, BLOCK_V, NIBBLE_ORDER)

    return round_x_kernel


def empty_rounded(k: int, nibble_order: bool, dtype: torch.dtype, device) -> RoundedX:
    """A RoundedX of K inputs for a kernel to fill."""
    assert k % 32 == 0, k
    return RoundedX(torch.empty((k // 32, 1, 8), dtype=torch.int32, device=device),
                    torch.empty((k // 32, 1), dtype=torch.float32, device=device), nibble_order, dtype)


def rounded_args(like: torch.Tensor, nibble_order: bool | None):
    """For a kernel that may hand over its one output row (shaped and typed as `like`, (1, K))
    rounded: (the RoundedX it fills, or None; its words and scales pointers; the kernel's ROUND:
    0 not rounding, 1 in the nibbles' word order, 2 in int8's)."""
    if nibble_order is None:
        return None, like, like, 0  # pointers the kernel never reads
    assert like.shape[0] == 1 and like.shape[1] % 32 == 0, tuple(like.shape)
    rounded = empty_rounded(like.shape[1], nibble_order, like.dtype, like.device)
    return rounded, rounded.words, rounded.scales, 1 if nibble_order else 2


def round_x(x: torch.Tensor, nibble_order: bool) -> RoundedX:
    """x (1, K), K a multiple of 32, rounded by a launch of its own."""
    assert x.dim() == 2 and x.shape[0] == 1 and x.stride(1) == 1
    out = empty_rounded(x.shape[1], nibble_order, x.dtype, x.device)
    vectors = x.shape[1] // 32
    _kernel()[(-(-vectors // 32),)](x, out.words, out.scales, vectors, NIBBLE_ORDER=nibble_order, BLOCK_V=32,
                                    num_warps=4)
    return out
