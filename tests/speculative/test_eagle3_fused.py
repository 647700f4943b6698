"""The EAGLE-3 layer with the GPU kernels (Eagle3Layer.fused_forward) equals the torch layer.

CUDA tests are marked gpu; on CPU they run through Triton's interpreter only with
LOCALCHAT_TRITON_INTERPRET=1 (run this file alone: it sets TRITON_INTERPRET=1 for the process).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

from engine.config import ModelConfig  # noqa: E402
from engine.kv_cache import KVCache  # noqa: E402
from engine.rope import rope_cos_sin  # noqa: E402
from engine.ops import Ops  # noqa: E402
from engine.options import KernelOptions  # noqa: E402
from speculative.eagle3.config import DraftConfig  # noqa: E402
from speculative.eagle3.model import Eagle3Draft  # noqa: E402
from speculative.train.export import head_config  # noqa: E402

_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
_INTERPRETER = pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
# (device, dtype, tolerance relative to the reference's largest magnitude). Not bf16 on the
# interpreter: it truncates where a GPU rounds to bf16, so its results drift for that reason.
CASES = [pytest.param("cuda", torch.bfloat16, 3e-2, marks=_GPU), pytest.param("cpu", torch.float32, 1e-4, marks=_INTERPRETER)]

# SmolLM2-135M's shape: hidden 576, 9 heads of 64, 3 KV heads.
TARGET = ModelConfig(architecture="LlamaForCausalLM", vocab_size=512, hidden_size=576, intermediate_size=1536,
                     num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=2048)


def _ops(**options) -> Ops:
    """A draft's CUDA ops (no batch invariance: its 1-row GEMV for single-token steps), on any
    device (the kernels run there under Triton's interpreter only)."""
    return Ops.routed(KernelOptions(**options))


def _assert_close_rel(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    """Max abs difference within rel of the reference's largest magnitude: in bf16 the two
    versions round at different points (the kernels keep fp32 inside a launch)."""
    scale = want.float().abs().max().item()
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= rel * scale, f"max diff {diff:.3e} vs max |ref| {scale:.3e}"


@pytest.mark.parametrize("device,dtype,rel", CASES)
@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("path", ["lean", "lean_rows", "fused"])
@pytest.mark.parametrize("narrow", [False, True], ids=["target-width", "narrow"])
def test_fused_draft_step_equals_torch(device, dtype, rel, norm_before_residual, path, narrow):
    """The GPU paths of a draft step (lean_forward, the default; lean_rows: with several rows on
    the invariant tiles and a tree's RoPE in its attention launch, KernelOptions.draft_rows and
    rope_in_tree; fused_forward) against the torch layer: a prompt's extend, a verify window's,
    single-token steps, then two levels of a draft tree read through a slot map (a node kept at a
    scratch row, then three children of it, their parent's state read through hidden_rows).
    narrow: a head narrower than the target (its own embeddings; fc maps the target's states
    down)."""
    lean = path != "fused"
    options = {"lean": {}, "lean_rows": dict(draft_rows=True, rope_in_tree=True), "fused": dict(lean_draft=False)}
    dev = torch.device(device)
    cfg = head_config(TARGET, 256, (2, 15, 27))
    cfg["norm_before_residual"] = norm_before_residual
    if narrow:
        cfg.update(hidden_size=384, num_attention_heads=6, num_key_value_heads=2, head_dim=64, intermediate_size=1024)
    dc = DraftConfig.from_hf(cfg, TARGET)
    max_len = 256
    torch.manual_seed(0)
    drafts = []
    for ops in (_ops(**options[path]), None):
        d = Eagle3Draft(dc, TARGET, max_len, ops)
        drafts.append(d)
    with torch.no_grad():
        for p in drafts[1].parameters():
            p.normal_(0, 0.05)
        for n, p in drafts[1].named_parameters():
            if n.endswith("norm.weight"):
                p.add_(1.0)
        drafts[0].load_state_dict(drafts[1].state_dict())
    # In bf16 both versions are also compared with the torch layer in fp32 (same weights, same
    # inputs): the kernels must be within a few times the torch bf16 layer's own distance from it.
    truth = [Eagle3Draft(dc, TARGET, max_len, None)] if dtype != torch.float32 else []
    for t in truth:
        t.load_state_dict(drafts[1].state_dict())
    drafts = [d.to(dev, dtype).eval() for d in drafts] + [t.to(dev, torch.float32).eval() for t in truth]
    for d in drafts:
        d.cos_sin = rope_cos_sin(dc.layer_config(TARGET), max_len).to(dev)
    assert drafts[0].fused and not drafts[1].fused and drafts[0].lean == lean and not drafts[1].lean
    assert not Eagle3Draft(dc, TARGET, max_len, _ops(fused_draft=False)).fused  # LOCALCHAT_FUSED_DRAFT=0 turns it off
    assert drafts[0].midlayer.norm_before_residual == norm_before_residual
    assert dc.owns_embeddings == narrow
    embed = torch.nn.Embedding(TARGET.vocab_size, dc.hidden_size).to(dev, dtype)
    dtypes = [dtype, dtype] + [torch.float32] * len(truth)
    caches = [KVCache(1, max_len, dc.num_kv_heads, dc.head_dim, dt, dev) for dt in dtypes]
    g = torch.Generator().manual_seed(1)
    # A prompt's extend over 20 positions (more rows than the lean path takes), a verify window's
    # over 6, then three chained single-token steps.
    ids = torch.randint(0, TARGET.vocab_size, (26,), generator=g).to(dev)
    aux = (torch.randn(26, 3 * TARGET.hidden_size, generator=g) * 0.5).to(dev, dtype)
    pos = torch.arange(26, device=dev)
    outs = []
    with torch.inference_mode():
        for d, kv, dt in zip(drafts, caches, dtypes):
            emb = embed if dt == dtype else torch.nn.Embedding.from_pretrained(embed.weight.float())
            x = aux.to(dt)
            steps = [d(ids[:20], pos[:20], x[:20], True, emb, kv, start_pos=0),
                     d(ids[20:], pos[20:], x[20:], True, emb, kv, start_pos=20)]
            hidden = steps[-1][1]
            for s in range(3):
                tok = torch.tensor([s + 3], device=dev)
                p = torch.tensor([26 + s], device=dev)
                logits, hidden = d(tok, p, hidden[-1:], False, emb, kv, start_pos=26 + s)
                steps.append((logits, hidden))
            # a tree's node at position 29 kept at row 200, then three children at 30 (rows 201-203)
            # reading it through their maps
            tree_map = torch.tensor([[200, 0]], dtype=torch.int32, device=dev)
            base = torch.tensor([29], dtype=torch.int32, device=dev)
            logits, hidden = d(torch.tensor([7], device=dev), torch.tensor([29], device=dev), hidden[-1:], False, emb,
                               kv, slots=torch.tensor([200], device=dev), slot_map=tree_map, map_base=base)
            steps.append((logits, hidden))
            # their parent's state read through hidden_rows (row 0 of the step before's output)
            steps.append(d(torch.tensor([8, 9, 10], device=dev), torch.full((3,), 30, device=dev),
                           hidden, False, emb, kv, slots=torch.tensor([201, 202, 203], device=dev),
                           slot_map=tree_map.expand(3, -1).contiguous(), map_base=base.expand(3).contiguous(),
                           hidden_rows=torch.zeros(3, dtype=torch.long, device=dev)))
            outs.append(steps)
    pairs = [(a, b) for sa, sb in zip(outs[0], outs[1]) for a, b in zip(sa, sb)]
    pairs += [(caches[0].k[0][:29], caches[1].k[0][:29]), (caches[0].v[0][:29], caches[1].v[0][:29]),
              (caches[0].k[0][200:204], caches[1].k[0][200:204]), (caches[0].v[0][200:204], caches[1].v[0][200:204])]
    if not truth:
        for got, want in pairs:
            _assert_close_rel(got, want, rel)
        return
    exact = [b for sb in outs[2] for b in sb] + [caches[2].k[0][:29], caches[2].v[0][:29], caches[2].k[0][200:204],
                                                 caches[2].v[0][200:204]]
    for (got, torch_bf16), want in zip(pairs, exact):
        scale = want.float().abs().max().item()
        err_kernels = (got.float() - want.float()).abs().max().item()
        err_torch = (torch_bf16.float() - want.float()).abs().max().item()
        assert err_kernels <= max(3 * err_torch, rel / 3 * scale), (err_kernels, err_torch, scale)


def _random_draft(dc: DraftConfig, ops: Ops | None, dev: torch.device, dtype: torch.dtype, seed: int) -> Eagle3Draft:
    """A draft over TARGET with random weights (norm weights about 1), on dev in dtype, eval mode."""
    torch.manual_seed(seed)
    d = Eagle3Draft(dc, TARGET, 64, ops)
    with torch.no_grad():
        for n, p in d.named_parameters():
            p.normal_(0, 0.05)
            if n.endswith("norm.weight"):
                p.add_(1.0)
    d = d.to(dev, dtype).eval()
    d.cos_sin = rope_cos_sin(dc.layer_config(TARGET), 64).to(dev)
    return d


ONE_ROW = [pytest.param("cpu", torch.float32, None, id="torch-cpu"),
           pytest.param("cuda", torch.bfloat16, "lean", marks=_GPU, id="cuda-lean"),
           pytest.param("cuda", torch.bfloat16, "fused", marks=_GPU, id="cuda-fused"),
           pytest.param("cpu", torch.float32, "lean", marks=_INTERPRETER, id="interpreter-lean"),
           pytest.param("cpu", torch.float32, "fused", marks=_INTERPRETER, id="interpreter-fused")]


@pytest.mark.parametrize("device,dtype,path", ONE_ROW)
def test_an_extend_for_one_row_equals_that_row_of_the_whole_extend(device, dtype, path):
    """Draft-extends continue from one row (the prompt's last, a verify step's last accepted):
    forward(last=r) writes every row's K/V as the whole extend does and returns row r's logits
    and state, for an index tensor and a Python index alike."""
    dev = torch.device(device)
    dc = DraftConfig.from_hf(head_config(TARGET, 256, (2, 15, 27)), TARGET)
    d = _random_draft(dc, _ops(lean_draft=path == "lean") if path is not None else None, dev, dtype, seed=0)
    assert d.fused == (path is not None) and d.lean == (path == "lean")
    embed = torch.nn.Embedding(TARGET.vocab_size, dc.hidden_size).to(dev, dtype)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, TARGET.vocab_size, (6,), generator=g).to(dev)
    aux = (torch.randn(6, 3 * TARGET.hidden_size, generator=g) * 0.5).to(dev, dtype)
    pos = torch.arange(10, 16, device=dev)
    rel = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        whole_kv = KVCache(1, 64, dc.num_kv_heads, dc.head_dim, dtype, dev)
        logits, hidden = d(ids, pos, aux, True, embed, whole_kv, start_pos=10)
        for last, row in ((torch.tensor(3, device=dev), 3), (-1, 5), (torch.tensor(0, device=dev), 0)):
            kv = KVCache(1, 64, dc.num_kv_heads, dc.head_dim, dtype, dev)
            one_logits, one_hidden = d(ids, pos, aux, True, embed, kv, start_pos=10, last=last)
            assert one_logits.shape == (1, logits.shape[1]) and one_hidden.shape == (1, hidden.shape[1])
            assert torch.equal(kv.k[0], whole_kv.k[0]) and torch.equal(kv.v[0], whole_kv.v[0])
            _assert_close_rel(one_logits, logits[row:row + 1], rel)
            _assert_close_rel(one_hidden, hidden[row:row + 1], rel)


PACKED_TABLE = [pytest.param("cuda", torch.bfloat16, "lean", marks=_GPU, id="cuda-lean"),
                pytest.param("cuda", torch.bfloat16, "fused", marks=_GPU, id="cuda-fused"),
                pytest.param("cpu", torch.float32, "lean", marks=_INTERPRETER, id="interpreter-lean"),
                pytest.param("cpu", torch.float32, "fused", marks=_INTERPRETER, id="interpreter-fused")]


@pytest.mark.parametrize("device,dtype,path", PACKED_TABLE)
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_a_draft_over_a_packed_table_equals_one_over_that_table_dequantized(device, dtype, path, kind):
    """A target whose embeddings stay packed (PackedEmbedding, a GGUF's token_embd), looked up by
    our kernel (the default): the draft's steps, lean included (its first launch then
    reads the looked-up rows), give the bits of the
    same draft over that table dequantized into an nn.Embedding: a prompt's extend, then
    two chained single-token draft steps."""
    import numpy as np

    from engine.packed_linear import PackedEmbedding
    from engine.weights.grouped import dequantize_grouped, from_packed
    from engine.weights.packed import gguf_weight
    from speculative.eagle3 import model as eagle3_model
    from tests.tiny_gguf import random_blocks

    dev = torch.device(device)
    dc = DraftConfig.from_hf(head_config(TARGET, 256, (2, 15, 27)), TARGET)
    d = _random_draft(dc, _ops(lean_draft=path == "lean"), dev, dtype, seed=1)
    width = dc.hidden_size
    rng = np.random.default_rng(3)
    block = from_packed([gguf_weight(kind, torch.from_numpy(random_blocks(kind, TARGET.vocab_size, width, rng)),
                                     (TARGET.vocab_size, width))]).to(dev)
    packed = PackedEmbedding(block, dtype)
    plain = torch.nn.Embedding(TARGET.vocab_size, width).to(dev, dtype)
    with torch.no_grad():
        plain.weight.copy_(dequantize_grouped(block).to(dtype))
    lean_calls = []
    real_lean = eagle3_model.Eagle3Layer.lean_forward

    def spy(self, input_ids, *args, **kwargs):
        lean_calls.append(input_ids is None)
        return real_lean(self, input_ids, *args, **kwargs)

    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, TARGET.vocab_size, (6,), generator=g).to(dev)
    ids[0] = TARGET.vocab_size - 1
    aux = (torch.randn(6, 3 * TARGET.hidden_size, generator=g) * 0.5).to(dev, dtype)
    steps = torch.randint(0, TARGET.vocab_size, (2, 1), generator=g).to(dev)
    results = []
    with torch.inference_mode(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(eagle3_model.Eagle3Layer, "lean_forward", spy)
        for embed in (packed, plain):
            kv = KVCache(1, 64, dc.num_kv_heads, dc.head_dim, dtype, dev)
            out = [d(ids, torch.arange(10, 16, device=dev), aux, True, embed, kv, start_pos=10)]
            hidden = out[0][1][-1:]
            for s, step in enumerate(steps):  # chained single-token draft steps
                out.append(d(step, torch.tensor([16 + s], device=dev), hidden, False, embed, kv, start_pos=16 + s))
                hidden = out[-1][1]
            results.append([t for pair in out for t in pair] + [kv.k[0][:20], kv.v[0][:20]])
    for got, want in zip(*results):
        assert torch.equal(got, want)
    # the lean path ran over the packed table too (its rows looked up first), not only over the plain one
    assert lean_calls == ([True] * 3 + [False] * 3 if path == "lean" else [])
