"""Triton kernels == their torch references; the references == independent formulas.

Kernel tests run on CUDA (marked gpu), and on CPU through Triton's interpreter only when
triton is importable and LOCALCHAT_TRITON_INTERPRET=1 (slow; not for CI). That switch sets
TRITON_INTERPRET=1 for the whole pytest process, so run it on this file alone. The
interpreter rounds fp32 -> bf16 by truncation (the GPU rounds to nearest even), so bf16
tolerances allow a few bf16 ulps there and exact-rounding checks run on CUDA only. Triton
3.6's interpreter needs numpy below 2.4 for the attention kernels (it converts one-element
arrays with int(), which newer numpy refuses).

    LOCALCHAT_TRITON_INTERPRET=1 python -m pytest tests/engine/test_kernels.py  # ~80 s, 2 cores
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)

from engine.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
import engine.kernels.attention as attention_module  # noqa: E402
from engine.kernels.attention import (decode_attention, decode_attention_ref, decode_attention_sdpa,  # noqa: E402
                                     rope_decode_attention)
from engine.kernels.norm import (add_rms_norm, add_rms_norm_ref, embed_pair_norm, embed_pair_norm_ref,  # noqa: E402
                                 embed_rows, embed_rows_ref)
from engine.kernels.pick import greedy_next, greedy_next_ref, rows_argmax, rows_argmax_ref  # noqa: E402
from engine.kernels.rope import rope_and_cache, rope_and_cache_ref  # noqa: E402
from speculative.chain_state import ChainState  # noqa: E402
from speculative.kernels.draft_pick import argmax_pick, argmax_pick_ref, draft_pick, draft_pick_ref  # noqa: E402
from speculative.kernels.greedy_verify import greedy_verify, greedy_verify_ref  # noqa: E402
from tests.tree_rows import tree_layout  # noqa: E402

DEVICES = [
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")),
]
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=1e-2, rtol=1.6e-2)}
# The interpreter truncates at each rounding to bf16: a kernel that rounds 3 times in a row
# (add_rms_norm) may land 3 ulps away.
INTERPRETER_BF16_TOL = dict(atol=3e-2, rtol=3e-2)


def tol(device: str, dtype: torch.dtype) -> dict:
    return INTERPRETER_BF16_TOL if device == "cpu" and dtype == torch.bfloat16 else TOL[dtype]

# (T, Hq, Hkv, D, S_max): GQA ratios 1, 3, 4; D 64, 96, 128; S_max past 8192 switches split size.
ATTN_SHAPES = [
    (1, 4, 4, 64, 64),
    (1, 9, 3, 64, 300),
    (6, 9, 3, 64, 257),
    (16, 9, 3, 64, 130),
    (1, 32, 8, 128, 1024),
    (16, 32, 8, 128, 512),
    (4, 12, 4, 96, 200),
    (2, 8, 2, 128, 8200),
]
POSITION_KINDS = ["zero", "last", "random", "verify"]


def make_positions(kind: str, num_rows: int, max_seq_len: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "zero":  # row 0 at position 0, the rest right after it (a fresh prompt)
        pos = torch.arange(num_rows)
    elif kind == "last":  # the last row at S_max - 1
        pos = torch.arange(max_seq_len - num_rows, max_seq_len)
    elif kind == "random":  # unordered, any length, including 0 and S_max - 1 when T > 2
        pos = torch.randint(0, max_seq_len, (num_rows,), generator=gen)
        if num_rows > 2:
            pos[0], pos[-1] = 0, max_seq_len - 1
    else:  # a verify window: k + 1 consecutive rows somewhere in the middle
        start = int(torch.randint(0, max_seq_len - num_rows + 1, (1,), generator=gen))
        pos = torch.arange(start, start + num_rows)
    return pos.to(torch.int32)


def attention_naive(q, k_cache, v_cache, positions, scale):
    """One (row, head) at a time over rows 0..position, in float64."""
    num_rows, num_heads, _ = q.shape
    group = num_heads // k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for t in range(num_rows):
        n = int(positions[t]) + 1
        for h in range(num_heads):
            k = k_cache[:n, h // group].double()
            v = v_cache[:n, h // group].double()
            out[t, h] = torch.softmax(k @ q[t, h].double() * scale, dim=0) @ v
    return out


# ---- references, always run (CPU, no triton) ----------------------------------------------


@pytest.mark.parametrize("shape", ATTN_SHAPES[:7])
@pytest.mark.parametrize("kind", POSITION_KINDS)
def test_attention_ref_matches_naive(shape, kind):
    gen = torch.Generator().manual_seed(0)
    num_rows, num_heads, num_kv_heads, head_dim, max_seq_len = shape
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen)
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen)
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen)
    positions = make_positions(kind, num_rows, max_seq_len, gen)
    scale = head_dim**-0.5
    want = attention_naive(q, k_cache, v_cache, positions, scale).float()
    torch.testing.assert_close(decode_attention_ref(q, k_cache, v_cache, positions, scale), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(decode_attention_sdpa(q, k_cache, v_cache, positions, scale), want, atol=1e-5, rtol=1e-5)


def test_rope_ref_matches_hf_formula():
    gen = torch.Generator().manual_seed(0)
    num_rows, num_heads, head_dim, max_pos = 3, 4, 64, 50
    inv_freq = 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cos_sin_cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen)
    k = torch.randn(num_rows, 2, head_dim, generator=gen)
    v = torch.randn(num_rows, 2, head_dim, generator=gen)
    positions = torch.tensor([0, 17, max_pos - 1])
    k_cache, v_cache = torch.zeros(max_pos, 2, head_dim), torch.zeros(max_pos, 2, head_dim)
    q_rot = rope_and_cache_ref(q, k, v, cos_sin_cache, positions, k_cache, v_cache)
    emb = torch.cat([freqs, freqs], dim=-1)[positions][:, None, :]  # HF: cos/sin of (T, 1, D)

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    torch.testing.assert_close(q_rot, q * emb.cos() + rotate_half(q) * emb.sin())
    torch.testing.assert_close(k_cache[positions], k * emb.cos() + rotate_half(k) * emb.sin())
    assert torch.equal(v_cache[positions], v)
    assert k_cache[1:17].abs().sum() == 0  # rows not in positions stay untouched


def test_norm_and_activation_refs():
    gen = torch.Generator().manual_seed(0)
    x, residual, weight = (torch.randn(3, 16, generator=gen) for _ in range(3))
    normed, new_residual = add_rms_norm_ref(x, residual, weight[0], 1e-6)
    h = x + residual
    torch.testing.assert_close(normed, h / h.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * weight[0])
    assert torch.equal(new_residual, h)
    assert add_rms_norm_ref(x, None, weight[0], 1e-6)[1] is x
    torch.testing.assert_close(silu_and_mul_ref(torch.cat([x, h], -1)), x * torch.sigmoid(x) * h)


# ---- kernels vs references (CUDA, or the CPU interpreter on request) -----------------------


def _three_programs(num_splits: int, num_kv_heads: int, num_sms: int, rows: int = 1) -> int:
    return min(num_splits, 3)


def _few_programs(*args, **kwargs):
    """decode_attention with 3 split programs per kv head, each looping over several splits."""
    saved, attention_module._split_programs = attention_module._split_programs, _three_programs
    try:
        return decode_attention(*args, **kwargs)
    finally:
        attention_module._split_programs = saved


ATTN_OPS = [pytest.param(decode_attention, id="split+reduce"), pytest.param(_few_programs, id="3_programs")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ATTN_SHAPES)
@pytest.mark.parametrize("kind", POSITION_KINDS)
@pytest.mark.parametrize("op", ATTN_OPS)
def test_decode_attention(device, dtype, shape, kind, op):
    gen = torch.Generator().manual_seed(sum(shape) * 10 + POSITION_KINDS.index(kind))
    num_rows, num_heads, num_kv_heads, head_dim, max_seq_len = shape
    # q as a strided view into a fused qkv output, as the model hands it over.
    qkv = torch.randn(num_rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    q = qkv.to(device, dtype)[:, : num_heads * head_dim].view(num_rows, num_heads, head_dim)
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    positions = make_positions(kind, num_rows, max_seq_len, gen).to(device)
    scale = head_dim**-0.5
    out = op(q, k_cache, v_cache, positions, scale)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out, decode_attention_ref(q, k_cache, v_cache, positions, scale), **tol(device, dtype))


def _alternative_rows(k: int, alts: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A verify step's positions and own slots: the chain at n..n+k, then `alts` alternatives
    for each draft at that draft's position, their K/V in the rows after the chain's."""
    chain = ChainState(k, 10**6, device, alts)
    return chain.row_pos + n, chain.row_slots + n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(9, 3, 64, 130), (32, 8, 128, 300), (4, 4, 64, 8200)])
@pytest.mark.parametrize("k,alts,n", [(5, 2, 100), (3, 1, 0), (4, 3, 61)])
def test_decode_attention_own_slots(device, dtype, shape, k, alts, n):
    """Rows whose own K/V sit elsewhere than their position (alternative draft tokens)."""
    gen = torch.Generator().manual_seed(sum(shape) + k + n)
    num_heads, num_kv_heads, head_dim, max_seq_len = shape
    positions, slots = _alternative_rows(k, alts, n, "cpu")
    q = torch.randn(len(positions), num_heads, head_dim, generator=gen).to(device, dtype)
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    positions, slots = positions.to(device), slots.to(device)
    scale = head_dim**-0.5
    want = decode_attention_ref(q, k_cache, v_cache, positions, scale, slots)
    torch.testing.assert_close(decode_attention(q, k_cache, v_cache, positions, scale, own_slots=slots), want,
                               **tol(device, dtype))
    torch.testing.assert_close(decode_attention(q, k_cache, v_cache, positions, scale, invariant=True,
                                                own_slots=slots, per_token=True), want, **tol(device, dtype))
    torch.testing.assert_close(decode_attention_sdpa(q, k_cache, v_cache, positions, scale, slots), want,
                               **tol(device, dtype))
    # the reference itself: an alternative row sees the rows before its position, then its own
    r = k + 1 + alts  # draft 2's first alternative (or a later one)
    p, own = int(positions[r]), int(slots[r])
    keys = torch.cat([k_cache[:p], k_cache[own:own + 1]]).float()
    vals = torch.cat([v_cache[:p], v_cache[own:own + 1]]).float()
    g = num_heads // num_kv_heads
    kk, vv = keys.repeat_interleave(g, dim=1), vals.repeat_interleave(g, dim=1)  # (p+1, Hq, D)
    w = torch.einsum("hd,shd->hs", q[r].float(), kk).mul(scale).softmax(-1)
    torch.testing.assert_close(want[r].float(), torch.einsum("hs,shd->hd", w, vv), **tol(device, dtype))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (32, 8)])
def test_alternative_rows_have_the_bits_of_their_decode_step(num_heads, num_kv_heads, per_token):
    """An alternative's verify row, its K/V in a row of its own, has the bits of the 1-row
    decode step of its token with its K/V at its position (and so does every chain row): the
    verify step reproduces plain decoding whichever token the target takes."""
    gen = torch.Generator().manual_seed(num_heads)
    head_dim, max_seq_len, n, k, alts = 64, 512, 300, 5, 2
    positions, slots = (x.cuda() for x in _alternative_rows(k, alts, n, "cpu"))
    rows = len(positions)
    q = torch.randn(rows, num_heads, head_dim, generator=gen).cuda().bfloat16()
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).cuda().bfloat16()
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).cuda().bfloat16()
    out = decode_attention(q, k_cache, v_cache, positions, 0.125, invariant=True, own_slots=slots,
                           per_token=per_token)
    for r in range(rows):
        p, own = int(positions[r]), int(slots[r])
        kc, vc = k_cache.clone(), v_cache.clone()
        kc[p], vc[p] = k_cache[own], v_cache[own]  # where plain decoding would have put them
        single = decode_attention(q[r:r + 1], kc, vc, positions[r:r + 1], 0.125, invariant=True,
                                  per_token=per_token)
        assert torch.equal(out[r:r + 1], single), r


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (32, 8), (16, 16)])
def test_decode_attention_invariant_rows(num_heads, num_kv_heads, per_token):
    """invariant=True: each row of a 2..16-row call has the bits of the 1-row call for its
    query (the verify step of speculation must reproduce plain decoding)."""
    gen = torch.Generator().manual_seed(num_heads)
    head_dim, max_seq_len, start = 64, 512, 300
    q = torch.randn(16, num_heads, head_dim, generator=gen).cuda().bfloat16()
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).cuda().bfloat16()
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).cuda().bfloat16()
    positions = torch.arange(start, start + 16, device="cuda")
    singles = torch.cat([decode_attention(q[i:i + 1], k_cache, v_cache, positions[i:i + 1], 0.125, invariant=True,
                                          per_token=per_token) for i in range(16)])
    for rows in (2, 6, 9, 16):
        out = decode_attention(q[:rows], k_cache, v_cache, positions[:rows], 0.125, invariant=True,
                               per_token=per_token)
        assert torch.equal(out, singles[:rows]), rows
    torch.testing.assert_close(singles, decode_attention_ref(q, k_cache, v_cache, positions, 0.125),
                               **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("op", ATTN_OPS)
def test_decode_attention_graph_replay(op):
    """Captured once, replayed with new positions and cache contents: equals eager."""
    gen = torch.Generator().manual_seed(0)
    num_rows, num_heads, num_kv_heads, head_dim, max_seq_len = 6, 32, 8, 128, 4096
    q = torch.zeros(num_rows, num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.zeros(max_seq_len, num_kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.zeros(num_rows, device="cuda", dtype=torch.int64)
    op(q, k_cache, v_cache, positions, 0.1)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(q, k_cache, v_cache, positions, 0.1)
    for step in range(20):
        q.copy_(torch.randn(q.shape, generator=gen))
        k_cache.copy_(torch.randn(k_cache.shape, generator=gen))
        v_cache.copy_(torch.randn(v_cache.shape, generator=gen))
        positions.copy_(make_positions(POSITION_KINDS[step % 4], num_rows, max_seq_len, gen))
        graph.replay()
        torch.testing.assert_close(out, decode_attention_ref(q, k_cache, v_cache, positions, 0.1), **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rope_then_attention_graph_replay():
    """One layer's decode/verify step captured once (rope writes the cache, attention
    reads it), replayed with new inputs and positions: equals the references."""
    gen = torch.Generator().manual_seed(1)
    num_rows, num_heads, num_kv_heads, head_dim, max_seq_len = 6, 9, 3, 64, 2048
    freqs = torch.outer(torch.arange(max_seq_len).float(), 1.0 / 10000 ** (torch.arange(0, head_dim, 2) / head_dim))
    cos_sin_cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).cuda()
    qkv = torch.zeros(num_rows, (num_heads + 2 * num_kv_heads) * head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = (x.view(num_rows, -1, head_dim) for x in qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1))
    k_cache = torch.zeros(max_seq_len, num_kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.arange(num_rows, device="cuda", dtype=torch.int32)

    def step():
        return decode_attention(rope_and_cache(q, k, v, cos_sin_cache, positions, k_cache, v_cache),
                                k_cache, v_cache, positions, head_dim**-0.5)

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(10):
        qkv.copy_(torch.randn(qkv.shape, generator=gen))
        k_cache.copy_(torch.randn(k_cache.shape, generator=gen))
        v_cache.copy_(torch.randn(v_cache.shape, generator=gen))
        positions.copy_(make_positions("verify", num_rows, max_seq_len, gen))
        want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
        q_rot = rope_and_cache_ref(q, k, v, cos_sin_cache, positions, want_k_cache, want_v_cache)
        want = decode_attention_ref(q_rot, want_k_cache, want_v_cache, positions, head_dim**-0.5)
        graph.replay()
        torch.testing.assert_close(k_cache, want_k_cache, **TOL[torch.bfloat16])
        assert torch.equal(v_cache, want_v_cache)
        torch.testing.assert_close(out, want, **TOL[torch.bfloat16])


def _rope_case(device, dtype, num_heads, num_kv_heads, head_dim, max_seq_len, gen):
    """One decode row's unrotated q, k, v (views of a fused qkv), a RoPE table and a filled cache."""
    inv_freq = 1.0 / 500000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)
    qkv = torch.randn(1, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(device, dtype)
    q, k, v = (x.view(1, -1, head_dim) for x in qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1))
    caches = [torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype) for _ in range(2)]
    return q, k, v, cos_sin, caches


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(9, 3, 64, 300), (32, 8, 128, 1024), (4, 4, 64, 64), (12, 4, 96, 200),
                                   (8, 2, 128, 8200)])
@pytest.mark.parametrize("where", ["zero", "split_edge", "last", "slot"])
@pytest.mark.parametrize("invariant", [False, True, "per_token"])
@pytest.mark.parametrize("programs", [None, 3], ids=["programs", "3_programs"])
def test_rope_decode_attention_equals_rope_then_attention(device, dtype, shape, where, invariant, programs,
                                                          monkeypatch):
    """The one-row step with RoPE and the cache write inside the attention kernel gives exactly
    the bits of rope_and_cache then decode_attention: the output and both caches (3 programs per
    kv head: each loops over its splits, and the one with the position's split writes the cache)."""
    if programs == 3:
        monkeypatch.setattr(attention_module, "_split_programs", _three_programs)
    num_heads, num_kv_heads, head_dim, max_seq_len = shape
    gen = torch.Generator().manual_seed(sum(shape) + len(where))
    q, k, v, cos_sin, caches = _rope_case(device, dtype, num_heads, num_kv_heads, head_dim, max_seq_len, gen)
    pos = {"zero": 0, "split_edge": 64 if max_seq_len > 64 else 63, "last": max_seq_len - 1,
           "slot": max_seq_len // 2}[where]
    positions = torch.tensor([pos], device=device)
    slots = torch.tensor([max_seq_len - 1], device=device) if where == "slot" else None
    k_a, v_a = caches[0].clone(), caches[1].clone()
    k_b, v_b = caches[0].clone(), caches[1].clone()
    scale = head_dim ** -0.5
    per_token, invariant = invariant == "per_token", bool(invariant)
    q_rot = rope_and_cache(q, k, v, cos_sin, positions, k_a, v_a, slots)
    want = decode_attention(q_rot, k_a, v_a, positions, scale, invariant=invariant, own_slots=slots,
                            per_token=per_token)
    got = rope_decode_attention(q, k, v, cos_sin, positions, k_b, v_b, scale, invariant=invariant, slots=slots,
                                per_token=per_token)
    assert got.shape == want.shape and got.dtype == dtype
    assert torch.equal(k_b, k_a) and torch.equal(v_b, v_a)
    assert torch.equal(got, want)
    ref_k, ref_v = caches[0].clone(), caches[1].clone()
    ref_q = rope_and_cache_ref(q, k, v, cos_sin, positions, ref_k, ref_v, slots)
    torch.testing.assert_close(got, decode_attention_ref(ref_q, ref_k, ref_v, positions, scale, slots),
                               **tol(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(9, 3, 64, 300), (32, 8, 128, 1100), (4, 4, 96, 64)])
@pytest.mark.parametrize("order", [True, False])
def test_one_row_attention_hands_over_its_output_rounded(device, shape, order):
    """round_for: the one-row step's attention also rounds its output for o_proj in the merge's
    launch: the same output and caches as without, and the words and scales round_x gives that
    row, bit for bit (head sizes 64, 128 and 96, whose last vector of each 128-wide tile lies past
    the head); decode_attention alike."""
    from engine.kernels.rounded_x import round_x

    num_heads, num_kv_heads, head_dim, max_seq_len = shape
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(sum(shape))
    q, k, v, cos_sin, caches = _rope_case(device, dtype, num_heads, num_kv_heads, head_dim, max_seq_len, gen)
    positions = torch.tensor([max_seq_len // 2], device=device)
    k_a, v_a = caches[0].clone(), caches[1].clone()
    k_b, v_b = caches[0].clone(), caches[1].clone()
    scale = head_dim ** -0.5
    want = rope_decode_attention(q, k, v, cos_sin, positions, k_a, v_a, scale)
    got, rounded = rope_decode_attention(q, k, v, cos_sin, positions, k_b, v_b, scale, round_for=order)
    assert torch.equal(got, want) and torch.equal(k_b, k_a) and torch.equal(v_b, v_a)
    expect = round_x(got.reshape(1, -1), order)
    assert rounded.shape == (1, num_heads * head_dim) and rounded.nibble_order == order
    assert torch.equal(rounded.words, expect.words) and torch.equal(rounded.scales, expect.scales)
    plain, rounded = decode_attention(q, k_a, v_a, positions, scale, round_for=order)
    assert torch.equal(plain, decode_attention(q, k_a, v_a, positions, scale))
    expect = round_x(plain.reshape(1, -1), order)
    assert torch.equal(rounded.words, expect.words) and torch.equal(rounded.scales, expect.scales)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(9, 3, 64, 300), (8, 2, 128, 1100)])
@pytest.mark.parametrize("rows", ["2", "6_across_a_split", "16_at_the_end", "6_with_alternatives"])
@pytest.mark.parametrize("invariant", [True, "per_token"])
@pytest.mark.parametrize("programs", [None, 3], ids=["programs", "3_programs"])
def test_rope_decode_attention_of_a_verify_steps_rows_equals_rope_then_attention(device, shape, rows, invariant,
                                                                                programs, monkeypatch):
    """A verify step's rows (consecutive positions, and runners-up at the positions of the drafts
    they stand beside, their K/V at slots of their own) with RoPE and the cache writes inside the
    attention kernel: exactly the bits of rope_and_cache then decode_attention, output and caches.
    Each row reads the keys of the rows before it, which the same launch writes."""
    if programs == 3:
        monkeypatch.setattr(attention_module, "_split_programs", _three_programs)
    num_heads, num_kv_heads, head_dim, max_seq_len = shape
    dtype = torch.bfloat16
    count = int(rows.split("_")[0])
    first = {"2": 5, "6_across_a_split": 61, "16_at_the_end": max_seq_len - 16 - 8,
             "6_with_alternatives": 125}[rows]
    positions = list(range(first, first + count))
    slots = None
    if rows.endswith("alternatives"):  # two runners-up of draft 1 and one of draft 3, at scratch rows
        positions += [first + 1, first + 1, first + 3]
        slots = torch.tensor(list(range(first, first + count)) + [max_seq_len - 3, max_seq_len - 2, max_seq_len - 1],
                             device=device)
    T = len(positions)
    gen = torch.Generator().manual_seed(sum(shape) + T)
    _, _, _, cos_sin, caches = _rope_case(device, dtype, num_heads, num_kv_heads, head_dim, max_seq_len, gen)
    qkv = torch.randn(T, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(device, dtype)
    q, k, v = (x.view(T, -1, head_dim) for x in qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1))
    positions = torch.tensor(positions, device=device)
    k_a, v_a = caches[0].clone(), caches[1].clone()
    k_b, v_b = caches[0].clone(), caches[1].clone()
    scale = head_dim ** -0.5
    per_token = invariant == "per_token"
    q_rot = rope_and_cache(q, k, v, cos_sin, positions, k_a, v_a, slots)
    want = decode_attention(q_rot, k_a, v_a, positions, scale, invariant=True, own_slots=slots, per_token=per_token)
    got = rope_decode_attention(q, k, v, cos_sin, positions, k_b, v_b, scale, invariant=True, slots=slots,
                                per_token=per_token)
    assert torch.equal(k_b, k_a) and torch.equal(v_b, v_a)
    assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rope_decode_attention_graph_replay():
    """A captured one-row step with RoPE inside attention, replayed 50 times with new inputs and
    positions (the cache it writes is read by the next replay): equals the two-launch path."""
    gen = torch.Generator().manual_seed(5)
    num_heads, num_kv_heads, head_dim, max_seq_len = 32, 8, 128, 1024
    q, k, v, cos_sin, caches = _rope_case("cuda", torch.bfloat16, num_heads, num_kv_heads, head_dim, max_seq_len, gen)
    k_cache, v_cache = caches[0].clone(), caches[1].clone()
    k_want, v_want = caches[0].clone(), caches[1].clone()
    positions = torch.zeros(1, dtype=torch.long, device="cuda")
    rope_decode_attention(q, k, v, cos_sin, positions, k_cache, v_cache, 0.1)  # compile outside the capture
    k_cache.copy_(caches[0])
    v_cache.copy_(caches[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rope_decode_attention(q, k, v, cos_sin, positions, k_cache, v_cache, 0.1)
    for step in range(50):
        q.copy_(torch.randn(q.shape, generator=gen))
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
        positions.fill_(300 + step)
        graph.replay()
        want = decode_attention(rope_and_cache(q, k, v, cos_sin, positions, k_want, v_want), k_want, v_want,
                                positions, 0.1)
        assert torch.equal(out, want)
        assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (5, 576), (16, 4096), (3, 1000)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(device, dtype, shape, with_residual):
    gen = torch.Generator().manual_seed(shape[0] * shape[1])
    x, residual = (torch.randn(shape, generator=gen).to(device, dtype) * 3 for _ in range(2))
    weight = (1 + 0.1 * torch.randn(shape[1], generator=gen)).to(device, dtype)
    residual = residual if with_residual else None
    normed, new_residual = add_rms_norm(x, residual, weight, 1e-5)
    want_normed, want_residual = add_rms_norm_ref(x, residual, weight, 1e-5)
    assert normed.dtype == dtype and new_residual.dtype == dtype
    torch.testing.assert_close(normed, want_normed, **tol(device, dtype))
    if residual is None:
        assert new_residual is x
    elif device == "cuda":  # same rounding as the model's `x + residual`
        assert torch.equal(new_residual, want_residual)
    else:
        torch.testing.assert_close(new_residual, want_residual, **tol(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("hidden", [576, 4096, 3584])
@pytest.mark.parametrize("order", [True, False])
def test_add_rms_norm_rounded_hands_over_its_output_rounded(device, hidden, order):
    """One row's norm that also rounds its output for the projection after it: the same normed
    row and stream as add_rms_norm, and the words and scales quantize_rows gives that row, bit
    for bit (hidden sizes below, at and past a power of two)."""
    from engine.kernels.norm import add_rms_norm_rounded
    from engine.kernels.packed_rows import quantize_rows
    from engine.kernels.rounded_x import round_x

    gen = torch.Generator().manual_seed(hidden)
    dtype = torch.bfloat16
    x, residual = (torch.randn(1, hidden, generator=gen).to(device, dtype) * 3 for _ in range(2))
    x[0, 64:96] = 0.0
    residual[0, 64:96] = 0.0  # a vector of zeros
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype)
    for res in (residual, None):
        normed, stream, rounded = add_rms_norm_rounded(x, res, weight, 1e-5, order)
        want_normed, want_stream = add_rms_norm(x, res, weight, 1e-5)
        assert torch.equal(normed, want_normed) and torch.equal(stream, want_stream)
        want = round_x(normed, order)
        assert rounded.nibble_order == order and rounded.dtype == dtype and rounded.shape == (1, hidden)
        assert torch.equal(rounded.words, want.words) and torch.equal(rounded.scales, want.scales)
        words, scales, _ = quantize_rows(normed, order)  # the batch-invariant kernel's layout, one row
        assert torch.equal(words, want.words) and torch.equal(scales, want.scales)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inter", [1536, 14336, 1056])
@pytest.mark.parametrize("order", [True, False])
def test_silu_and_mul_rounded_hands_over_its_output_rounded(device, inter, order):
    """One row's activation that also rounds its output for the down projection: the same row as
    silu_and_mul, and the words and scales quantize_rows gives it, bit for bit (the last program's
    columns in part past the end)."""
    from engine.kernels.activation import silu_and_mul_rounded
    from engine.kernels.rounded_x import round_x

    gen = torch.Generator().manual_seed(inter)
    gate_up = (torch.randn(1, 2 * inter, generator=gen) * 4).to(device, torch.bfloat16)
    act, rounded = silu_and_mul_rounded(gate_up, order)
    assert torch.equal(act, silu_and_mul(gate_up))
    want = round_x(act, order)
    assert rounded.shape == (1, inter) and rounded.nibble_order == order
    assert torch.equal(rounded.words, want.words) and torch.equal(rounded.scales, want.scales)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (6, 576), (3, 1000), (2, 4096)])
def test_embed_pair_norm(device, dtype, shape):
    gen = torch.Generator().manual_seed(shape[0] + shape[1])
    rows, hidden = shape
    table = (torch.randn(97, hidden, generator=gen) * 2).to(device, dtype)
    b = (torch.randn(rows, hidden, generator=gen) * 5).to(device, dtype)
    wa, wb = ((1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype) for _ in range(2))
    ids = torch.randint(0, 97, (rows,), generator=gen)
    ids[0] = 96  # the table's last row
    ids = ids.to(device)
    out = embed_pair_norm(ids, table, b, wa, wb, 1e-5, 1e-6)
    want = embed_pair_norm_ref(ids, table, b, wa, wb, 1e-5, 1e-6)
    assert out.shape == (rows, 2 * hidden) and out.dtype == dtype
    # the reference is add_rms_norm_ref on each half, checked against the Llama formula above
    torch.testing.assert_close(want[:, hidden:], add_rms_norm_ref(b, None, wb, 1e-6)[0], rtol=0, atol=0)
    torch.testing.assert_close(out, want, **tol(device, dtype))
    if device == "cuda":  # each half rounds as add_rms_norm does
        assert torch.equal(out[:, hidden:], add_rms_norm(b, None, wb, 1e-6)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 6, 16])
def test_embed_pair_norm_takes_rows_looked_up_already(device, dtype, rows):
    """ids None: the table is the rows' embeddings themselves (a packed table's lookup): the bits
    of the launch that looks the same rows up by index, with and without b_rows."""
    hidden = 576
    gen = torch.Generator().manual_seed(rows + 7)
    table = (torch.randn(97, hidden, generator=gen) * 2).to(device, dtype)
    b = (torch.randn(rows, hidden, generator=gen) * 5).to(device, dtype)
    wa, wb = ((1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype) for _ in range(2))
    ids = torch.randint(0, 97, (rows,), generator=gen).to(device)
    looked_up = table.index_select(0, ids)
    out = embed_pair_norm(None, looked_up, b, wa, wb, 1e-5, 1e-6)
    assert torch.equal(out, embed_pair_norm(ids, table, b, wa, wb, 1e-5, 1e-6))
    assert torch.equal(embed_pair_norm_ref(None, looked_up, b, wa, wb, 1e-5, 1e-6),
                       embed_pair_norm_ref(ids, table, b, wa, wb, 1e-5, 1e-6))
    picks = torch.zeros(rows, dtype=torch.long, device=device)
    got, gathered = embed_pair_norm(None, looked_up, b, wa, wb, 1e-5, 1e-6, b_rows=picks)
    want, want_rows = embed_pair_norm(ids, table, b, wa, wb, 1e-5, 1e-6, b_rows=picks)
    assert torch.equal(got, want) and torch.equal(gathered, want_rows)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,source", [(1, 1), (4, 4), (6, 36), (3, 5)])
def test_embed_pair_norm_reads_b_through_row_indices(device, dtype, rows, source):
    """b_rows: a tree level's rows read their parents' states from the level before's output (a
    row read twice, rows out of order); the result is the same launch on b[b_rows], bit for bit,
    and the gathered rows come back as read."""
    hidden = 576
    gen = torch.Generator().manual_seed(rows * 31 + source)
    table = (torch.randn(97, hidden, generator=gen) * 2).to(device, dtype)
    b = (torch.randn(source, hidden, generator=gen) * 5).to(device, dtype)
    wa, wb = ((1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype) for _ in range(2))
    ids = torch.randint(0, 97, (rows,), generator=gen).to(device)
    picks = torch.randint(0, source, (rows,), generator=gen)
    picks[-1] = source - 1
    if rows > 1:
        picks[0] = picks[1]  # siblings share a parent
    picks = picks.to(device)
    out, gathered = embed_pair_norm(ids, table, b, wa, wb, 1e-5, 1e-6, b_rows=picks)
    assert torch.equal(gathered, b.index_select(0, picks))
    assert torch.equal(out, embed_pair_norm(ids, table, b.index_select(0, picks), wa, wb, 1e-5, 1e-6))
    want, want_rows = embed_pair_norm_ref(ids, table, b, wa, wb, 1e-5, 1e-6, b_rows=picks)
    assert torch.equal(want_rows, gathered)
    torch.testing.assert_close(out, want, **tol(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 576), (16, 576), (3, 1000), (2, 4096)])
def test_embed_rows(device, dtype, shape):
    gen = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    rows, hidden = shape
    table = torch.randn(301, hidden, generator=gen).to(device, dtype)
    ids = torch.randint(0, 301, (rows,), generator=gen)
    ids[-1] = 300  # the table's last row
    ids = ids.to(device)
    assert torch.equal(embed_rows(ids, table), embed_rows_ref(ids, table))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 2048, 6144, 49152 + 5])
@pytest.mark.parametrize("r", [0, 4])
def test_argmax_pick(device, dtype, vocab, r):
    """Over row r of a (6, vocab) tensor, a view that starts past the first row for r = 4."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(6, vocab, generator=gen).to(device, dtype)
    offsets = torch.randint(-3, 1000, (vocab,), generator=gen).to(device)
    for case in ("random", "tie", "last", "neg"):
        x = logits.clone()
        if case == "tie":  # equal maxima: the lowest index wins, as torch.argmax
            x[r, vocab // 3] = x[r, vocab - 1] = x[r].max() + 1
        elif case == "last":
            x[r, vocab - 1] = x[r].max() + 1
        elif case == "neg":
            x = -x.abs() - 1
        for offs in (offsets, None):
            got = argmax_pick(x[r:r + 1], offs, torch.full((3,), -1, dtype=torch.long, device=device)[1:2])
            want = argmax_pick_ref(x[r:r + 1], offs, torch.full((1,), -1, dtype=torch.long, device=device))
            i = int(x[r].float().argmax())
            assert int(got) == int(want) == i + (int(offsets[i]) if offs is not None else 0), (case, offs is None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 7), (9, 4096), (16, 4097), (5, 49152 + 5)])
@pytest.mark.parametrize("parts", [False, True], ids=["a program a row", "rows in parts"])
def test_rows_argmax(device, dtype, rows, vocab, parts, monkeypatch):
    """A greedy tree step's target choices: each row's argmax as greedy_next takes it (ties to the
    lowest index, also across the loop's blocks; all -inf; NaN ignored), read from a view with
    rows apart by a longer stride; torch's argmax of the fp32 values where no NaN is present.
    Rows in parts (KernelOptions.tree_level_split): parts of 1,024 logits here (4096 + 1: a last
    part of one; 49,157: 13 parts of 4,096), the ties above across parts' edges."""
    import engine.kernels.pick as pick

    monkeypatch.setattr(pick, "_ROWS_CHUNK", 1024)
    gen = torch.Generator().manual_seed(rows * 131 + vocab)
    wide = torch.randn(rows, vocab + 3, generator=gen).to(device, dtype)
    x = wide[:, :vocab]
    top = float(x.float().max()) + 1
    x[0, vocab - 1] = top  # the last index
    if rows > 2:
        x[1, vocab // 3] = x[1, vocab - 1] = top  # a tie: the lower index
        x[2] = float("-inf")  # all -inf: index 0
    if rows > 4:
        if vocab > 4096:
            x[3, 4095] = x[3, 4096] = top  # a tie across the loop's first block edge
        x[4, 0] = float("nan")
        x[4, vocab // 2] = top
    got = rows_argmax(x, parts=parts)
    want = x.float().nan_to_num(nan=float("-inf")).argmax(-1)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    for r in range(rows):  # each row as the decode graph's pick takes it
        nxt, ids = torch.zeros(1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device)
        greedy_next(x[r:r + 1].contiguous(), nxt, ids, torch.zeros(1, dtype=torch.long, device=device))
        assert int(nxt[0]) == int(got[r]), r
    if rows <= 4:  # no NaN: torch's argmax agrees
        assert torch.equal(rows_argmax_ref(x), got)
    out = torch.full((rows,), -1, dtype=torch.long, device=device)
    assert rows_argmax(x, out, parts=parts) is out and torch.equal(out, got)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 2048, 2049, 49152 + 5, 128256, 2048 * 512 + 3])
def test_greedy_next(device, dtype, vocab):
    """The decode graph's chaining: argmax over chunks, ties to the lowest index across chunk
    edges, all -inf, NaN ignored; next token and input id written, position moved on. Run
    twice per case: the arrival counter is left ready for the next launch."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(2, vocab, generator=gen).to(device, dtype)
    for case in ("random", "tie", "tie_edge", "last", "neg", "ninf", "nan"):
        x = logits.clone()
        top = x[1].max() + 1
        if case == "tie":
            x[1, vocab // 3] = x[1, vocab - 1] = top
        elif case == "tie_edge" and vocab > 2048:  # the same maximum in two chunks
            x[1, 2047] = x[1, 2048] = x[1, vocab - 1] = top
        elif case == "last":
            x[1, vocab - 1] = top
        elif case == "neg":
            x = -x.abs() - 1
        elif case == "ninf":
            x[1] = float("-inf")
        elif case == "nan":
            x[1, 0] = float("nan")
            x[1, vocab // 2] = top
        want = int(x[1].float().nan_to_num(nan=float("-inf")).argmax())
        for _ in range(2):
            nxt, ids = torch.full((2,), -1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device)
            pos = torch.tensor([41], dtype=torch.long, device=device)
            greedy_next(x[1:2], nxt[1:], ids, pos)
            assert int(nxt[1]) == int(ids[0]) == want and int(nxt[0]) == -1 and int(pos[0]) == 42, case
        if case != "nan":  # torch.argmax would pick the NaN
            ref = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(2)] + [torch.tensor([41], device=device)]
            greedy_next_ref(x[1:2], *ref)
            assert [int(t[0]) for t in ref] == [want, want, 42]


def _chain_case(k: int, vocab: int, agree: int, n: int, last_pos: int, device, dtype, gen):
    """Logits whose row argmaxes match the first `agree` drafts, and a chain at n."""
    logits = torch.randn(k + 1, vocab, generator=gen).to(dtype)
    choice = logits.float().argmax(-1)  # after rounding: bf16 may tie where fp32 did not
    drafts = choice[:-1].clone()
    if agree < k:  # draft agree + 1 differs from the target's choice there
        drafts[agree] = (choice[agree] + 1) % vocab
    chain = ChainState(k, last_pos, device)
    chain.ids.copy_(torch.cat([torch.tensor([vocab - 1]), drafts]).to(device))
    chain.n.fill_(n)
    chain.result.fill_(-1), chain.window.fill_(-1), chain.draft_pos.fill_(-1)
    return logits.to(device), chain, choice


def test_greedy_verify_ref_accepts_like_greedy_accept():
    """The reference against speculative.verify.greedy_accept, field by field."""
    from speculative.verify import greedy_accept

    gen = torch.Generator().manual_seed(5)
    for k, agree in [(5, 0), (5, 2), (5, 5), (1, 0), (1, 1), (15, 7)]:
        logits, chain, choice = _chain_case(k, 300, agree, 40, 42, "cpu", torch.float32, gen)
        drafts = chain.ids[1:].clone()
        a, nxt = greedy_accept(drafts, choice)
        assert int(a) == agree
        greedy_verify_ref(logits, chain)
        assert chain.result.tolist() == [agree, int(nxt)] + drafts.tolist()
        assert chain.window.tolist() == drafts.tolist()[:agree] + [int(nxt)] * (k + 1 - agree)
        assert int(chain.accepted) == agree and int(chain.n) == 40 + agree + 1 and int(chain.ids[0]) == int(nxt)
        assert chain.ids[1:].tolist() == drafts.tolist()
        assert chain.draft_pos.tolist() == [min(40 + agree + 1 + i, 42) for i in range(k + 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,vocab", [(5, 49152), (1, 7), (15, 6144), (3, 2049)])
def test_greedy_verify(device, dtype, k, vocab):
    gen = torch.Generator().manual_seed(k * vocab)
    for agree in sorted({0, 1, k // 2, k}):
        for repeat in range(2):  # twice: the launch leaves its counter ready for the next
            logits, chain, _ = _chain_case(k, vocab, agree, 100, 100 + k // 2, device, dtype, gen)
            want = ChainState(k, chain.last_pos, device)
            for name in ("ids", "n", "result", "window", "draft_pos"):
                getattr(want, name).copy_(getattr(chain, name))
            greedy_verify(logits, chain)
            greedy_verify_ref(logits, want)
            for name in ("ids", "n", "result", "window", "accepted", "draft_pos"):
                assert torch.equal(getattr(chain, name), getattr(want, name)), (name, agree)
            assert int(chain.accepted) == agree


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 6144, 49152 + 5])
@pytest.mark.parametrize("alts", [1, 2, 3])
def test_draft_pick(device, dtype, vocab, alts):
    gen = torch.Generator().manual_seed(vocab + alts)
    logits = torch.randn(3, vocab, generator=gen).to(device, dtype)
    offsets = torch.randint(-3, 1000, (vocab,), generator=gen).to(device)
    for case in ("random", "tie", "neg"):
        x = logits.clone()
        if case == "tie":  # equal values: the lowest index first, in the kernel and the reference
            top = x[2].max() + 1
            x[2, vocab - 1] = x[2, vocab // 2] = x[2, 1] = top
        elif case == "neg":
            x = -x.abs() - 1
        for offs in (offsets, None):
            buf = torch.full((8,), -1, dtype=torch.long, device=device)
            want = torch.full((8,), -1, dtype=torch.long, device=device)
            draft_pick(x[2:3], offs, buf[0:1], buf[2:2 + alts])  # the last row: a view past the first
            draft_pick_ref(x[2:3], offs, want[0:1], want[2:2 + alts])
            assert torch.equal(buf, want), (case, offs is None)
            order = x[2].float().sort(descending=True, stable=True).indices[:alts + 1]
            ids = order + (offs[order] if offs is not None else 0)
            assert buf[0:1].tolist() + buf[2:2 + alts].tolist() == ids.tolist()
            if case == "tie":
                assert order.tolist()[:3] == [1, vocab // 2, vocab - 1][:alts + 1]


def _alternatives_case(k: int, alts, vocab: int, agree: int, hit: int | None, n: int, device, dtype, gen):
    """_chain_case plus alternatives (alts: a count for every draft, or one for each): alternative
    `hit` for draft agree + 1 equals the target's choice there (None: none does)."""
    counts = (alts,) * k if isinstance(alts, int) else alts
    rows = k + 1 + sum(counts)
    logits = torch.randn(rows, vocab, generator=gen).to(dtype)
    choice = logits.float().argmax(-1)
    drafts = choice[:k].clone()
    if agree < k:
        drafts[agree] = (choice[agree] + 1) % vocab
    alt = []  # never the target's choice at their draft's place, but for the hit
    for d, m in enumerate(counts):
        for i in range(m):
            t = int(drafts[d] + 2 + i) % vocab
            alt.append((t + 1) % vocab if t == int(choice[d]) else t)
    if hit is not None:
        assert agree < k and hit < counts[agree]
        alt[sum(counts[:agree]) + hit] = int(choice[agree])
    chain = ChainState(k, n + 3, device, alts)
    chain.ids.copy_(torch.cat([torch.tensor([vocab - 1]), drafts, torch.tensor(alt, dtype=torch.long)]).to(device))
    chain.n.fill_(n)
    for t in (chain.result, chain.window, chain.draft_pos, chain.state_rows, chain.kv_move):
        t.fill_(-1)
    return logits.to(device), chain, choice


def test_greedy_verify_ref_accepts_an_alternative():
    """Hand-built: draft 3 rejected, its second alternative is the target's choice there."""
    gen = torch.Generator().manual_seed(9)
    k, alts, n = 5, 2, 40
    logits, chain, choice = _alternatives_case(k, alts, 300, 2, 1, n, "cpu", torch.float32, gen)
    drafts, alt = chain.ids[1:k + 1].clone(), chain.ids[k + 1:].view(k, alts).clone()
    greedy_verify_ref(logits, chain)
    row = k + 1 + 2 * alts + 1  # the verify row of draft 3's second alternative
    nxt = int(choice[row])  # the target's choice after it
    assert int(chain.accepted) == 3 and int(chain.n) == n + 4 and int(chain.ids[0]) == nxt
    took = drafts.tolist()[:2] + [int(alt[2, 1])]
    assert chain.result.tolist() == [3, nxt] + took + drafts.tolist()[3:]
    assert chain.window.tolist() == took + [nxt] * 3
    assert chain.state_rows.tolist() == [0, 1, 2, row, 4, 5]
    assert chain.kv_move.tolist() == [n + row, n + 3]  # its K/V moves to its position n + 3
    # no alternative matches: the chain's rule, and a move of row n + a + 1 onto itself
    logits, chain, choice = _alternatives_case(k, alts, 300, 2, None, n, "cpu", torch.float32, gen)
    drafts = chain.ids[1:k + 1].clone()
    greedy_verify_ref(logits, chain)
    assert int(chain.accepted) == 2 and chain.result.tolist() == [2, int(choice[2])] + drafts.tolist()
    assert chain.state_rows.tolist() == list(range(k + 1)) and chain.kv_move.tolist() == [n + 3, n + 3]
    # an alternative equal to the choice at another depth is not taken
    logits, chain, choice = _alternatives_case(k, alts, 300, 2, None, n, "cpu", torch.float32, gen)
    chain.ids[k + 1 + 1 * alts] = choice[2]  # draft 2's alternative says what draft 3's place wants
    greedy_verify_ref(logits, chain)
    assert int(chain.accepted) == 2


def test_take_alternative_ref_moves_kv_and_gathers_states():
    from speculative.kernels.alternative import take_alternative_ref

    gen = torch.Generator().manual_seed(3)
    k_all, v_all = torch.randn(2, 4, 20, 3, 8, generator=gen).unbind(0)
    k0, v0 = k_all.clone(), v_all.clone()
    states = torch.randn(16, 12, generator=gen)
    out = torch.empty(6, 12)
    rows = torch.tensor([0, 1, 2, 13, 4, 5])
    take_alternative_ref(k_all, v_all, torch.tensor([15, 7]), states, rows, out)
    assert torch.equal(out, states[rows])
    assert torch.equal(k_all[:, 7], k0[:, 15]) and torch.equal(v_all[:, 7], v0[:, 15])
    k0[:, 7], v0[:, 7] = k0[:, 15], v0[:, 15]
    assert torch.equal(k_all, k0) and torch.equal(v_all, v0)  # nothing else moved


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(30, 3, 64, 1728), (2, 8, 128, 4096 * 3), (1, 1, 64, 100)])
def test_take_alternative(device, dtype, shape):
    from speculative.kernels.alternative import take_alternative, take_alternative_ref

    layers, heads, head_dim, width = shape
    gen = torch.Generator().manual_seed(sum(shape))
    caches = torch.randn(2, layers, 40, heads, head_dim, generator=gen).to(device, dtype)
    states = torch.randn(16, width, generator=gen).to(device, dtype)
    rows = torch.tensor([0, 1, 14, 3, 4, 5], device=device)
    for move in ([30, 12], [9, 9]):
        move = torch.tensor(move, device=device)
        got, want = caches.clone(), caches.clone()
        out, want_out = torch.empty(6, width, device=device, dtype=dtype), torch.empty(6, width, device=device, dtype=dtype)
        take_alternative(got[0], got[1], move, states, rows, out)
        take_alternative_ref(want[0], want[1], move, states, rows, want_out)
        assert torch.equal(got, want) and torch.equal(out, want_out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,alts,vocab", [(5, 2, 49152), (3, 1, 7), (4, 3, 6144), (1, 2, 300), (5, (3, 3, 2, 1, 1), 49152),
                                         (4, (0, 2, 0, 1), 6144)])
def test_greedy_verify_alternatives(device, dtype, k, alts, vocab):
    counts = (alts,) * k if isinstance(alts, int) else alts
    gen = torch.Generator().manual_seed(k * vocab + sum(counts))
    cases = [(agree, None) for agree in sorted({0, k // 2, k})]
    cases += [(a, h) for a in sorted({0, k - 1}) for h in sorted({0, counts[a] - 1}) if counts[a]]
    for agree, hit in cases:
        for repeat in range(2):  # twice: the launch leaves its counter ready for the next
            logits, chain, _ = _alternatives_case(k, alts, vocab, agree, hit, 100, device, dtype, gen)
            want = ChainState(k, chain.last_pos, device, alts)
            for name in ("ids", "n", "result", "window", "draft_pos", "state_rows", "kv_move"):
                getattr(want, name).copy_(getattr(chain, name))
            greedy_verify(logits, chain)
            greedy_verify_ref(logits, want)
            for name in ("ids", "n", "result", "window", "accepted", "draft_pos", "state_rows", "kv_move"):
                assert torch.equal(getattr(chain, name), getattr(want, name)), (name, agree, hit)
            assert int(chain.accepted) == agree + (hit is not None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1536), (3, 14336), (16, 1000)])
def test_silu_and_mul(device, dtype, shape):
    gen = torch.Generator().manual_seed(shape[1])
    gate_up = (torch.randn(shape[0], 2 * shape[1], generator=gen) * 4).to(device, dtype)
    out = silu_and_mul(gate_up)
    assert out.shape == (shape[0], shape[1]) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_ref(gate_up), **tol(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 9, 3, 64), (16, 32, 8, 128), (5, 12, 4, 96), (2, 4, 4, 64)])
@pytest.mark.parametrize("with_slots", [False, True])
def test_rope_and_cache(device, dtype, shape, with_slots):
    gen = torch.Generator().manual_seed(sum(shape))
    num_rows, num_heads, num_kv_heads, head_dim = shape
    max_pos = 64
    inv_freq = 1.0 / 500000 ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cos_sin_cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device)
    qkv = torch.randn(num_rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(device, dtype)
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k, v = (x.view(num_rows, -1, head_dim) for x in (q, k, v))
    positions = torch.randperm(max_pos, generator=gen)[:num_rows]
    positions[0] = max_pos - 1
    if num_rows > 1:
        positions[1] = 0
    positions = positions.to(device)
    caches = [torch.randn(max_pos, num_kv_heads, head_dim, generator=gen).to(device, dtype) for _ in range(2)]
    k_cache, v_cache = caches[0].clone(), caches[1].clone()
    want_k_cache, want_v_cache = caches[0].clone(), caches[1].clone()
    qkv_before = qkv.clone()
    slots = None
    if with_slots:  # cache rows other than the positions (a verify step's alternative tokens)
        slots = torch.randperm(max_pos, generator=gen)[:num_rows].to(device)
        positions[num_rows // 2:] = int(positions[0])  # positions may repeat; slots never do
    q_rot = rope_and_cache(q, k, v, cos_sin_cache, positions, k_cache, v_cache, slots)
    want_q = rope_and_cache_ref(q, k, v, cos_sin_cache, positions, want_k_cache, want_v_cache, slots)
    assert torch.equal(qkv, qkv_before)  # inputs untouched
    assert q_rot.shape == q.shape and q_rot.dtype == dtype
    torch.testing.assert_close(q_rot, want_q, **tol(device, dtype))
    torch.testing.assert_close(k_cache, want_k_cache, **tol(device, dtype))
    assert torch.equal(v_cache, want_v_cache)



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="PDL needs Hopper")
def test_every_kernel_with_pdl_equals_its_plain_launch():
    """Each kernel launched with programmatic dependent launch gives the bits of its plain
    launch, back to back in one stream (each reads what the one before it wrote)."""
    from engine.kernels.activation import silu_and_mul
    from engine.kernels.attention import decode_attention
    from engine.kernels.gemv import gemv, rms_norm_gemv, silu_mul_gemv
    from engine.kernels.norm import add_rms_norm
    from engine.kernels.rope import rope_and_cache

    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)

    def chain(pdl: bool):
        x = torch.randn(1, 576, generator=g, **bf)
        res = torch.randn(1, 576, generator=g, **bf)
        nw = torch.rand(576, generator=g, **bf)
        w_qkv = torch.randn(960, 576, generator=g, **bf) * 0.05
        k_cache = torch.zeros(256, 3, 64, **bf)
        v_cache = torch.zeros(256, 3, 64, **bf)
        cos_sin = torch.randn(256, 64, generator=g, device="cuda")
        pos = torch.tensor([17], device="cuda")
        qkv, h = rms_norm_gemv(x, res, nw, 1e-5, w_qkv, pdl=pdl)
        q, k, v = qkv.split([576, 192, 192], dim=-1)
        q = rope_and_cache(q.view(1, 9, 64), k.view(1, 3, 64), v.view(1, 3, 64), cos_sin, pos, k_cache, v_cache,
                           pdl=pdl)
        o = decode_attention(q, k_cache, v_cache, pos, 0.125, pdl=pdl)
        o2 = gemv(o.reshape(1, 576), torch.randn(576, 576, generator=g, **bf) * 0.05, pdl=pdl)
        normed, h2 = add_rms_norm(o2, h, nw, 1e-5, pdl=pdl)
        gate_up = gemv(normed, torch.randn(3072, 576, generator=g, **bf) * 0.05, pdl=pdl)
        act = silu_and_mul(gate_up, pdl=pdl)
        down = silu_mul_gemv(gate_up, torch.randn(576, 1536, generator=g, **bf) * 0.05, pdl=pdl)
        # the next layer's one-row step with RoPE inside attention, after the down projection
        qkv2 = gemv(down, w_qkv, pdl=pdl)
        q2, k2, v2 = qkv2.split([576, 192, 192], dim=-1)
        o3 = rope_decode_attention(q2.view(1, 9, 64), k2.view(1, 3, 64), v2.view(1, 3, 64), cos_sin, pos + 1,
                                   k_cache, v_cache, 0.125, pdl=pdl)
        return [qkv, h, q, k_cache, v_cache, o, o2, normed, h2, gate_up, act, down, qkv2, o3]

    outs = {}
    for on in (False, True):
        g.manual_seed(0)
        outs[on] = chain(on)
        torch.cuda.synchronize()
    for a, b in zip(outs[False], outs[True]):
        assert torch.equal(a, b)


def test_pdl_launch_arguments(monkeypatch):
    """PDL is on by default for a Hopper-class CUDA device whose Triton knows the option, and
    off on a CPU; a launch with pdl=False (KernelOptions.pdl, LOCALCHAT_PDL=0) launches plainly."""
    from engine import kernels

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr(kernels, "triton_interpreting", lambda: False)
    monkeypatch.setattr(kernels, "_pdl_supported", lambda index: True)
    assert kernels.pdl_args(cuda) == kernels.pdl_args(cuda, True) == {"USE_PDL": True, "launch_pdl": True}
    assert kernels.pdl_args(cuda, False) == {"USE_PDL": False}
    assert kernels.pdl_args(cpu) == {"USE_PDL": False}
    monkeypatch.setattr(kernels, "_pdl_supported", lambda index: False)  # older GPU or Triton
    assert kernels.pdl_args(cuda) == {"USE_PDL": False}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (8, 8)])
def test_tree_rows_read_through_a_slot_map_have_the_bits_of_their_decode_step(device, num_heads, num_kv_heads):
    """A draft tree's verify rows, its nodes' K/V wherever the tree put them: each row, reading
    its ancestors through a slot map (per_token, invariant), has the bits of the 1-row decode
    step of its token after its ancestors laid out at their positions, as plain decoding lays
    them out; and agrees with the reference over the same map."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(num_heads)
    head_dim, max_seq_len, base = 32, 256, 70  # committed prefix: positions 0..69 (a split boundary inside)
    # a tree of 7 nodes: parent of each (-1: the root, at position base); depth = position - base
    parents = [-1, 0, 0, 1, 1, 2, 4]
    node_slot = [base + 40 + 3 * i for i in range(len(parents))]  # scattered past the prefix
    depth, slot_map = tree_layout(parents, node_slot)
    rows = len(parents)
    q = torch.randn(rows, num_heads, head_dim, generator=gen).to(device, dtype)
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    positions = torch.tensor([base + d for d in depth], device=device)
    own = torch.tensor(node_slot, device=device)
    bases = torch.full((rows,), base, dtype=torch.int32, device=device)
    slot_map = slot_map.to(device)
    out = decode_attention(q, k_cache, v_cache, positions, 0.125, invariant=True, own_slots=own, per_token=True,
                           slot_map=slot_map, map_base=bases)
    ref = decode_attention_ref(q, k_cache, v_cache, positions, 0.125, own_slots=own, slot_map=slot_map, map_base=bases)
    torch.testing.assert_close(out.float(), ref.float(), **tol(device, dtype))
    for r in range(rows):
        kc, vc = k_cache.clone(), v_cache.clone()  # plain decoding's layout: each ancestor at its position
        for d in range(depth[r]):
            kc[base + d], vc[base + d] = k_cache[int(slot_map[r, d])], v_cache[int(slot_map[r, d])]
        kc[base + depth[r]], vc[base + depth[r]] = k_cache[node_slot[r]], v_cache[node_slot[r]]
        single = decode_attention(q[r:r + 1], kc, vc, positions[r:r + 1], 0.125, invariant=True, per_token=True)
        assert torch.equal(out[r:r + 1], single), r


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", ["7 nodes", "root only", "16 nodes across a split", "25 nodes across a split"])
@pytest.mark.parametrize("programs", [None, 3], ids=["programs", "3_programs"])
def test_rope_decode_attention_of_tree_rows_equals_rope_then_attention(device, tree, programs, monkeypatch):
    """A draft tree's rows read through a slot map (KernelOptions.rope_in_tree), each node's K/V at a
    scratch row of its own, with RoPE and the cache writes inside the attention kernel: exactly the
    bits of rope_and_cache then decode_attention over the same map, output and caches. A row's
    ancestors are rows of the same launch, written by the programs that read them."""
    if programs == 3:
        monkeypatch.setattr(attention_module, "_split_programs", _three_programs)
    num_heads, num_kv_heads, head_dim, max_seq_len = 9, 3, 64, 300
    parents = {"7 nodes": [-1, 0, 0, 1, 1, 2, 4], "root only": [-1],
               "16 nodes across a split": [-1, 0, 0, 0, 1, 1, 2, 3, 4, 4, 5, 6, 8, 8, 9, 12],
               # more rows than a chain's verify step: a tree's in one launch (routing.tree_rows)
               "25 nodes across a split": [-1] + [(i - 1) // 4 for i in range(1, 25)]}[tree]
    base = 70 if tree.startswith(("7", "root")) else 61  # depths from 61: a split at 64
    rows = len(parents)
    node_slot = [base + 100 + 5 * i for i in range(rows)]  # scattered past the prefix
    depth, slot_map = tree_layout(parents, node_slot)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(rows + base)
    _, _, _, cos_sin, caches = _rope_case(device, dtype, num_heads, num_kv_heads, head_dim, max_seq_len, gen)
    qkv = torch.randn(rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(device, dtype)
    q, k, v = (x.view(rows, -1, head_dim) for x in qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1))
    positions = torch.tensor([base + d for d in depth], device=device)
    slots = torch.tensor(node_slot, device=device)
    slot_map, bases = slot_map.to(device), torch.full((rows,), base, dtype=torch.int32, device=device)
    k_a, v_a = caches[0].clone(), caches[1].clone()
    k_b, v_b = caches[0].clone(), caches[1].clone()
    q_rot = rope_and_cache(q, k, v, cos_sin, positions, k_a, v_a, slots)
    want = decode_attention(q_rot, k_a, v_a, positions, 0.125, invariant=True, own_slots=slots, per_token=True,
                            slot_map=slot_map, map_base=bases)
    got = rope_decode_attention(q, k, v, cos_sin, positions, k_b, v_b, 0.125, invariant=True, slots=slots,
                                per_token=True, slot_map=slot_map, map_base=bases)
    assert torch.equal(k_b, k_a) and torch.equal(v_b, v_a)
    assert torch.equal(got, want)
    # the map's start as a tree level passes it: the cache length (int64) viewed at stride 0
    shared = torch.tensor(base, device=device).expand(rows)
    k_c, v_c = caches[0].clone(), caches[1].clone()
    got_shared = rope_decode_attention(q, k, v, cos_sin, positions, k_c, v_c, 0.125, invariant=True, slots=slots,
                                       per_token=True, slot_map=slot_map, map_base=shared)
    assert shared.stride(0) == 0 and torch.equal(got_shared, want) and torch.equal(k_c, k_a) and torch.equal(v_c, v_a)
    ref = decode_attention_ref(q_rot, k_a, v_a, positions, 0.125, own_slots=slots, slot_map=slot_map, map_base=bases)
    torch.testing.assert_close(got.float(), ref.float(), **tol(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_heads,num_kv_heads,rows", [(9, 3, 6), (9, 3, 16), (32, 8, 11)])
def test_rows_sharing_the_sms_keep_the_bits_of_the_one_row_step(device, num_heads, num_kv_heads, rows):
    """share_sms: a verify step's per-token rows run with fewer programs a kv head than the
    one-row step (each program taking several splits of a long cache), with the same bits as
    the one-row step and as each row given the one-row count; with RoPE in the kernel too."""
    from engine.kernels.attention import _split_programs

    gen = torch.Generator().manual_seed(rows)
    head_dim, max_seq_len = 64, 4096
    num_splits = max_seq_len // 64
    assert _split_programs(num_splits, num_kv_heads, 132, rows) < _split_programs(num_splits, num_kv_heads, 132)
    dtype = torch.bfloat16
    q = torch.randn(rows, num_heads, head_dim, generator=gen).to(device, dtype)
    k_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_cache = torch.randn(max_seq_len, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    positions = torch.arange(1500, 1500 + rows, device=device)  # 24 splits and up
    shared = decode_attention(q, k_cache, v_cache, positions, 0.125, invariant=True, per_token=True)
    apart = decode_attention(q, k_cache, v_cache, positions, 0.125, invariant=True, per_token=True, share_sms=False)
    assert torch.equal(shared, apart)
    for r in range(rows):
        single = decode_attention(q[r:r + 1], k_cache, v_cache, positions[r:r + 1], 0.125, invariant=True,
                                  per_token=True)
        assert torch.equal(shared[r:r + 1], single), r
    # the verify step's RoPE and cache writes in the kernel, rows sharing the SMs or not
    cos_sin = torch.randn(max_seq_len, head_dim, generator=gen).float().to(device)
    k_new = torch.randn(rows, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v_new = torch.randn(rows, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    outs = []
    for share in (True, False):
        kc, vc = k_cache.clone(), v_cache.clone()
        outs.append((rope_decode_attention(q, k_new, v_new, cos_sin, positions, kc, vc, 0.125, invariant=True,
                                           per_token=True, share_sms=share), kc, vc))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
