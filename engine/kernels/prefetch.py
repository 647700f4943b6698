"""Weights requested into L2 by a kernel that runs before the projection reading them.

A one-row decode step leaves the memory idle while its small kernels run (the attention, the
norms, the activation): a kernel there may request the next projection's packed weights into L2
with bulk prefetches (cp.async.bulk.prefetch, carried out by the copy engine), each of its
programs a share, so that the projection finds them in L2. Weights are never written by a
kernel, so the requests go out before any PDL wait. A hint: nothing reads its result, and
Triton's interpreter (which has no PTX) gets no requests.
"""

from __future__ import annotations

import functools

import torch

from engine.options import triton_interpreting

MAX_REGIONS = 3  # tensors a launch requests: a packed weight's bytes, its scales, its offsets
tl = bulk_l2 = None  # bound by bulk_l2_helper(): request_regions calls bulk_l2 by this module's name


@functools.cache
def bulk_l2_helper():
    global tl, bulk_l2
    import triton
    import triton.language as tl

    @triton.jit
    def bulk_l2(base, nbytes, part, parts, LANES: tl.constexpr):
        """Part `part` of `parts` of the nbytes at base (16-byte aligned) requested into L2: one
        bulk prefetch a lane, each a multiple of 16 bytes."""
        share = (nbytes + parts * LANES * 16 - 1) // (parts * LANES * 16) * 16
        off = (part * LANES + tl.arange(0, LANES)).to(tl.int64) * share
        n = tl.minimum(nbytes - off, share)
        n = tl.where(n > 0, (n + 15) // 16 * 16, 0).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [base.to(tl.pointer_type(tl.uint8)) + off, n], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def request_regions(pf0_ptr, pf0_bytes, pf1_ptr, pf1_bytes, pf2_ptr, pf2_bytes, part, parts,
                        PF: tl.constexpr, LANES: tl.constexpr):
        """This program's share of up to three regions (PF of them)."""
        if PF > 0:
            bulk_l2(pf0_ptr, pf0_bytes, part, parts, LANES)
        if PF > 1:
            bulk_l2(pf1_ptr, pf1_bytes, part, parts, LANES)
        if PF > 2:
            bulk_l2(pf2_ptr, pf2_bytes, part, parts, LANES)

    return bulk_l2, request_regions


def prefetch_args(tensors: tuple, filler: torch.Tensor, lanes: int) -> dict:
    """A launch's prefetch arguments: pf{i}_ptr / pf{i}_bytes for up to MAX_REGIONS CUDA tensors
    (16-byte aligned; `filler` stands in for the rest), PF (how many) and LANES (the program's
    threads: one request each)."""
    regions = [t for t in tensors if t.is_cuda and t.data_ptr() % 16 == 0][:MAX_REGIONS]
    if triton_interpreting():
        regions = []
    pairs = [(t, t.numel() * t.element_size()) for t in regions] + [(filler, 0)] * (MAX_REGIONS - len(regions))
    args = {f"pf{i}{name}": v for i, pair in enumerate(pairs) for name, v in zip(("_ptr", "_bytes"), pair)}
    return dict(args, PF=len(regions), PF_LANES=lanes)
