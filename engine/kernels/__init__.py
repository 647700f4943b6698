"""Triton kernels for decode and verify, each beside its plain-torch reference.

Every module exports `op(...)` (Triton, CUDA) and `op_ref(...)` (torch, any device) with
one signature. Triton is imported inside functions, so these modules import without it.
"""

from __future__ import annotations

import functools

from engine.options import triton_interpreting  # noqa: F401  (the launchers import it from here)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def num_sms(device) -> int:
    """The device's streaming multiprocessors (132 on an H200; also what CPU launches assume)."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


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


# Programmatic dependent launch (Hopper and later): each of our kernels, launched with the PDL
# attribute, may start while the kernel before it in the stream finishes, and waits
# (griddepcontrol.wait) before its first memory access until that kernel's writes are visible.
# It hides part of the launch latency between the small kernels of a decode step (figures:
# docs/performance.md). Every launcher takes `pdl` (KernelOptions.pdl, which Ops binds); kernels
# captured in CUDA graphs keep the setting they were captured with.
def pdl_args(device, on: bool = True) -> dict:
    """Launch arguments for one of our kernels on `device`: its USE_PDL constexpr, and Triton's
    launch_pdl option when PDL is on (`on`, and supported there)."""
    if not on or getattr(device, "type", None) != "cuda" or triton_interpreting():
        return {"USE_PDL": False}
    if not _pdl_supported(device.index if device.index is not None else 0):
        return {"USE_PDL": False}
    return {"USE_PDL": True, "launch_pdl": True}
