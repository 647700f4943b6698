"""Triton kernels for decode and verify, each beside its plain-torch reference.

Every module exports `op(...)` (Triton, CUDA) and `op_ref(...)` (torch, any device) with
one signature. Triton is imported inside functions, so these modules import without it.
"""

from __future__ import annotations

import os


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1).

    The interpreter computes bf16/fp16 arithmetic wrongly (it has no native bf16), so
    kernels upcast every operand to fp32 before any arithmetic or dot when this is set.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
