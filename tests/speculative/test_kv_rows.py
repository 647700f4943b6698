"""A tree step's accepted nodes' K/V moved in one launch (speculative/kernels/kv_rows.py) equal the
torch ops' index_select and index_copy, bit for bit, where the rows moved from and to overlap.

The kernel runs on CUDA (marked gpu), and on the CPU through Triton's interpreter only with
LOCALCHAT_TRITON_INTERPRET=1 (run this file alone then)."""

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)

from speculative.kernels.kv_rows import move_kv_rows, move_kv_rows_ref  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,dim", [(3, 64), (12, 128)], ids=["one block a row", "two blocks a row"])
@pytest.mark.parametrize("moves", ["a path", "each row down one", "none taken"])
def test_moved_rows_equal_the_torch_ops(device, heads, dim, moves):
    """src and dst as a greedy tree step writes them (dst[d] = n + 1 + d; src[d] the accepted node's
    row, n + 1 + its index, or dst[d] past the accepted path): a path through later siblings, a
    chain of rows each moving down by one (every destination some other row's source), and no
    move at all."""
    n, depth = 20, 5
    src = {"a path": [2, 5, 9, 3, 4], "each row down one": [1, 2, 3, 4, 5], "none taken": [0, 1, 2, 3, 4]}[moves]
    src = torch.tensor([n + 1 + i for i in src], device=device)
    dst = torch.arange(n + 1, n + 1 + depth, device=device)
    g = torch.Generator().manual_seed(heads)
    k_all = torch.randn(3, 48, heads, dim, generator=g).to(device, torch.bfloat16)
    v_all = torch.randn(3, 48, heads, dim, generator=g).to(device, torch.bfloat16)
    before_k, before_v = k_all.clone(), v_all.clone()
    want_k, want_v = k_all.clone(), v_all.clone()
    move_kv_rows_ref(want_k, want_v, src, dst)
    for d in range(depth):  # the reference: row src[d] as it was, now at dst[d]; the other rows untouched
        assert torch.equal(want_k[:, n + 1 + d], before_k[:, int(src[d])])
        assert torch.equal(want_v[:, n + 1 + d], before_v[:, int(src[d])])
    assert torch.equal(want_k[:, :n + 1], before_k[:, :n + 1]) and torch.equal(want_k[:, n + 1 + depth:],
                                                                             before_k[:, n + 1 + depth:])
    move_kv_rows(k_all, v_all, src, dst)
    assert torch.equal(k_all, want_k) and torch.equal(v_all, want_v)
