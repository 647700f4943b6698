"""compressed-tensors integer weights (llm-compressor's W4A16, W8A16 and W8A8 checkpoints), and
the torch reference that decodes them.

A quantized linear of K inputs and N outputs holds signed integers q (int4: -8..7, int8:
-128..127), a scale per group of G consecutive inputs of an output row (G = K: per channel or per
tensor) and, where the quantization was asymmetric, a signed zero point zp the same way; the
weight is w[n, k] = (q[n, k] - zp[n, k // G]) * scale[n, k // G] (no zero point: zp = 0).

- `pack-quantized`: `weight_packed` int32 (N, ceil(K * bits / 32)) holds q + 2^(bits - 1)
  along K, 32 / bits a word, input k in word k // (32 / bits) at bit (k % (32 / bits)) * bits (the
  first input lowest), zero-padded past K (`weight_shape` says K). A packed zero point
  (compressed-tensors 0.9.4 on) is int32 (ceil(N / (32 / bits)), G), zp + 2^(bits - 1) packed the
  same way along N; earlier ones stored it as int8 (N, G).
- `int-quantized` and `naive-quantized`: `weight` int8 (N, K), q itself, one a byte.
- `weight_scale` (N, G), (N, 1) or one value; `weight_g_idx` (K,), the group of each input, is
  taken only when it is k // G (act-order checkpoints reorder the groups: refused).

The arithmetic runs in float32, where (q - zp) * scale is exact for fp16 or bf16 scales.
"""

from __future__ import annotations

import torch

from engine.errors import ModelLoadError


def unpack_words(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """(R, W) int32 -> (R, count) int16 stored values: 32 / bits a word along its last axis, the
    first lowest; the padding past `count` dropped."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # the mask drops the sign fill
    return values.reshape(words.shape[0], words.shape[1] * per)[:, :count].to(torch.int16)


def int_values(data: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """(N, K) int16 q: from packed words (int32) or one a byte (int8)."""
    if data.dtype == torch.int8:
        return data.to(torch.int16)
    return unpack_words(data, bits, k) - (1 << (bits - 1))


def dequantize_int(data: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, group_size: int,
                   bits: int, k: int) -> torch.Tensor:
    """(N, K) float32: (q - zp) * scale per group of `group_size` inputs. scales and zeros (N, K / G)."""
    q = int_values(data, bits, k).float()
    if zeros is not None:
        q = q - zeros.float().repeat_interleave(group_size, dim=1)
    return q * scales.float().repeat_interleave(group_size, dim=1)


def zero_points(zp: torch.Tensor, bits: int, n: int, groups: int, where: str) -> torch.Tensor:
    """(N, G) int8 signed zero points from either stored form (packed along N, or one a byte)."""
    per = 32 // bits
    if zp.dtype == torch.int32 and zp.dim() == 2 and tuple(zp.shape) == (-(-n // per), groups):
        return (unpack_words(zp.t().contiguous(), bits, n) - (1 << (bits - 1))).t().to(torch.int8).contiguous()
    if zp.numel() == 1:  # per tensor: one value, never packed
        return zp.reshape(1, 1).to(torch.int8).expand(n, groups).contiguous()
    if zp.dtype in (torch.int8, torch.int16, torch.int32) and tuple(zp.shape) == (n, groups):
        return zp.to(torch.int8)
    raise ModelLoadError(f"{where}.weight_zero_point is {str(zp.dtype).removeprefix('torch.')} of shape "
                         f"{tuple(zp.shape)}; expected int32 ({-(-n // per)}, {groups}) packed or int8 ({n}, {groups})")
