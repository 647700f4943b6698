"""bench_read_ceiling.py's reference XOR is right, and its kernels read every word once (its
command line: test_kernel_bench_args.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from benchmarks.bench_read_ceiling import TILES, xor_rows


def test_the_reference_xors_each_rows_words():
    w = torch.tensor([[1, 2, 4], [7, 7, 0], [-1, 0, -1]], dtype=torch.int32)
    assert xor_rows(w).tolist() == [7, 0, 0]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
                    reason="the kernels under Triton's interpreter: TRITON_INTERPRET=1 with Triton installed")
def test_the_kernels_read_every_word_once():
    """Each tile's XOR of a row is the row's XOR (rows past the last and K past a step's end
    masked); the flat reads' XOR of XORs is the whole buffer's."""
    from benchmarks.bench_read_ceiling import read_flat, read_tiles

    gen = torch.Generator().manual_seed(0)
    for n, words in [(40, 512), (13, 1792), (5, 100)]:
        w = torch.randint(-2**31, 2**31 - 1, (n, words), dtype=torch.int32, generator=gen)
        ref = xor_rows(w)
        for rows, step, warps, stages in TILES:
            if step <= words:
                got = read_tiles(w, torch.zeros(n, dtype=torch.int32), rows, step, warps, stages)
                assert torch.equal(got, ref), (n, words, rows, step, stages)
        flat = read_flat(w, torch.zeros(-(-n * words // 2048), dtype=torch.int32), 2048, 4)
        assert torch.equal(xor_rows(flat[None, :]), xor_rows(ref[None, :]))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
                    reason="the kernels under Triton's interpreter: TRITON_INTERPRET=1 with Triton installed")
def test_the_layer_read_covers_each_buffer_once():
    """The persistent layer read's per-program XORs give each buffer's XOR: one program with its
    barriers (the interpreter runs programs one after another, so a barrier across several would
    never open), and several programs without; the next buffer's first chunks loaded early or
    not; the barrier's counters are zero again at exit."""
    from benchmarks.bench_read_ceiling import layer_xors, read_layer

    gen = torch.Generator().manual_seed(1)
    ws = [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=gen) for n in (700, 64, 1029, 300)]
    refs = [int(xor_rows(w[None, :])[0]) for w in ws]
    cases = [(1, 64, 2, True, False), (1, 128, 1, True, True), (1, 32, 4, True, True), (3, 64, 2, False, False),
             (5, 32, 4, False, True), (4, 256, 2, False, True)]
    for programs, chunk, unroll, barrier, pre in cases:
        out = torch.full((4 * programs,), 7, dtype=torch.int32)
        bar = torch.zeros(4, dtype=torch.int32)
        read_layer(ws, out, bar, programs, chunk, unroll, 4, barrier, pre)
        assert layer_xors(out, programs) == refs, (programs, chunk, unroll, barrier, pre)
        assert bar.tolist() == [0, 0, 0, 3 * programs if barrier else 0]


def test_residency_counts_the_tightest_limit():
    """A barrier across programs needs them all resident: the count is the least of what threads,
    registers and shared memory allow a multiprocessor."""
    from types import SimpleNamespace

    from benchmarks.bench_read_ceiling import resident

    props = SimpleNamespace(max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
                            shared_memory_per_multiprocessor=228 << 10)
    assert resident(SimpleNamespace(n_regs=32, shared=0), 8, props) == 8  # threads: 2,048 / 256
    assert resident(SimpleNamespace(n_regs=128, shared=0), 8, props) == 2  # registers: 65,536 / 32,768
    assert resident(SimpleNamespace(n_regs=32, shared=100 << 10), 4, props) == 2  # shared memory
    assert resident(SimpleNamespace(n_regs=16, shared=0), 1, props) == 32  # the block cap


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None,
                    reason="the kernels under Triton's interpreter: TRITON_INTERPRET=1 with Triton installed")
def test_the_chained_layer_read_covers_each_buffer_once():
    """A program a chunk in ticket order: each buffer's chunks XOR to the buffer's XOR, loads
    issued before the wait or after, and the counters are zero again at exit (the interpreter
    runs programs in order, so every wait is already met when a program reaches it)."""
    from benchmarks.bench_read_ceiling import chain_counts, chain_xors, read_chain

    gen = torch.Generator().manual_seed(2)
    ws = [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=gen) for n in (700, 64, 1029, 300)]
    refs = [int(xor_rows(w[None, :])[0]) for w in ws]
    for chunk, early in [(64, False), (64, True), (128, True), (1024, False)]:
        counts = chain_counts(ws, chunk)
        out = torch.full((sum(counts),), 7, dtype=torch.int32)
        sync = torch.zeros(8, dtype=torch.int32)
        read_chain(ws, out, sync, chunk, 4, early)
        assert chain_xors(out, counts) == refs, (chunk, early)
        assert sync.tolist() == [0] * 8
