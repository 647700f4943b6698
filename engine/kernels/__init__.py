"""Triton kernels for decode and verify, each beside its plain-torch reference.

Every module exports `op(...)` (Triton, CUDA) and `op_ref(...)` (torch, any device) with
one signature. Triton is imported inside functions, so these modules import without it.
"""

from __future__ import annotations

import functools
import os


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1).

    The interpreter computes bf16/fp16 arithmetic wrongly (it has no native bf16), so
    kernels upcast every operand to fp32 before any arithmetic or dot when this is set.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def num_sms(device) -> int:
    """The device's streaming multiprocessors (132 on an H200; also what CPU launches assume)."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


# Programmatic dependent launch (Hopper and later): each of our kernels, launched with the PDL
# attribute, may start while the kernel before it in the stream finishes, and waits
# (griddepcontrol.wait) before its first memory access until that kernel's writes are visible.
# It hides part of the launch latency between the small kernels of a decode step: on an H200 the
# demo model's plain decode ran 1.22x faster with it and the 8B shape's 1.02x, with the same
# tokens (benchmarks/results/h200_pdl_*_session7.json). On by default; LOCALCHAT_PDL=0 (or
# set_pdl(False)) launches plainly.
_pdl_override: bool | None = None


def set_pdl(on: bool | None) -> None:
    """Tests and benchmarks: force PDL on or off (None: LOCALCHAT_PDL decides, on unless "0"). Kernels captured
    in CUDA graphs keep the setting they were captured with."""
    global _pdl_override
    _pdl_override = on
    _pdl_supported.cache_clear()


@functools.cache
def _pdl_supported(device_index: int) -> bool:
    try:
        import dataclasses

        import torch
        import triton.language as tl
        from triton.backends.nvidia.compiler import CUDAOptions

        return (torch.cuda.get_device_capability(device_index)[0] >= 9 and hasattr(tl.extra.cuda, "gdc_wait")
                and "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)})
    except Exception:  # no CUDA backend, an older Triton: launch as before
        return False


def pdl_args(device) -> dict:
    """Launch arguments for one of our kernels on `device`: its USE_PDL constexpr, and Triton's
    launch_pdl option when PDL is on."""
    on = _pdl_override if _pdl_override is not None else os.environ.get("LOCALCHAT_PDL", "1") != "0"
    if not on or getattr(device, "type", None) != "cuda" or triton_interpreting():
        return {"USE_PDL": False}
    if not _pdl_supported(device.index if device.index is not None else 0):
        return {"USE_PDL": False}
    return {"USE_PDL": True, "launch_pdl": True}
