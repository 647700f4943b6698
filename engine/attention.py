"""Attention over the static KV cache: SDPA for eager forwards, a position-masked op for graphs."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.kernels.attention import decode_attention_ref, decode_attention_sdpa


def attention_eager(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    start_pos: int, scale: float) -> torch.Tensor:
    """q: (T, Hq, D) for positions start_pos..start_pos+T-1, whose K/V are already in the cache.

    k_cache, v_cache: (S_max, Hkv, D). Returns (T, Hq, D). Only the filled part of the
    cache is read; the host knows its length, so this path is for eager forwards.
    """
    T = q.shape[0]
    end = start_pos + T
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, Hq, T, D)
    kh = k_cache[:end].transpose(0, 1).unsqueeze(0)  # (1, Hkv, end, D)
    vh = v_cache[:end].transpose(0, 1).unsqueeze(0)
    gqa = q.shape[1] != k_cache.shape[1]
    if T == 1:
        out = F.scaled_dot_product_attention(qh, kh, vh, scale=scale, enable_gqa=gqa)
    elif start_pos == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        # Query row i sits at position start_pos + i and sees keys 0..start_pos + i.
        rows = torch.arange(T, device=q.device)[:, None] + start_pos
        mask = torch.arange(end, device=q.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)


# Packed forwards avoid the cuDNN backend: it builds a plan per new shape, and a pack of chat
# conversations brings a new length almost every call (train-draft's teacher features).
_PACKED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
PAD_SLACK = 1.25  # a group of similar lengths pads to at most this many times its real tokens
PAD_SLACK_CUDA = 2.5


@functools.lru_cache(maxsize=64)
def _pack_plan(lengths: tuple[int, ...], device: torch.device) -> list[tuple]:
    """Groups of similar-length segments, each run as one padded causal batch: per group
    (gather (n, L) token index, padded rows that hold real tokens, their token indices).
    On CUDA a group may pad more (PAD_SLACK_CUDA): there the cost of a packed forward is the
    host's dispatch of some 40 operations per group and layer (about 14,000 for a pack of 22
    conversations at 1.25), and padded attention over a few more positions costs little."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    slack = PAD_SLACK_CUDA if device.type == "cuda" else PAD_SLACK
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g and (len(g) + 1) * lengths[g[0]] <= slack * (sum(lengths[j] for j in g) + lengths[i]):
            g.append(i)
        else:
            groups.append([i])
    plan = []
    for g in groups:
        L = lengths[g[0]]
        # Padding repeats a segment's last token: it sits after every real query, so the causal
        # mask keeps it out of every row that is kept.
        gather = [[starts[i] + min(j, lengths[i] - 1) for j in range(L)] for i in g]
        rows = [r * L + j for r, i in enumerate(g) for j in range(lengths[i])]
        dst = [starts[i] + j for i in g for j in range(lengths[i])]
        plan.append(tuple(torch.tensor(x, dtype=torch.long).to(device) for x in (gather, rows, dst)))
    return plan


# On CUDA a pack runs as one variable-length causal flash attention over cumulative sequence
# starts (one call per layer, GQA native), instead of a padded batch per group of similar
# lengths (some 40 host operations per group and layer). If the kernel refuses (an older torch
# or GPU), the reason is kept here and the padded groups serve from then on.
_VARLEN_FAILED: str | None = None


def varlen_fallback() -> str | None:
    """Why packed forwards fell back to padded attention in this process (None: they did not)."""
    return _VARLEN_FAILED


USE_VARLEN = True


def _varlen_ok(q: torch.Tensor) -> bool:
    return (USE_VARLEN and _VARLEN_FAILED is None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[-1] <= 256 and q.shape[-1] % 8 == 0)


@functools.lru_cache(maxsize=64)
def _cu_seqlens(lengths: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, int]:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32).to(device), max(lengths)


def attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: tuple[int, ...],
                     scale: float) -> torch.Tensor:
    """q: (T, Hq, D), k, v: (T, Hkv, D) of packed independent sequences of `lengths` (summing to
    T); causal inside each, nothing across. Returns (T, Hq, D). On CUDA (fp16/bf16): one
    variable-length flash call. Elsewhere sequences of similar length run as one right-padded
    causal batch (a few fused-kernel calls per pack instead of one per
    sequence); a T x T block-diagonal mask would send the whole pack to a masked backend that
    computes every cross-sequence score."""
    assert sum(lengths) == q.shape[0], "segment lengths must sum to the tokens"
    if _varlen_ok(q):
        try:
            cu, longest = _cu_seqlens(tuple(lengths), q.device)
            return torch.ops.aten._flash_attention_forward(
                q, k.contiguous(), v.contiguous(), cu, cu, longest, longest, 0.0, True, False, scale=scale)[0]
        except torch.cuda.OutOfMemoryError:
            raise  # the padded groups would need more memory, not less
        except (RuntimeError, TypeError) as e:  # a torch or GPU whose flash kernel refuses: padded groups from now on
            global _VARLEN_FAILED
            _VARLEN_FAILED = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    G = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for gather, rows, dst in _pack_plan(tuple(lengths), q.device):
        n, L = gather.shape
        qg = q[gather].transpose(1, 2)  # (n, Hq, L, D)
        kg, vg = k[gather], v[gather]  # (n, L, Hkv, D)
        if G > 1:  # repeated heads keep the flash kernel eligible
            kg, vg = kg.repeat_interleave(G, dim=2), vg.repeat_interleave(G, dim=2)
        with sdpa_kernel(_PACKED_BACKENDS):
            o = F.scaled_dot_product_attention(qg, kg.transpose(1, 2), vg.transpose(1, 2), is_causal=True,
                                               scale=scale)
        out.index_copy_(0, dst, o.transpose(1, 2).reshape(n * L, *q.shape[1:]).index_select(0, rows))
    return out


def attention_masked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, visible: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """q: (T, Hq, D); visible: (T, S) bool, which of cache rows 0..S-1 each row sees (every row
    sees one at least: its own). Returns (T, Hq, D). SDPA over the first S rows (eager steps)."""
    S = visible.shape[1]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k_cache[:S].transpose(0, 1), v_cache[:S].transpose(0, 1),
                                         attn_mask=visible, scale=scale, enable_gqa=q.shape[1] != k_cache.shape[1])
    return out.transpose(0, 1).contiguous()


MAX_KERNEL_ROWS = 16  # the decode/verify kernel serves up to this many query rows


def attend(q, k_cache, v_cache, positions, start_pos: int | None, scale: float, kernel,
           own_slots: torch.Tensor | None = None, visible: torch.Tensor | None = None,
           slot_map: torch.Tensor | None = None, map_base: torch.Tensor | None = None) -> torch.Tensor:
    """One call site for every attention over the cache.

    Decode and verify rows go through `kernel` (the Triton op on CUDA) in eager and graph
    mode alike, so a captured graph computes exactly what the eager step computes. Longer
    prefills use SDPA over the filled part; without a kernel (CPU) eager steps use SDPA too.
    own_slots: where each row's own K/V is when not at its position (ForwardBatch.slots).
    visible: (T, S) the cache rows each row sees, when positions do not say it (a draft tree's
    rows, ForwardBatch.visible): SDPA with that mask, eager only. slot_map, map_base: the same
    rows for the kernel (ForwardBatch.slot_map), each with the bits of its token's decode step
    (without a kernel, the reference over the whole cache: no host read, any number of rows).
    """
    if slot_map is not None:
        if kernel is None:  # the CPU's eager run of a captured tree step's body (the reference's mask)
            return decode_attention_ref(q, k_cache, v_cache, positions, scale, own_slots, slot_map, map_base)
        assert q.shape[0] <= MAX_KERNEL_ROWS, "the decode kernel serves 16 rows at most"
        return kernel(q, k_cache, v_cache, positions, scale, own_slots, slot_map=slot_map, map_base=map_base)
    if visible is not None:
        return attention_masked(q, k_cache, v_cache, visible, scale)
    if kernel is not None and q.shape[0] <= MAX_KERNEL_ROWS:
        return kernel(q, k_cache, v_cache, positions, scale, own_slots)
    if own_slots is not None:
        return decode_attention_sdpa(q, k_cache, v_cache, positions, scale, own_slots)
    if start_pos is not None:
        return attention_eager(q, k_cache, v_cache, start_pos, scale)
    return decode_attention_ref(q, k_cache, v_cache, positions, scale)
