"""On a GPU: a quantized checkpoint loaded packed (LOCALCHAT_PACKED_WEIGHTS=1) decodes through
packed_gemv, close to the same checkpoint dequantized to bf16, and greedy speculation over the packed
target (a draft loaded: the batch-invariant kernels) gives plain decoding's tokens."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def tokens(engine, speculative=None) -> list[int]:
    """48 greedy tokens after a fixed prompt, running on past EOS."""
    from engine.types import SamplingParams

    engine.tokenizer.eos_token_ids = frozenset()
    return [t for ev in engine.stream_ids(list(range(3, 40)), SamplingParams(max_tokens=48), speculative=speculative)
            for t in ev.token_ids]


def test_a_packed_target_decodes_and_speculates_like_plain_decoding(tmp_path):
    from engine.engine import Engine
    from engine.options import KernelOptions
    from engine.packed_linear import PackedLinear
    from tests.tiny_quant import awq_target_with_head

    target, head = awq_target_with_head(tmp_path)
    packed = Engine.load(str(target), draft=str(head), device="cuda", draft_steps=3,
                         options=KernelOptions(packed_weights=True))
    assert packed.runs_as == "AWQ-int4-g64"
    assert isinstance(packed.runner.model.model.layers[0].self_attn.qkv_proj, PackedLinear)
    plain = tokens(packed, speculative=False)
    assert tokens(packed, speculative=True) == plain
    dense = Engine.load(str(target), device="cuda", options=KernelOptions(packed_weights=False))
    assert dense.runs_as == "bf16"
    x = torch.randn(5, 128, device="cuda", dtype=torch.bfloat16)
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        a = packed.runner.model.model.layers[1].get_submodule(name)
        b = dense.runner.model.model.layers[1].get_submodule(name)
        xin = x if name != "mlp.down_proj" else torch.randn(5, b.in_features, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(a(xin).float(), b(xin).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K", "Q5_0"])
def test_a_packed_gguf_target_speculates_like_plain_decoding(tmp_path, qtype):
    """The k-quants' factored scales and the 5- and 6-bit planes through the whole engine: greedy
    speculation over the packed target gives its plain decoding's tokens, and its projections
    match the dequantized model's."""
    import json

    from engine.engine import Engine
    from engine.options import KernelOptions
    from engine.packed_linear import PackedLinear
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny_gguf import make_tiny_gguf

    # hidden 2,048: K long enough for the one-row kernel (row_kernel_fits)
    path = make_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", tmp_path / "work", qtype=qtype, hidden=2048)
    cfg = json.loads((tmp_path / "work" / "hf" / "config.json").read_text())
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(128, cfg["hidden_size"], 3, cfg["vocab_size"], 200, seed=2),
                      128, (0, 1, 2))

    packed = Engine.load(str(path), draft=str(head), device="cuda", draft_steps=3,
                         options=KernelOptions(packed_weights=True))
    assert packed.runs_as != "bf16", packed.runs_as
    assert isinstance(packed.runner.model.model.layers[0].mlp.down_proj, PackedLinear)
    assert tokens(packed, speculative=True) == tokens(packed, speculative=False)
    dense = Engine.load(str(path), device="cuda", options=KernelOptions(packed_weights=False))
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        a = packed.runner.model.model.layers[1].get_submodule(name)
        b = dense.runner.model.model.layers[1].get_submodule(name)
        x = torch.randn(5, b.in_features, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(a(x).float(), b(x).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q4_0", "Q6_K", "Q5_K", "Q8_0"])
def test_a_packed_target_without_a_draft_runs_its_faster_kernels(tmp_path, qtype):
    """No draft loaded: one-row steps on packed_row_gemv (x in bf16, and rounded to int8 as the
    engine runs them) and the 37-token prompt's prefill through packed_matmul, both within bf16
    rounding (int8 x: its rounding) of the dequantized model's projections, and the
    engine decodes its 48 tokens; the switches back to the batch-invariant kernel and the
    dequantizing prefill give the same projections within rounding."""
    from engine.engine import Engine
    from engine.options import KernelOptions
    from tests.tiny_gguf import make_tiny_gguf

    # hidden 2,048: K long enough for the one-row kernel (row_kernel_fits)
    path = make_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", tmp_path / "work", qtype=qtype, hidden=2048)
    packed = Engine.load(str(path), device="cuda", options=KernelOptions(packed_weights=True))
    assert len(tokens(packed)) == 48
    slow = Engine.load(str(path), device="cuda",
                       options=KernelOptions(packed_weights=True, packed_row=False, packed_prefill="dequant"))
    assert len(tokens(slow)) == 48
    dense = Engine.load(str(path), device="cuda", options=KernelOptions(packed_weights=False))
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        a = packed.runner.model.model.layers[1].get_submodule(name)
        b = dense.runner.model.model.layers[1].get_submodule(name)
        x = torch.randn(40, b.in_features, device="cuda", dtype=torch.bfloat16)
        want = b(x).float()
        # within bf16 rounding of outputs summed over 2,048-4,096 inputs: 1% of their largest
        tol = dict(atol=1e-2 * float(want.abs().max()), rtol=3e-2)
        for got in (a(x[:1], one_row=True), a(x, prefill="fused"), a(x, prefill="dequant"), a(x, prefill="torch")):
            torch.testing.assert_close(got.float(), want[:got.shape[0]], **tol)
        # x rounded to int8 (the engine's default one-row step): within that rounding, 3% of the largest
        got = a(x[:1], one_row=True, int8_x=True).float()
        assert float((got - want[:1]).abs().max()) <= 3e-2 * float(want[:1].abs().max()), name


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0"])
def test_a_packed_one_row_step_takes_x_rounded_by_the_kernel_before(tmp_path, qtype):
    """No draft loaded: a quantized layer's one-row step runs RoundingLayerKernels, whose norm
    and activation hand qkv, gate_up and down their row rounded to int8 (nibble and int8 word
    orders), as the attention's merge hands o_proj its row, within x's rounding of the set where
    each program rounds x itself; with LOCALCHAT_PACKED_ROUNDED_X=0 the plain set (and with
    LOCALCHAT_PACKED_ROUNDED_O=0 o_proj rounds its own); the engine decodes its 48 tokens either way."""
    import dataclasses
    from types import SimpleNamespace

    from engine.engine import Engine
    from engine.layer_kernels import RoundingLayerKernels
    from engine.ops import Ops
    from engine.options import KernelOptions
    from tests.tiny_gguf import make_tiny_gguf

    path = make_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", tmp_path / "work", qtype=qtype, hidden=2048)
    on = Engine.load(str(path), device="cuda", options=KernelOptions(packed_weights=True))
    off = Engine.load(str(path), device="cuda", options=KernelOptions(packed_weights=True, packed_rounded_x=False))
    step = SimpleNamespace(is_packed=False, slot_map=None)
    layer_on, layer_off = on.runner.model.model.layers[1], off.runner.model.model.layers[1]
    x, residual = (torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rounding = layer_on.ops.layer_kernels(x, step, False, True)
    plain = layer_off.ops.layer_kernels(x, step, False, True)
    assert isinstance(rounding, RoundingLayerKernels) and not isinstance(plain, RoundingLayerKernels)
    assert layer_on.mlp.down_proj.rounded_order() == (qtype != "Q8_0")
    # o_proj's row comes rounded from the attention's merge launch; not with the switches off, nor
    # for several rows
    assert layer_on.ops.rounds_for(layer_on.self_attn.o_proj, 1) == (qtype != "Q8_0")
    assert layer_off.ops.rounds_for(layer_off.self_attn.o_proj, 1) is None
    assert layer_on.ops.rounds_for(layer_on.self_attn.o_proj, 2) is None
    own = Ops.for_device(torch.device("cuda"), dataclasses.replace(layer_on.ops.options, packed_rounded_o=False))
    assert own.rounds_for(layer_on.self_attn.o_proj, 1) is None
    got, stream = rounding.norm_linear(x, residual, layer_on.input_layernorm, layer_on.self_attn.qkv_proj, "qkv")
    want, want_stream = plain.norm_linear(x, residual, layer_off.input_layernorm, layer_off.self_attn.qkv_proj, "qkv")
    assert torch.equal(stream, want_stream)
    assert float((got.float() - want.float()).abs().max()) <= 3e-2 * float(want.float().abs().max())
    got, _ = rounding.mlp(x, residual, layer_on.post_attention_layernorm, layer_on.mlp)
    want, _ = plain.mlp(x, residual, layer_off.post_attention_layernorm, layer_off.mlp)
    assert float((got.float() - want.float()).abs().max()) <= 3e-2 * float(want.float().abs().max())
    assert len(tokens(on)) == 48 and len(tokens(off)) == 48


_CT_GROUP = {"targets": ["Linear"], "input_activations": None}
# Safetensors layouts at hidden 2,048 (K long enough for the one-row kernel): (packer, its
# options, quantization_config, the label the engine reports)
SAFETENSORS_LAYOUTS = {
    "fp8 per channel": ("fp8", {"per_channel": True}, {"quant_method": "fp8", "activation_scheme": "dynamic"},
                        "FP8-e4m3"),
    "fp8 per tensor": ("fp8", {"per_channel": False}, {"quant_method": "fp8", "activation_scheme": "static"},
                       "FP8-e4m3"),
    "fp8 blocks": ("fp8_block", {"block": (128, 128), "scale_dtype": torch.bfloat16},
                   {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
                   "FP8-e4m3-block128x128"),
    "ct int4 g128": ("ct_int", {"bits": 4, "group_size": 128, "sym": True},
                     {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
                         **_CT_GROUP, "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}, "CT-int4-g128"),
    "ct int4 g32 asym": ("ct_int", {"bits": 4, "group_size": 32, "sym": False},
                         {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
                             **_CT_GROUP, "weights": {"num_bits": 4, "type": "int", "group_size": 32,
                                                      "symmetric": False}}}}, "CT-int4-g32"),
    "ct int8 channel": ("ct_int", {"bits": 8, "group_size": -1, "sym": True, "layout": "int8"},
                        {"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"g": {
                            **_CT_GROUP, "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}},
                        "CT-int8-per-channel"),
}


@pytest.mark.parametrize("layout", list(SAFETENSORS_LAYOUTS))
def test_a_safetensors_checkpoint_without_a_draft_runs_the_row_kernel(tmp_path, layout):
    """An FP8 or compressed-tensors checkpoint (hidden 2,048), no draft loaded: one-row steps on
    packed_row_gemv, within bf16 rounding of the dequantized model's projections and of the
    batch-invariant kernel's; the engine decodes its 48 tokens."""
    from engine.engine import Engine
    from engine.kernels.packed_gemv import packed_row_gemv
    from engine.options import KernelOptions
    from engine.packed_linear import kernel_for
    from tests.tiny import make_tiny_model
    from tests.tiny_quant import quantized_folder

    method, options, qcfg, label = SAFETENSORS_LAYOUTS[layout]
    if "fp8" in method and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    src = make_tiny_model(tmp_path / "float", "llama", num_layers=2, hidden=2048, seed=3)
    target = tmp_path / "quantized"
    quantized_folder(src, target, method, qcfg, **options)
    packed = Engine.load(str(target), device="cuda", options=KernelOptions(packed_weights=True))
    assert packed.runs_as == label
    assert len(tokens(packed)) == 48
    dense = Engine.load(str(target), device="cuda", options=KernelOptions(packed_weights=False))
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        a = packed.runner.model.model.layers[1].get_submodule(name)
        b = dense.runner.model.model.layers[1].get_submodule(name)
        assert all(kernel_for(block, 1, one_row=True) is packed_row_gemv for block in a.blocks), name
        x = torch.randn(8, b.in_features, device="cuda", dtype=torch.bfloat16)
        want = b(x).float()
        tol = dict(atol=1e-2 * float(want.abs().max()), rtol=3e-2)
        for i in range(4):
            torch.testing.assert_close(a(x[i:i + 1], one_row=True).float(), want[i:i + 1], **tol)
            torch.testing.assert_close(a(x[i:i + 1], one_row=False).float(), want[i:i + 1], **tol)
        got = a(x[:1], one_row=True, int8_x=True).float()  # x rounded to int8 (FP8 ignores it)
        assert float((got - want[:1]).abs().max()) <= 3e-2 * float(want[:1].abs().max()), name


@pytest.mark.parametrize("layout", ["ct int4 g32 asym", "fp8 blocks"])
def test_a_packed_safetensors_target_speculates_like_plain_decoding(tmp_path, layout):
    """compressed-tensors and FP8-block targets with an EAGLE-3 head: the batch-invariant kernels'
    greedy speculation gives plain decoding's tokens."""
    from engine.engine import Engine
    from engine.options import KernelOptions
    from engine.packed_linear import PackedLinear
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import make_tiny_model, read_config
    from tests.tiny_quant import quantized_folder

    method, options, qcfg, label = SAFETENSORS_LAYOUTS[layout]
    if "fp8" in method and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    src = make_tiny_model(tmp_path / "float", "llama", num_layers=3, hidden=256, seed=5)
    quantized_folder(src, tmp_path / "q", method, qcfg, **options)
    cfg = read_config(src)
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(128, 256, 3, cfg["vocab_size"], 200, seed=1),
                      128, (1, 2, 3))
    packed = Engine.load(str(tmp_path / "q"), draft=str(head), device="cuda", draft_steps=3,
                         options=KernelOptions(packed_weights=True))
    assert packed.runs_as == label
    assert isinstance(packed.runner.model.model.layers[0].mlp.gate_up_proj, PackedLinear)
    assert tokens(packed, speculative=True) == tokens(packed, speculative=False)


def _replayed(step, outs: list[torch.Tensor]) -> torch.Tensor:
    """step() once eagerly (compiling its kernels), then captured in a CUDA graph and replayed into
    zeroed outs: what the replay wrote, outs concatenated."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for o in outs:
        o.zero_()
    graph.replay()
    torch.cuda.synchronize()
    return torch.cat(outs)


@pytest.mark.parametrize("layout,role", [("AWQ", "o_proj"), ("AWQ", "qkv"), ("Q4_K_M", "o_proj"), ("Q4_K_M", "qkv")])
def test_the_row_kernel_under_pdl_reads_what_the_kernel_before_it_wrote(layout, role):
    """A PDL norm writes x, then the one-row kernel reads it (one block, or Q4_K_M's two in one
    launch), 32 times in one CUDA graph: with PDL 1 and 2 (KernelOptions.packed_row_pdl), and each
    with the first step's weights loaded before the wait (packed_row_early_weights), every output
    has the bits of the launch without PDL, so the kernel waits before it reads x."""
    from benchmarks.bench_packed import blocks_for
    from engine.kernels.norm import add_rms_norm
    from engine.kernels.packed_gemv import (ROW_PDL_EARLY_W, blocks_fit_one_launch, packed_row_gemv,
                                            packed_row_gemv_blocks)

    dev = torch.device("cuda")
    blocks = blocks_for(layout, role, dev, torch.Generator(device=dev).manual_seed(0))
    k, n = blocks[0].shape[1], sum(b.shape[0] for b in blocks)
    xs = [torch.randn(1, k, device=dev, dtype=torch.bfloat16) for _ in range(32)]
    norm_weight = torch.ones(k, device=dev, dtype=torch.bfloat16)
    got = {}
    modes = (0, 1, 2, 1 | ROW_PDL_EARLY_W, 2 | ROW_PDL_EARLY_W)
    for mode in modes:
        outs = [torch.empty(1, n, device=dev, dtype=torch.bfloat16) for _ in xs]

        def step():
            for x, o in zip(xs, outs):
                y, _ = add_rms_norm(x, None, norm_weight, 1e-5)
                if blocks_fit_one_launch(blocks):
                    cut = blocks[0].shape[0]
                    packed_row_gemv_blocks(y, blocks, [None, None], [o[:, :cut], o[:, cut:]], int8_x=True, pdl=mode)
                else:
                    packed_row_gemv(y, blocks[0], None, out=o, int8_x=True, pdl=mode)

        got[mode] = _replayed(step, outs)
    assert all(torch.equal(got[mode], got[0]) for mode in modes[1:])


@pytest.mark.parametrize("layout,role,config", [("AWQ", "qkv", None), ("Q4_K_M", "qkv", None),
                                                 ("Q4_1", "qkv", "smollm2-135m"), ("Q4_1", "down", "smollm2-135m"),
                                                 ("Q4_1", "lm_head", "smollm2-135m")])
def test_packed_gemv_under_pdl_reads_what_the_kernel_before_it_wrote(layout, role, config):
    """A PDL norm writes x (1 or 16 rows), then packed_gemv reads it (a launch a block), 32 times in
    one CUDA graph: with PDL (KernelOptions.packed_gemv_pdl 1 and 2) every output has the bits of
    the launch without, so the kernel waits before it reads x; and at a short K (the demo's shape, its
    short-K tile) each of 16 rows has the bits of its 1-row call."""
    import json
    from pathlib import Path

    from benchmarks.bench_packed import blocks_for, model_shapes
    from engine.kernels.norm import add_rms_norm
    from engine.kernels.packed_gemv import default_tile, packed_gemv

    dev = torch.device("cuda")
    shapes, parts = model_shapes(json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "configs"
                                             / f"{config}.json").read_text()) if config else None,
                                 lm_head=role == "lm_head")
    blocks = blocks_for(layout, role, dev, torch.Generator(device=dev).manual_seed(0), shapes, parts)
    k, n = blocks[0].shape[1], sum(b.shape[0] for b in blocks)
    if config:
        # the short-K tile; a tied lm_head's many columns, 64 a program over K whole
        assert default_tile(blocks[0].shape[0], k, blocks[0].group).block_n == (64 if role == "lm_head" else 32)
    norm_weight = torch.ones(k, device=dev, dtype=torch.bfloat16)
    for rows in (1, 16):
        xs = [torch.randn(rows, k, device=dev, dtype=torch.bfloat16) for _ in range(32)]
        got = {}
        for pdl in (0, 1, 2):
            outs = [torch.empty(rows, n, device=dev, dtype=torch.bfloat16) for _ in xs]

            def step():
                for x, o in zip(xs, outs):
                    y, _ = add_rms_norm(x, None, norm_weight, 1e-5)
                    start = 0
                    for b in blocks:
                        packed_gemv(y, b, None, out=o[:, start:start + b.shape[0]], pdl=pdl)
                        start += b.shape[0]

            got[pdl] = _replayed(step, outs)
        assert torch.equal(got[1], got[0]) and torch.equal(got[2], got[0]), rows
        if rows == 16:  # the first x's rows, each alone
            y = add_rms_norm(xs[0], None, norm_weight, 1e-5)[0]
            one = torch.cat([torch.cat([packed_gemv(y[i:i + 1], b) for b in blocks], dim=1) for i in range(16)])
            assert torch.equal(one, got[1][:16])
