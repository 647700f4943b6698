"""Decoder layers with fused norm/activation + projection launches (Ops.layer_kernels).

A decode or verify step on CUDA runs rms_norm_gemv (add_rms_norm + qkv, add_rms_norm +
gate_up) and silu_mul_gemv (silu_and_mul + down); everything else keeps the unfused ops.
The choice logic runs on any CPU. Model steps run on CUDA (marked gpu), and on CPU through
Triton's interpreter only with LOCALCHAT_TRITON_INTERPRET=1 (run this file alone: it sets
TRITON_INTERPRET=1 for the process):

    LOCALCHAT_TRITON_INTERPRET=1 python -m pytest tests/engine/test_fused_layers.py
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)

import engine.layer_kernels as layer_kernels_module  # noqa: E402
import engine.routing as routing  # noqa: E402
from engine.forward_batch import ForwardBatch  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.kernels.activation import silu_and_mul_ref  # noqa: E402
from engine.kernels.gemv import GemvConfig  # noqa: E402
from engine.kernels.norm import add_rms_norm_ref  # noqa: E402
from engine.kv_cache import KVCache  # noqa: E402
from engine.layer_kernels import FusedLayerKernels, LayerKernels  # noqa: E402
from engine.model import CausalLM  # noqa: E402
from engine.ops import Ops  # noqa: E402
from engine.options import CUBLAS, KernelOptions  # noqa: E402
from engine.rope import rope_cos_sin  # noqa: E402

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = pytest.param("cuda", marks=GPU)
CPU = pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)"))
MAX_LEN = 64
PROMPT = 20  # prefilled before the step: more than 16 rows, so the unfused ops


def _bf16(rows: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.zeros(rows, 8, dtype=dtype)


def make_ops(device: str, **options) -> Ops:
    """The CUDA ops under KernelOptions(**options); on CPU the CUDA routing over torch norms and
    attention (its GEMVs run in Triton's interpreter)."""
    ops = Ops.routed(KernelOptions(**options))
    if device == "cuda":
        return ops
    return dataclasses.replace(ops, add_rms_norm=add_rms_norm_ref, silu_and_mul=silu_and_mul_ref, rope_and_cache=None,
                               attention=None, rope_attention=None, embed=None, greedy_next=None)


def test_layer_kernels_choice():
    """Fused only where the GEMV runs anyway: a bf16 decode row, or up to 16 bf16 rows with
    batch invariance; never for packed forwards, longer steps, other dtypes, CPU ops."""
    step = ForwardBatch.eager(torch.zeros(1, dtype=torch.long), 5)
    packed = ForwardBatch.packed(torch.zeros(1, dtype=torch.long), [1])

    def kind(x, batch=step, o=make_ops("cpu")):
        k = o.layer_kernels(x, batch)
        if isinstance(k, FusedLayerKernels):
            return "invariant" if k.invariant else "row"
        assert type(k) is LayerKernels
        return "unfused"

    assert kind(_bf16(1)) == "row"
    assert [kind(_bf16(m)) for m in (2, 6, 16, 17, 64)] == ["unfused"] * 5
    assert kind(_bf16(1, torch.float32)) == kind(_bf16(1, torch.float16)) == "unfused"
    assert kind(_bf16(1), packed) == "unfused"
    apart = make_ops("cpu", batch_invariant=True, fuse_invariant=False)
    assert [kind(_bf16(m), o=apart) for m in (1, 2, 6, 16)] == ["unfused"] * 4
    invariant = make_ops("cpu", batch_invariant=True)  # the default: fused invariant kernels
    assert [kind(_bf16(m), o=invariant) for m in (1, 2, 6, 16)] == ["invariant"] * 4
    assert kind(_bf16(17), o=invariant) == kind(_bf16(6, torch.float32), o=invariant) == "unfused"
    assert kind(_bf16(6), packed, o=invariant) == "unfused"
    assert kind(_bf16(1), o=make_ops("cpu", fuse=False)) == "unfused"
    assert kind(_bf16(1), o=Ops.for_device(torch.device("cpu"))) == "unfused"


def test_norm_tail_choice(monkeypatch):
    """A sublayer's last projection carries the next norm (LayerKernels.ending) only for one bf16 row
    without a draft, where that norm would be a launch of its own: before lm_head, or before a
    projection whose norm FUSED_TILES keeps unfused; and only with a residual to add."""
    from engine.layers import RMSNorm

    norm, qkv = RMSNorm(64, 1e-5), torch.nn.Linear(64, 192, bias=False)
    row = FusedLayerKernels(KernelOptions(), invariant=False, project=None)
    monkeypatch.setattr(routing, "FUSED_TILES", {})
    assert callable(row.ending(_bf16(1), (norm, torch.nn.Linear(64, 1000), "lm_head")))
    assert row.ending(_bf16(1), (norm, qkv, "qkv")) is None  # K = 64: qkv takes the norm in its prologue
    monkeypatch.setattr(routing, "FUSED_TILES", {("row", "rms_norm_gemv", 192, 64): routing.UNFUSED})
    assert callable(row.ending(_bf16(1), (norm, qkv, "qkv")))
    assert row.ending(_bf16(1), None) is None and row.ending(None, (norm, qkv, "qkv")) is None
    assert row.ending(_bf16(2), (norm, qkv, "qkv")) is None
    assert row.ending(_bf16(1, torch.float32), (norm, qkv, "qkv")) is None
    assert FusedLayerKernels(KernelOptions(), invariant=True, project=None).ending(_bf16(1), (norm, qkv, "qkv")) is None
    assert LayerKernels(None).ending(_bf16(1), (norm, qkv, "qkv")) is None
    tail_off = FusedLayerKernels(KernelOptions(norm_tail=False), invariant=False, project=None)
    assert tail_off.ending(_bf16(1), (norm, qkv, "qkv")) is None


def test_epilogue_norm_choice():
    """The invariant set's o_proj and down end with the next norm's squares (a Scaled for the
    projection after it) for 1 to 64 bf16 rows of a batch-invariant target, before qkv or gate_up
    on plain bf16 weights; not before lm_head (its input is the hidden state drafts read), not
    before a packed projection, not with LOCALCHAT_NORM_STATS=0, not on the one-row set."""
    from engine.layers import RMSNorm

    norm = RMSNorm(64, 1e-5)
    qkv = torch.nn.Linear(64, 192, bias=False).to(torch.bfloat16)
    options = KernelOptions(batch_invariant=True)
    inv = FusedLayerKernels(options, invariant=True, project=None)
    for rows in (1, 6, 16, 17, 64):  # past 16: a draft tree's verify rows (routing.tree_rows)
        assert callable(inv.ending(_bf16(rows), (norm, qkv, "qkv")))
        assert callable(inv.ending(_bf16(rows), (norm, qkv, "gate_up")))
    assert inv.ending(_bf16(65), (norm, qkv, "qkv")) is None
    assert inv.ending(_bf16(1), (norm, qkv, "lm_head")) is None
    assert inv.ending(_bf16(1, torch.float32), (norm, qkv, "qkv")) is None
    assert inv.ending(_bf16(1), (norm, torch.nn.Linear(64, 192), "qkv")) is None  # fp32 weight
    packed = torch.nn.Module()
    packed.weight = None  # a PackedLinear holds no plain weight
    assert inv.ending(_bf16(1), (norm, packed, "qkv")) is None
    off = FusedLayerKernels(dataclasses.replace(options, norm_stats=False), invariant=True, project=None)
    assert off.ending(_bf16(1), (norm, qkv, "qkv")) is None


def test_unfused_entries_fall_back_to_the_unfused_pair(monkeypatch):
    """An UNFUSED shape runs add_rms_norm + the set's projection, as without fusion."""
    calls = []
    kernels = FusedLayerKernels(KernelOptions(), invariant=False,
                                project=lambda h, lin, role: calls.append(role) or lin(h))
    lin = torch.nn.Linear(8, 4, bias=False)
    monkeypatch.setitem(routing.FUSED_TILES, ("row", "rms_norm_gemv", 4, 8), routing.UNFUSED)
    norm = __import__("engine.layers", fromlist=["RMSNorm"]).RMSNorm(8, 1e-6)
    x, res = torch.randn(1, 8), torch.randn(1, 8)
    out, stream = kernels.norm_linear(x, res, norm, lin, "qkv")
    assert calls == ["qkv"] and torch.equal(stream, x + res)
    torch.testing.assert_close(out, lin(norm(x + res)))


# --- model steps -------------------------------------------------------------------------

def model_config(arch: str, small: bool) -> ModelConfig:
    """SmolLM2-135M's shape (or a tiny one), as Llama, Qwen2 (q/k/v bias) or Qwen3 (q/k norm)."""
    shape = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16) if small else \
        dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30 if arch == "llama" else 6,
             num_heads=9, num_kv_heads=3, head_dim=64)
    extra = {"llama": dict(architecture="LlamaForCausalLM", tie_word_embeddings=True),
             "qwen2": dict(architecture="Qwen2ForCausalLM", attention_bias=True),
             "qwen3": dict(architecture="Qwen3ForCausalLM", qk_norm=True, attention_bias=True, mlp_bias=True)}[arch]
    return ModelConfig(rms_norm_eps=1e-5, rope_theta=100000.0, **shape, **extra)


def make_models(cfg: ModelConfig, device: str, seed: int = 0, **options) -> tuple[CausalLM, CausalLM]:
    """(fused, unfused): one set of random bf16 weights under make_ops(device, **options) and under
    the same options without fusion."""
    gen = torch.Generator().manual_seed(seed)
    models = []
    for o in (make_ops(device, **options), make_ops(device, **{**options, "fuse": False})):
        model = CausalLM(cfg, MAX_LEN, o)
        if not models:
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if name.endswith("norm.weight"):
                        p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                    else:  # embeddings and biases large enough to matter; weights ~ 1 / sqrt(K)
                        std = 1.0 if "embed" in name or name.endswith("bias") else 0.04
                        p.copy_(torch.randn(p.shape, generator=gen) * std)
        else:
            model.load_state_dict(models[0].state_dict())
        model = model.to(device, torch.bfloat16).eval().requires_grad_(False)
        model.cos_sin = rope_cos_sin(cfg, MAX_LEN).to(device)
        models.append(model)
    return models[0], models[1]


def new_cache(model: CausalLM, device: str) -> KVCache:
    cfg = model.config
    return KVCache(cfg.num_layers, MAX_LEN, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, device)


@torch.inference_mode()
def step_logits(model: CausalLM, kv: KVCache, ids: torch.Tensor, start: int) -> torch.Tensor:
    out = model(ForwardBatch.eager(ids, start), kv)
    return model.logits(out.hidden)


@pytest.fixture(params=["all fused", "FUSED_TILES", "norms apart"])
def tiles(request, monkeypatch):
    """Every projection fused (the kernels' correctness), the shipped table (UNFUSED shapes), or
    the SmolLM2 shape's one-row norms unfused as the 8B's are (the norm tails: norms_apart)."""
    if request.param == "all fused":
        monkeypatch.setattr(routing, "FUSED_TILES", {})
    elif request.param == "norms apart":
        apart = norms_apart(model_config("llama", False))
        monkeypatch.setattr(routing, "FUSED_TILES", {**routing.FUSED_TILES, **apart})
    return request.param


def expected_launches(cfg: ModelConfig, options: KernelOptions, rows: int = 1) -> dict[str, int]:
    qkv = cfg.num_heads * cfg.head_dim + 2 * cfg.num_kv_heads * cfg.head_dim
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    shapes = ((qkv, H), (H, cfg.num_heads * cfg.head_dim), (2 * I, H), (H, I))
    # Batch invariance: small layers run the one-row set row by row, larger ones the invariant set.
    each_row = routing.each_row_layer(options, shapes, torch.bfloat16)
    mode = routing.INVARIANT if options.batch_invariant and not each_row else routing.ROW
    one_row = rows == 1 or each_row
    normed = lambda n, k: routing.norm_tile(options, mode, rows, (n, k), each_row) != routing.UNFUSED  # noqa: E731
    # One-row kernels: o_proj runs the post-attention norm where it stays unfused (norm_tail); with the
    # gated MLP, down runs the next layer's input norm where that stays unfused, and the last one the final norm.
    tail = options.norm_tail and mode == routing.ROW and one_row
    o_tails = L * (not normed(2 * I, H)) if tail else 0
    if options.gated_mlp and mode == routing.ROW and one_row:  # each MLP: one gated launch, down plain
        down_tails = (L - 1) * (not normed(qkv, H)) + 1 if tail else 0
        return {"rms_norm_gemv": L * normed(qkv, H), "silu_mul_gemv": 0,
                "rms_norm_gated_gemv": L * normed(2 * I, H),
                "gated_gemv": L * (not normed(2 * I, H)), "gemv_add_norm": o_tails + down_tails,
                "gemv_add_stats": 0, "gemv_rstd": 0}
    fused_down = routing.down_tile(options, mode, rows, (H, I), each_row) != routing.UNFUSED
    if mode == routing.INVARIANT and options.norm_stats:
        # o_proj and every down but the last (before the final norm) end with the next norm's
        # squares (gemv_add_stats); the projections after them scale by its 1 / rms (gemv_rstd)
        # (gate_up with the activation after its dot where gated_mlp: no silu_mul_gemv then)
        return {"rms_norm_gemv": normed(qkv, H), "silu_mul_gemv": int(fused_down and not options.gated_mlp),
                "rms_norm_gated_gemv": 0,
                "gated_gemv": 0, "gemv_add_norm": 0, "gemv_add_stats": 2 * L - 1, "gemv_rstd": 2 * L - 1}
    return {"rms_norm_gemv": L * (normed(qkv, H) + normed(2 * I, H)), "silu_mul_gemv": L * fused_down,
            "rms_norm_gated_gemv": 0, "gated_gemv": 0, "gemv_add_norm": o_tails, "gemv_add_stats": 0, "gemv_rstd": 0}


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the fused launches the model makes: {"rms_norm_gemv": n, "silu_mul_gemv": n, ...}."""
    calls = {"rms_norm_gemv": 0, "silu_mul_gemv": 0, "rms_norm_gated_gemv": 0, "gated_gemv": 0, "gemv_add_norm": 0,
             "gemv_add_stats": 0, "gemv_rstd": 0}
    for name in calls:
        real = getattr(layer_kernels_module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(layer_kernels_module, name, spy)
    return calls


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    """Max abs difference within rel of the reference's largest magnitude (logits of random
    models are small and bf16 rounds the residual stream differently between layouts)."""
    scale = want.float().abs().max().item()
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= rel * scale, f"max diff {diff:.3e} vs max |ref| {scale:.3e}"


def _fused_vs_unfused(device: str, arch: str, rows: int, invariant: bool, small: bool, fused_calls, rel: float,
                      gated: bool = False, norm_stats: bool = True):
    # fused invariant kernels: their math too
    options = dict(batch_invariant=invariant, gated_mlp=gated, norm_stats=norm_stats)
    cfg = model_config(arch, small)
    fused, unfused = make_models(cfg, device, **options)
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + rows,), generator=gen).to(device)
    got, want = [], []
    for model, out in ((fused, got), (unfused, want)):
        kv = new_cache(model, device)
        step_logits(model, kv, ids[:PROMPT], 0)  # prefill: unfused in both
        before = dict(fused_calls)
        out.append(step_logits(model, kv, ids[PROMPT:], PROMPT))
        launches = {k: fused_calls[k] - before[k] for k in fused_calls}
        expect = expected_launches(cfg, fused.ops.options, rows) if model is fused else {k: 0 for k in launches}
        assert launches == expect, launches
    assert got[0].shape == (rows, cfg.vocab_size)
    assert_close_rel(got[0], want[0], rel)


ROW_CASES = [(1, False, False), (1, False, True), (1, True, False), (6, True, True)]  # rows, invariant, gated


def norms_apart(cfg: ModelConfig) -> dict:
    """FUSED_TILES entries that keep a one-row step's qkv and gate_up norms unfused, as the 8B's
    are: the projections before them then carry the norm in their last program (norm_tail)."""
    qkv = cfg.num_heads * cfg.head_dim + 2 * cfg.num_kv_heads * cfg.head_dim
    return {("row", "rms_norm_gemv", n, cfg.hidden_size): routing.UNFUSED
            for n in (qkv, 2 * cfg.intermediate_size)}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("rows,invariant,gated", ROW_CASES)
@pytest.mark.parametrize("norms", ["fused", "apart", "launches"])
def test_fused_step_equals_unfused_interpreter(arch, rows, invariant, gated, norms, fused_calls, monkeypatch):
    """A tiny model's decode/verify step with fused kernels == the unfused step (CPU interpreter);
    gated: a one-row step's MLP as gated_gemv + a plain down GEMV (KernelOptions.gated_mlp); norms
    apart: the one-row norms unfused, so that o_proj and down carry them (gemv_add_norm); norms as
    launches: the invariant set without its epilogue norms (LOCALCHAT_NORM_STATS=0)."""
    if not INTERPRET:
        pytest.skip("set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
    if norms == "apart" and (rows, invariant) != (1, False):
        pytest.skip("the norm tails are one-row kernels")
    if norms == "launches" and not invariant:
        pytest.skip("the epilogue norms are the invariant set's")
    # tiny shapes: all fused, or the norms apart
    monkeypatch.setattr(routing, "FUSED_TILES", norms_apart(model_config(arch, True)) if norms == "apart" else {})
    _fused_vs_unfused("cpu", arch, rows, invariant, True, fused_calls, rel=2.5e-2, gated=gated,
                      norm_stats=norms != "launches")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("rows,invariant,gated", ROW_CASES + [(16, True, False)])
@pytest.mark.parametrize("norm_stats", [True, False], ids=["epilogue_norms", "norm_launches"])
def test_fused_step_equals_unfused_smollm2_shape(arch, rows, invariant, gated, norm_stats, tiles, fused_calls):
    """A SmolLM2-135M-shaped random model (30 layers as Llama): the fused decode (1 row) and
    verify (6, 16 rows) steps give the unfused step's logits within bf16 tolerance, with the
    one-row MLP gated or not (gated changes one-row steps only), and the invariant set's norms in
    the projections' epilogues or launched apart."""
    if not (norm_stats or invariant):
        pytest.skip("the epilogue norms are the invariant set's")
    _fused_vs_unfused("cuda", arch, rows, invariant, False, fused_calls, rel=5e-2, gated=gated, norm_stats=norm_stats)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("use_graphs", [False, True])
@pytest.mark.parametrize("fuse_invariant", [True, False])  # the default, and the unfused invariant ops
def test_fused_invariant_verify_rows_equal_decode_steps(arch, use_graphs, fuse_invariant, tiles, fused_calls):
    """Batch-invariant mode, end to end: each row of a 6-row and a 16-row step has exactly the
    logits of the 1-row decode step of its token, eager and in captured graphs (ModelRunner),
    with the fused invariant kernels and with the unfused invariant ops."""
    from engine.runner import ModelRunner

    cfg = model_config(arch, small=False)
    model, _ = make_models(cfg, "cuda", seed=1, batch_invariant=True, fuse_invariant=fuse_invariant)
    runner = ModelRunner(model, MAX_LEN)
    if use_graphs:
        runner.capture([1, 6, 16])
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + 16,), generator=gen).cuda()
    runner.forward(ids[:PROMPT], 0)  # prefill (20 rows: unfused)
    singles = torch.cat([runner.forward(ids[PROMPT + i:PROMPT + i + 1], PROMPT + i)[0].clone() for i in range(16)])
    for rows in (6, 16):
        before = fused_calls["rms_norm_gemv"]
        verify = runner.forward(ids[PROMPT:PROMPT + rows], PROMPT)[0].clone()
        if not use_graphs:
            want = expected_launches(cfg, model.ops.options)["rms_norm_gemv"] if fuse_invariant else 0
            assert fused_calls["rms_norm_gemv"] - before == want
        assert torch.equal(verify, singles[:rows]), rows
    # and the 1-row steps again after the verify steps rewrote the cache rows: same bits
    again = runner.forward(ids[PROMPT + 3:PROMPT + 4], PROMPT + 3)[0]
    assert torch.equal(again, singles[3:4])


def test_routed_projections_launch_what_routing_picks(monkeypatch):
    """Ops' projections run the route routing.linear_route gives: cuBLAS (the nn.Linear), or our
    GEMV with the route's tile and invariance and the options' PDL setting."""
    import engine.ops as ops_module

    calls = []
    monkeypatch.setattr(ops_module, "gemv", lambda x, w, b, config=None, invariant=False, pdl=True, each_row=False:
                        calls.append((config, invariant, pdl) + ((True,) if each_row else ())) or "gemv")
    tile = GemvConfig(2, 1024, 1, 4, 3)
    options = dict(row_tiles=(((8, 4096), CUBLAS), ((16, 4096), tile)), pdl=False)
    ops = make_ops("cpu", **options)
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    cublas, tiled, plain = (torch.nn.Linear(4096, n, bias=False).to(torch.bfloat16) for n in (8, 16, 4))
    assert ops.row_linear(x, cublas).shape == (1, 8) and calls == []
    assert ops.row_linear(x, tiled) == "gemv" and calls == [(tile, False, False)]
    assert ops.row_linear(x, plain) == "gemv" and calls[-1] == (routing.row_tile(4096), False, False)
    assert ops.linear(x, plain).shape == (1, 4) and len(calls) == 2
    row = ops.fused_row.project
    assert row(x, tiled, "gate_up") == "gemv" and calls[-1] == (tile, False, False)
    assert row(x, plain, "gate_up").shape == (1, 4) and len(calls) == 3
    assert row(x, plain, "qkv") == "gemv" and calls[-1] == (None, False, False)
    assert make_ops("cpu", batch_invariant=True, **options).linear(x.expand(6, -1), plain) == "gemv"
    assert calls[-1] == (routing.invariant_tile((4, 4096)), True, False)  # each_row off: the tensor-core tile
    invariant = make_ops("cpu", batch_invariant=True, each_row=True, **options)
    # a small weight: the one-row route, row by row (lm_head's is cuBLAS: our GEMV's built-in tile)
    assert invariant.linear(x.expand(6, -1), plain) == "gemv" and calls[-1] == (None, False, False, True)
    assert invariant.row_linear(x.expand(6, -1), plain) == "gemv" and calls[-1] == (routing.row_tile(4096), False,
                                                                                     False, True)
    assert invariant.linear(x.expand(17, -1), plain).shape == (17, 4) and len(calls) == 7
    large = torch.nn.Linear(4096, 2048, bias=False).to(torch.bfloat16)  # 16 MiB: the tensor-core tile
    assert invariant.linear(x.expand(6, -1), large) == "gemv"
    assert calls[-1] == (routing.invariant_tile((2048, 4096)), True, False)


def routed_model(cfg: ModelConfig, device: str, options: KernelOptions) -> CausalLM:
    """A bf16 model of random weights (seed 1) on Ops.routed(options): every kernel of the CUDA
    path (on the CPU in Triton's interpreter)."""
    model = CausalLM(cfg, MAX_LEN, Ops.routed(options))
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight")
                    else torch.randn(p.shape, generator=g) * (1.0 if "embed" in name else 0.04))
    model = model.to(device, torch.bfloat16).eval().requires_grad_(False)
    model.cos_sin = rope_cos_sin(cfg, MAX_LEN).to(device)
    return model


@pytest.mark.parametrize("device", [CUDA, CPU])
def test_tree_rows_with_rope_in_attention_equal_the_separate_launch(device, monkeypatch):
    """A batch-invariant target's verify step over a draft tree's rows (read through slot maps):
    with RoPE and the cache writes inside the attention launch (KernelOptions.rope_in_tree) it gives
    the logits and the cache of the separate rope_and_cache launch bit for bit, one launch fewer
    a layer."""
    import engine.kernels.rope as rope_module
    import engine.ops as ops_module
    from tests.tree_rows import tree_layout

    launches = []
    real = rope_module.rope_and_cache
    monkeypatch.setattr(ops_module, "rope_and_cache", lambda *a, **k: launches.append(1) or real(*a, **k))
    cfg = model_config("llama", small=device == "cpu")
    parents = [-1, 0, 0, 1, 1, 2, 4]  # depth 0..3 at positions PROMPT.. (the root: the last accepted token)
    rows = len(parents)
    node_slot = [PROMPT + 20 + 3 * i for i in range(rows)]
    depth, slot_map = tree_layout(parents, node_slot)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + rows,), generator=gen).to(device)
    results = []
    for rope_in_tree in (False, True):
        model = routed_model(cfg, device, KernelOptions(batch_invariant=True, rope_in_tree=rope_in_tree))
        kv = new_cache(model, device)
        step_logits(model, kv, ids[:PROMPT], 0)
        batch = ForwardBatch(input_ids=ids[PROMPT:], positions=torch.tensor([PROMPT + d for d in depth], device=device),
                             slots=torch.tensor(node_slot, device=device), slot_map=slot_map.to(device),
                             map_base=torch.full((rows,), PROMPT, dtype=torch.int32, device=device))
        launches.clear()
        with torch.inference_mode():
            logits = model.logits(model(batch, kv).hidden)
        results.append((logits, torch.stack(kv.k), torch.stack(kv.v), len(launches)))
    (apart, k_apart, v_apart, n_apart), (fused, k_fused, v_fused, n_fused) = results
    assert n_apart == cfg.num_layers and n_fused == 0
    assert torch.equal(fused, apart) and torch.equal(k_fused, k_apart) and torch.equal(v_fused, v_apart)


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("norm_stats", [True, False], ids=["epilogue_norms", "norm_launches"])
def test_a_trees_rows_in_one_forward_equal_its_16_row_chunks(device, norm_stats, monkeypatch):
    """KernelOptions.tree_one_forward: a batch-invariant target's verify step over a draft tree of
    25 rows (read through slot maps) in one forward gives the logits (Ops.tree_project's lm_head)
    and the caches that the same tree verified in forwards of 16 and 9 rows gives, bit for bit,
    with the invariant set's norms in the epilogues or launched apart (o_proj on its own), and the
    activation apart from down, as FUSED_TILES keeps the demo's."""
    from tests.tree_rows import tree_layout

    cfg = model_config("llama", small=device == "cpu")
    apart = {(routing.INVARIANT, "silu_mul_gemv", cfg.hidden_size, cfg.intermediate_size): routing.UNFUSED}
    monkeypatch.setattr(routing, "FUSED_TILES", {**routing.FUSED_TILES, **apart})
    parents = [-1] + [(i - 1) // 4 for i in range(1, 25)]  # depths 0..3, each node after its parent
    rows = len(parents)
    node_slot = [PROMPT + 4 + i for i in range(rows)]
    depth, slot_map = tree_layout(parents, node_slot)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + rows,), generator=gen).to(device)
    options = KernelOptions(batch_invariant=True, tree_one_forward=True, norm_stats=norm_stats)
    assert routing.tree_rows(options, packed=False) == 64
    model = routed_model(cfg, device, options)
    positions = torch.tensor([PROMPT + d for d in depth], device=device)
    slots = torch.tensor(node_slot, device=device)
    bases = torch.full((rows,), PROMPT, dtype=torch.int32, device=device)
    slot_map = slot_map.to(device)
    results = []
    for chunk in (rows, 16):
        kv = new_cache(model, device)
        step_logits(model, kv, ids[:PROMPT], 0)
        logits = []
        with torch.inference_mode():
            for c in range(0, rows, chunk):
                part = slice(c, c + chunk)
                batch = ForwardBatch(input_ids=ids[PROMPT:][part], positions=positions[part], slots=slots[part],
                                     slot_map=slot_map[part], map_base=bases[part])
                logits.append(model.logits(model(batch, kv).hidden, tree=True))
        results.append((torch.cat(logits), torch.stack(kv.k), torch.stack(kv.v)))
    (whole, k_whole, v_whole), (chunks, k_chunks, v_chunks) = results
    assert whole.shape == (rows, cfg.vocab_size)
    assert torch.equal(whole, chunks) and torch.equal(k_whole, k_chunks) and torch.equal(v_whole, v_chunks)
