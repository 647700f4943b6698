"""AWQ and GPTQ 4-bit weights: how their int32 words hold the nibbles, and the torch reference
that decodes them.

Both store, for a linear layer of K inputs and N outputs, 4-bit values q with a zero point z and
a scale s per group of G consecutive inputs (G = K: one group, per channel), and mean
w[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]. They differ in how the nibbles sit in the words:

- AWQ (AutoAWQ's GEMM format, `WQLinear_GEMM`): qweight (K, N/8) and qzeros (K/G, N/8) pack 8
  outputs per int32 along N, interleaved: bits 4i..4i+3 of word c hold output 8c + AWQ_ORDER[i],
  AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]. Zero points are stored as they are.
- GPTQ (AutoGPTQ's `QuantLinear` and GPTQModel's "gptq" format): qweight (K/8, N) packs 8 inputs
  per int32 along K in order (bits 4j..4j+3 of row r hold input 8r + j); qzeros (K/G, N/8) pack
  8 outputs along N in order. The original format stores z - 1 (AutoGPTQ's `pack` subtracts 1,
  its dequantization adds it back: `zero_offset` 1); GPTQModel's "gptq_v2" stores z (offset 0).

scales are (K/G, N) in both. The arithmetic runs in float32, where (q - z) * s is exact for
fp16 or bf16 scales: the reference equals the formula, not a half-precision rounding of it.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output 8c + AWQ_ORDER[i] sits in nibble i of word c
# The nibble that holds output 8c + j: AWQ_ORDER's inverse permutation.
AWQ_NIBBLE_OF = tuple(AWQ_ORDER.index(j) for j in range(8))  # (0, 4, 1, 5, 2, 6, 3, 7)


def _shifts(words: torch.Tensor) -> torch.Tensor:
    return torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)  # nibble i: bits 4i..4i+3


def unpack_along_n(words: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """(R, N/8) int32 -> (R, N) values 0-15: column 8c + j is nibble j of word c, or nibble
    AWQ_NIBBLE_OF[j] when `interleaved` (AWQ)."""
    nibbles = (words.unsqueeze(-1) >> _shifts(words)) & 0x0F  # (R, N/8, 8); the mask drops the sign fill
    if interleaved:
        nibbles = nibbles[..., list(AWQ_NIBBLE_OF)]
    return nibbles.reshape(words.shape[0], -1)


def unpack_along_k(words: torch.Tensor) -> torch.Tensor:
    """(K/8, N) int32 -> (K, N) values 0-15: nibble j of row r is row 8r + j."""
    nibbles = (words.unsqueeze(1) >> _shifts(words).reshape(1, 8, 1)) & 0x0F  # (K/8, 8, N)
    return nibbles.reshape(-1, words.shape[1])


def _dequantize(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """q (K, N), zeros and scales (K/G, N) -> (N, K) float32, nn.Linear's layout."""
    group = torch.arange(q.shape[0], device=q.device) // group_size  # the group of each input k
    return ((q - zeros[group]).float() * scales.float()[group]).t().contiguous()


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
                   ) -> torch.Tensor:
    q = unpack_along_n(qweight, interleaved=True)
    return _dequantize(q, unpack_along_n(qzeros, interleaved=True), scales, group_size)


def dequantize_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                    zero_offset: int) -> torch.Tensor:
    """zero_offset: 1 for the original format (zeros stored minus 1), 0 for gptq_v2. The stored
    nibble is masked before the offset is added, as AutoGPTQ does: a stored 15 means 16."""
    return _dequantize(unpack_along_k(qweight), unpack_along_n(qzeros) + zero_offset, scales, group_size)
