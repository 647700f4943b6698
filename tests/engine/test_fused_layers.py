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

import engine.ops as ops_module  # noqa: E402
from engine.batch import ForwardBatch  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.kernels.activation import silu_and_mul_ref  # noqa: E402
from engine.kernels.norm import add_rms_norm_ref  # noqa: E402
from engine.kv_cache import KVCache  # noqa: E402
from engine.model import CausalLM  # noqa: E402
from engine.ops import BatchInvariance, FusedLayerKernels, LayerKernels, Ops  # noqa: E402
from engine.rope import rope_cos_sin  # noqa: E402

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = pytest.param("cuda", marks=GPU)
CPU = pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)"))
MAX_LEN = 64
PROMPT = 20  # prefilled before the step: more than 16 rows, so the unfused ops


def _bf16(rows: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.zeros(rows, 8, dtype=dtype)


def _cpu_kernel_ops() -> Ops:
    """The CUDA policy (BatchInvariance) over torch norms and attention: on CPU its GEMVs run
    in Triton's interpreter."""
    inv = BatchInvariance()
    return Ops(add_rms_norm_ref, silu_and_mul_ref, None, None, inv.row_linear, inv.linear, inv)


def test_layer_kernels_choice(monkeypatch):
    """Fused only where the GEMV runs anyway: a bf16 decode row, or up to 16 bf16 rows in
    batch-invariant mode; never for packed forwards, longer steps, other dtypes, CPU ops."""
    ops = _cpu_kernel_ops()
    step = ForwardBatch.eager(torch.zeros(1, dtype=torch.long), 5)
    packed = ForwardBatch.packed(torch.zeros(1, dtype=torch.long), [1])

    def kind(x, batch=step, o=ops):
        k = o.layer_kernels(x, batch)
        if isinstance(k, FusedLayerKernels):
            return "invariant" if k.invariant else "row"
        assert type(k) is LayerKernels
        return "unfused"

    assert kind(_bf16(1)) == "row"
    assert [kind(_bf16(m)) for m in (2, 6, 16, 17, 64)] == ["unfused"] * 5
    assert kind(_bf16(1, torch.float32)) == kind(_bf16(1, torch.float16)) == "unfused"
    assert kind(_bf16(1), packed) == "unfused"
    ops.set_batch_invariant(True)
    monkeypatch.setattr(ops_module, "FUSE_INVARIANT", False)  # the default
    assert [kind(_bf16(m)) for m in (1, 2, 6, 16)] == ["unfused"] * 4
    monkeypatch.setattr(ops_module, "FUSE_INVARIANT", True)
    assert [kind(_bf16(m)) for m in (1, 2, 6, 16)] == ["invariant"] * 4
    assert kind(_bf16(17)) == kind(_bf16(6, torch.float32)) == kind(_bf16(6), packed) == "unfused"
    assert kind(_bf16(1), o=dataclasses.replace(ops, fuse=False)) == "unfused"
    assert kind(_bf16(1), o=Ops.for_device(torch.device("cpu"))) == "unfused"


def test_norm_tail_choice(monkeypatch):
    """A sublayer's last projection carries the next norm (LayerKernels.ending) only for one bf16 row
    without a draft, where that norm would be a launch of its own: before lm_head, or before a
    projection whose norm FUSED_TILES keeps unfused; and only with a residual to add."""
    from engine.layers import RMSNorm

    norm, qkv = RMSNorm(64, 1e-5), torch.nn.Linear(64, 192, bias=False)
    row = FusedLayerKernels(invariant=False, linear=None)
    monkeypatch.setattr(ops_module, "FUSED_TILES", {})
    assert callable(row.ending(_bf16(1), (norm, torch.nn.Linear(64, 1000), "lm_head")))
    assert row.ending(_bf16(1), (norm, qkv, "qkv")) is None  # K = 64: qkv takes the norm in its prologue
    monkeypatch.setattr(ops_module, "FUSED_TILES", {("row", "rms_norm_gemv", 192, 64): ops_module.UNFUSED})
    assert callable(row.ending(_bf16(1), (norm, qkv, "qkv")))
    assert row.ending(_bf16(1), None) is None and row.ending(None, (norm, qkv, "qkv")) is None
    assert row.ending(_bf16(2), (norm, qkv, "qkv")) is None
    assert row.ending(_bf16(1, torch.float32), (norm, qkv, "qkv")) is None
    assert FusedLayerKernels(invariant=True, linear=None).ending(_bf16(1), (norm, qkv, "qkv")) is None
    assert LayerKernels(None).ending(_bf16(1), (norm, qkv, "qkv")) is None
    monkeypatch.setattr(ops_module, "NORM_TAIL", False)
    assert row.ending(_bf16(1), (norm, qkv, "qkv")) is None


def test_fused_tiles_table(monkeypatch):
    """FUSED_TILES picks the tile per (mode, kernel, N, K), or UNFUSED: that projection runs
    the unfused pair; shapes not listed fuse with the built-in tile."""
    cfg = ops_module.GemvConfig(16, 256, 2, 4, 3)
    monkeypatch.setitem(ops_module.FUSED_TILES, ("row", "rms_norm_gemv", 960, 576), cfg)
    assert ops_module.fused_tile("row", "rms_norm_gemv", 960, 576) is cfg
    assert ops_module.fused_tile("invariant", "rms_norm_gemv", 960, 576) is None
    assert ops_module.fused_tile("row", "silu_mul_gemv", 576, 1536) is ops_module.row_tile(1536)
    assert ops_module.fused_tile("row", "rms_norm_gemv", 28672, 4096) == ops_module.UNFUSED
    # not listed, K >= 4096: unfused (an 8B-shaped head's lm_head), unless a tile is listed
    assert ops_module.fused_tile("row", "rms_norm_gemv", 32000, 4096) == ops_module.UNFUSED
    monkeypatch.setitem(ops_module.FUSED_TILES, ("row", "rms_norm_gemv", 32000, 4096), cfg)
    assert ops_module.fused_tile("row", "rms_norm_gemv", 32000, 4096) is cfg
    # a row-mode kernel set on several rows (a draft-extend) reads the invariant entries
    row = FusedLayerKernels(invariant=False, linear=None)
    w = torch.empty(4096, 14336)
    assert row._tile("silu_mul_gemv", w, 1) is ops_module.row_tile(14336)
    assert row._tile("silu_mul_gemv", w, 6) == ops_module.UNFUSED
    assert row._tile("silu_mul_gemv", torch.empty(576, 3072), 6) is None
    for (mode, kernel, _, _), tile in ops_module.FUSED_TILES.items():
        assert mode in ("row", "invariant") and kernel in ("rms_norm_gemv", "silu_mul_gemv")
        assert tile == ops_module.UNFUSED or isinstance(tile, ops_module.GemvConfig)


def test_norm_gemv_roles(monkeypatch):
    """NORM_GEMV fuses a one-row step's qkv or gate_up norm whatever FUSED_TILES says (a ROW_TILES
    entry picks the tile or cuBLAS); several rows, invariant mode and other projections keep
    FUSED_TILES; an unknown role stops with one line."""
    row, inv = FusedLayerKernels(invariant=False, linear=None), FusedLayerKernels(invariant=True, linear=None)
    qkv, gate_up, lm_head = torch.empty(6144, 4096), torch.empty(28672, 4096), torch.empty(32000, 4096)
    monkeypatch.setattr(ops_module, "NORM_GEMV", frozenset())
    assert all(row.norm_tile(role, w, 1) == ops_module.UNFUSED for role, w in [("qkv", qkv), ("gate_up", gate_up)])
    monkeypatch.setattr(ops_module, "NORM_GEMV", ops_module.parse_norm_gemv("qkv"))
    assert row.norm_tile("qkv", qkv, 1) is None and row.norm_tile("gate_up", gate_up, 1) == ops_module.UNFUSED
    assert row.norm_tile("qkv", qkv, 6) == ops_module.UNFUSED and inv.norm_tile("qkv", qkv, 1) == ops_module.UNFUSED
    assert row.norm_tile("", lm_head, 1) == ops_module.UNFUSED
    monkeypatch.setattr(ops_module, "NORM_GEMV", ops_module.parse_norm_gemv(" qkv,gate_up "))
    assert row.norm_tile("gate_up", gate_up, 1) is None
    tile = ops_module.GemvConfig(16, 512, 1, 4, 3)
    monkeypatch.setitem(ops_module.ROW_TILES, (28672, 4096), tile)
    monkeypatch.setitem(ops_module.ROW_TILES, (6144, 4096), ops_module.CUBLAS)
    assert row.norm_tile("gate_up", gate_up, 1) is tile and row.norm_tile("qkv", qkv, 1) == ops_module.UNFUSED
    assert ops_module.parse_norm_gemv("") == frozenset()
    with pytest.raises(SystemExit, match="LOCALCHAT_NORM_GEMV: unknown projection 'down'"):
        ops_module.parse_norm_gemv("qkv,down")


def test_unfused_entries_fall_back_to_the_unfused_pair(monkeypatch):
    """An UNFUSED shape runs add_rms_norm + Ops.linear / GatedMLP.down, as without fusion."""
    calls = []
    kernels = FusedLayerKernels(invariant=False, linear=lambda h, lin: calls.append("linear") or lin(h))
    lin = torch.nn.Linear(8, 4, bias=False)
    monkeypatch.setitem(ops_module.FUSED_TILES, ("row", "rms_norm_gemv", 4, 8), ops_module.UNFUSED)
    norm = __import__("engine.layers", fromlist=["RMSNorm"]).RMSNorm(8, 1e-6)
    x, res = torch.randn(1, 8), torch.randn(1, 8)
    out, stream = kernels.norm_linear(x, res, norm, lin)
    assert calls == ["linear"] and torch.equal(stream, x + res)
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


def make_models(cfg: ModelConfig, ops: Ops, device: str, seed: int = 0) -> tuple[CausalLM, CausalLM]:
    """(fused, unfused): one set of random bf16 weights under `ops` and under ops without fusion."""
    gen = torch.Generator().manual_seed(seed)
    models = []
    for o in (ops, dataclasses.replace(ops, fuse=False)):
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
        monkeypatch.setattr(ops_module, "FUSED_TILES", {})
    elif request.param == "norms apart":
        monkeypatch.setattr(ops_module, "FUSED_TILES", {**ops_module.FUSED_TILES, **norms_apart(model_config("llama", False))})
    return request.param


def expected_launches(cfg: ModelConfig, invariant: bool, rows: int = 1) -> dict[str, int]:
    mode = "invariant" if invariant else "row"
    kernels = FusedLayerKernels(invariant=invariant, linear=None)
    normed = lambda role, n, k: kernels.norm_tile(role, torch.empty(n, k), rows) != ops_module.UNFUSED  # noqa: E731
    qkv = cfg.num_heads * cfg.head_dim + 2 * cfg.num_kv_heads * cfg.head_dim
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    # One row: o_proj runs the post-attention norm where it stays unfused (NORM_TAIL); with the gated
    # MLP, down runs the next layer's input norm where that stays unfused, and the last one the final norm.
    tail = ops_module.NORM_TAIL and mode == "row" and rows == 1
    o_tails = L * (not normed("gate_up", 2 * I, H)) if tail else 0
    if ops_module.GATED_MLP and mode == "row" and rows == 1:  # each MLP: one gated launch, down plain
        down_tails = (L - 1) * (not normed("qkv", qkv, H)) + 1 if tail else 0
        return {"rms_norm_gemv": L * normed("qkv", qkv, H), "silu_mul_gemv": 0,
                "rms_norm_gated_gemv": L * normed("gate_up", 2 * I, H),
                "gated_gemv": L * (not normed("gate_up", 2 * I, H)), "gemv_add_norm": o_tails + down_tails}
    return {"rms_norm_gemv": L * (normed("qkv", qkv, H) + normed("gate_up", 2 * I, H)),
            "silu_mul_gemv": L * (ops_module.fused_tile(mode, "silu_mul_gemv", H, I) != ops_module.UNFUSED),
            "rms_norm_gated_gemv": 0, "gated_gemv": 0, "gemv_add_norm": o_tails}


@pytest.fixture
def fused_calls(monkeypatch):
    """Counts the fused launches the model makes: {"rms_norm_gemv": n, "silu_mul_gemv": n, ...}."""
    calls = {"rms_norm_gemv": 0, "silu_mul_gemv": 0, "rms_norm_gated_gemv": 0, "gated_gemv": 0, "gemv_add_norm": 0}
    for name in calls:
        real = getattr(ops_module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(ops_module, name, spy)
    return calls


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    """Max abs difference within rel of the reference's largest magnitude (logits of random
    models are small and bf16 rounds the residual stream differently between layouts)."""
    scale = want.float().abs().max().item()
    diff = (got.float() - want.float()).abs().max().item()
    assert diff <= rel * scale, f"max diff {diff:.3e} vs max |ref| {scale:.3e}"


def _fused_vs_unfused(device: str, arch: str, rows: int, invariant: bool, small: bool, fused_calls, rel: float,
                      monkeypatch, gated: bool = False):
    monkeypatch.setattr(ops_module, "FUSE_INVARIANT", True)  # the kernels' math, in both modes
    monkeypatch.setattr(ops_module, "GATED_MLP", gated)
    cfg = model_config(arch, small)
    ops = Ops.for_device(torch.device(device)) if device == "cuda" else _cpu_kernel_ops()
    ops = dataclasses.replace(ops, fuse=True)  # whatever LOCALCHAT_FUSE says
    ops.set_batch_invariant(invariant)
    fused, unfused = make_models(cfg, ops, device)
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, cfg.vocab_size, (PROMPT + rows,), generator=gen).to(device)
    got, want = [], []
    for model, out in ((fused, got), (unfused, want)):
        kv = new_cache(model, device)
        step_logits(model, kv, ids[:PROMPT], 0)  # prefill: unfused in both
        before = dict(fused_calls)
        out.append(step_logits(model, kv, ids[PROMPT:], PROMPT))
        launches = {k: fused_calls[k] - before[k] for k in fused_calls}
        expect = expected_launches(cfg, invariant, rows) if model is fused else {k: 0 for k in launches}
        assert launches == expect, launches
    assert got[0].shape == (rows, cfg.vocab_size)
    assert_close_rel(got[0], want[0], rel)


ROW_CASES = [(1, False, False), (1, False, True), (1, True, False), (6, True, True)]  # rows, invariant, gated


def norms_apart(cfg: ModelConfig) -> dict:
    """FUSED_TILES entries that keep a one-row step's qkv and gate_up norms unfused, as the 8B's
    are: the projections before them then carry the norm in their last program (NORM_TAIL)."""
    qkv = cfg.num_heads * cfg.head_dim + 2 * cfg.num_kv_heads * cfg.head_dim
    return {("row", "rms_norm_gemv", n, cfg.hidden_size): ops_module.UNFUSED
            for n in (qkv, 2 * cfg.intermediate_size)}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("rows,invariant,gated", ROW_CASES)
@pytest.mark.parametrize("norms", ["fused", "apart"])
def test_fused_step_equals_unfused_interpreter(arch, rows, invariant, gated, norms, fused_calls, monkeypatch):
    """A tiny model's decode/verify step with fused kernels == the unfused step (CPU interpreter);
    gated: a one-row step's MLP as gated_gemv + a plain down GEMV (ops.py GATED_MLP); norms apart:
    the one-row norms unfused, so that o_proj and down carry them (gemv_add_norm)."""
    if not INTERPRET:
        pytest.skip("set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
    if norms == "apart" and (rows, invariant) != (1, False):
        pytest.skip("the norm tails are one-row kernels")
    # tiny shapes: all fused, or the norms apart
    monkeypatch.setattr(ops_module, "FUSED_TILES", norms_apart(model_config(arch, True)) if norms == "apart" else {})
    _fused_vs_unfused("cpu", arch, rows, invariant, True, fused_calls, rel=2.5e-2, monkeypatch=monkeypatch,
                      gated=gated)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("rows,invariant,gated", ROW_CASES + [(16, True, False)])
def test_fused_step_equals_unfused_smollm2_shape(arch, rows, invariant, gated, tiles, fused_calls, monkeypatch):
    """A SmolLM2-135M-shaped random model (30 layers as Llama): the fused decode (1 row) and
    verify (6, 16 rows) steps give the unfused step's logits within bf16 tolerance, with the
    one-row MLP gated or not (gated changes one-row steps only)."""
    _fused_vs_unfused("cuda", arch, rows, invariant, False, fused_calls, rel=5e-2, monkeypatch=monkeypatch,
                      gated=gated)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("use_graphs", [False, True])
@pytest.mark.parametrize("fuse_invariant", [True, False])  # what speculation runs; the unfused invariant ops
def test_fused_invariant_verify_rows_equal_decode_steps(arch, use_graphs, fuse_invariant, tiles, fused_calls,
                                                        monkeypatch):
    """Batch-invariant mode, end to end: each row of a 6-row and a 16-row step has exactly the
    logits of the 1-row decode step of its token, eager and in captured graphs (ModelRunner),
    with the shipped policy and with the fused invariant kernels."""
    from engine.runner import ModelRunner

    monkeypatch.setattr(ops_module, "FUSE_INVARIANT", fuse_invariant)
    cfg = model_config(arch, small=False)
    ops = dataclasses.replace(Ops.for_device(torch.device("cuda")), fuse=True)
    ops.set_batch_invariant(True)
    model, _ = make_models(cfg, ops, "cuda", seed=1)
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
            want = expected_launches(cfg, True)["rms_norm_gemv"] if fuse_invariant else 0
            assert fused_calls["rms_norm_gemv"] - before == want
        assert torch.equal(verify, singles[:rows]), rows
    # and the 1-row steps again after the verify steps rewrote the cache rows: same bits
    again = runner.forward(ids[PROMPT + 3:PROMPT + 4], PROMPT + 3)[0]
    assert torch.equal(again, singles[3:4])


def test_row_tiles_spec():
    """LOCALCHAT_ROW_TILES: tiles or cuBLAS by weight shape; a bad entry is a one-line error."""
    tiles = ops_module.parse_row_tiles("4096x14336/4/1024/1/4/3|6144x4096/cublas|")
    assert tiles == {(4096, 14336): ops_module.GemvConfig(4, 1024, 1, 4, 3), (6144, 4096): ops_module.CUBLAS}
    for bad in ("4096x14336/4/1024", "4096/4/1024/1/4/3", "axb/cublas", "4096x4096/4/x/1/4/3"):
        with pytest.raises(SystemExit, match="LOCALCHAT_ROW_TILES: cannot read"):
            ops_module.parse_row_tiles(bad)
    assert ops_module.row_tile(14336).block_k == 1024 and ops_module.row_tile(1536).block_k == 512


def test_row_tiles_route_one_row_projections(monkeypatch):
    """A ROW_TILES entry sends that shape's one-row projection to cuBLAS or to our GEMV with the
    given tile; other shapes keep row_tile (o_proj, down), our GEMV's table (qkv, ROW_GEMV "qkv")
    or Ops.linear (gate_up)."""
    calls = []
    monkeypatch.setattr(ops_module, "gemv", lambda x, w, b, config=None: calls.append(config) or "gemv")
    monkeypatch.setitem(ops_module.ROW_TILES, (8, 4096), ops_module.CUBLAS)
    tile = ops_module.GemvConfig(2, 1024, 1, 4, 3)
    monkeypatch.setitem(ops_module.ROW_TILES, (16, 4096), tile)
    inv = ops_module.BatchInvariance()
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    cublas, tiled, plain = (torch.nn.Linear(4096, n, bias=False).to(torch.bfloat16) for n in (8, 16, 4))
    assert inv.row_linear(x, cublas).shape == (1, 8) and calls == []
    assert inv.row_linear(x, tiled) == "gemv" and calls == [tile]
    assert inv.row_linear(x, plain) == "gemv" and calls[-1] == ops_module.row_tile(4096)
    assert inv.layer_linear(x, cublas).shape == (1, 8)
    assert inv.layer_linear(x, tiled) == "gemv" and calls[-1] == tile
    assert inv.layer_linear(x, plain).shape == (1, 4) and len(calls) == 3
    # qkv: a ROW_TILES entry first, then our GEMV's own tile unless ROW_GEMV says cuBLAS
    assert inv.qkv_linear(x, cublas).shape == (1, 8) and len(calls) == 3
    assert inv.qkv_linear(x, plain) == "gemv" and calls[-1] is None and len(calls) == 4
    monkeypatch.setattr(ops_module, "ROW_GEMV", "cublas")
    assert inv.qkv_linear(x, plain).shape == (1, 4) and len(calls) == 4
    assert inv.qkv_linear(x.expand(2, -1), plain).shape == (2, 4) and len(calls) == 4
