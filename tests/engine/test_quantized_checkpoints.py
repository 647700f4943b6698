"""AWQ, GPTQ and FP8 safetensors checkpoints load through PackedWeight: the model holds exactly the
weights the checkpoint stands for (the formats' formulas, tests/tiny_quant.py) and gives the
greedy tokens of the float32 model built from them; what they lack is refused in one line."""

import json
import shutil

import pytest
import torch

from engine import Engine
from engine.errors import ModelLoadError
from engine.types import SamplingParams
from tests.tiny import make_tiny_model
from tests.tiny_quant import quantized_folder

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
       "modules_to_not_convert": None}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True, "damp_percent": 0.01,
        "true_sequential": True, "checkpoint_format": "gptq"}
FP8 = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
FP8_BLOCK = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
CT = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
      "version": "0.10.0", "ignore": ["lm_head"], "sparsity_config": {}, "kv_cache_scheme": None,
      "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                                    "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                                "group_size": 128, "actorder": None, "dynamic": False}}}}
INT8_TOKENS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}


def _ct(weights: dict, format: str = "pack-quantized", input_activations=None) -> dict:
    group = CT["config_groups"]["group_0"]
    return {**CT, "format": format, "config_groups": {"group_0": {
        **group, "weights": {**group["weights"], **weights}, "input_activations": input_activations}}}


CASES = {  # name: (method, quantization_config, packer options, the label run --json reports)
    "awq-g128": ("awq", AWQ, {"group_size": 128}, "AWQ-int4-g128"),
    "awq-g64": ("awq", {**AWQ, "group_size": 64}, {"group_size": 64}, "AWQ-int4-g64"),
    "gptq-g32-sym": ("gptq", GPTQ, {"group_size": 32, "sym": True, "v2": False}, "GPTQ-int4-g32"),
    # AutoGPTQ's own configs name no checkpoint_format: the original format
    "gptq-g128-autogptq": ("gptq", {k: v for k, v in GPTQ.items() if k != "checkpoint_format"} | {"group_size": 128},
                           {"group_size": 128, "sym": True, "v2": False}, "GPTQ-int4-g128"),
    "gptq-v2-per-channel-asym": ("gptq", {**GPTQ, "group_size": -1, "sym": False, "checkpoint_format": "gptq_v2"},
                                 {"group_size": -1, "sym": False, "v2": True}, "GPTQ-int4-per-channel"),
    "fp8-per-tensor": ("fp8", FP8, {"per_channel": False}, "FP8-e4m3"),
    "fp8-per-channel": ("fp8", FP8, {"per_channel": True}, "FP8-e4m3"),
    # DeepSeek-V3 and Qwen3 FP8 files: 128 x 128 blocks (k_proj's 64 rows and the 128-wide hidden
    # cut the edge blocks short), scales fp32 or bf16
    "fp8-block-128": ("fp8_block", FP8_BLOCK, {"block": (128, 128)}, "FP8-e4m3-block128x128"),
    "fp8-block-32x64-bf16": ("fp8_block", {**FP8_BLOCK, "weight_block_size": [32, 64]},
                             {"block": (32, 64), "scale_dtype": torch.bfloat16}, "FP8-e4m3-block32x64"),
    # llm-compressor's compressed-tensors checkpoints
    "ct-w4a16-g128": ("ct_int", CT, {"bits": 4, "group_size": 128, "sym": True}, "CT-int4-g128"),
    "ct-w4a16-asym-g32": ("ct_int", _ct({"symmetric": False, "group_size": 32}),
                          {"bits": 4, "group_size": 32, "sym": False}, "CT-int4-g32"),
    "ct-w4a16-asym-zp-unpacked": ("ct_int", _ct({"symmetric": False, "group_size": 64}),
                                  {"bits": 4, "group_size": 64, "sym": False, "zp_packed": False}, "CT-int4-g64"),
    "ct-w8a16-per-channel": ("ct_int", _ct({"num_bits": 8, "strategy": "channel", "group_size": None}),
                             {"bits": 8, "group_size": -1, "sym": True}, "CT-int8-per-channel"),
    "ct-w8a8-int-quantized": ("ct_int", _ct({"num_bits": 8, "strategy": "channel", "group_size": None},
                                            format="int-quantized", input_activations=INT8_TOKENS),
                              {"bits": 8, "group_size": -1, "sym": True, "layout": "int8"}, "CT-int8-per-channel"),
    "ct-fp8-dynamic": ("ct_fp8", _ct({"num_bits": 8, "type": "float", "strategy": "channel", "group_size": None},
                                     format="float-quantized"), {"per_channel": True}, "CT-fp8"),
    "ct-fp8-block": ("ct_fp8", _ct({"num_bits": 8, "type": "float", "strategy": "block", "group_size": None,
                                    "block_structure": [128, 128]}, format="float-quantized"),
                     {"block": (128, 128), "name": "weight_scale", "scale_dtype": torch.bfloat16}, "CT-fp8"),
}
PROMPT_IDS = list(range(3, 40))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny Llama with hidden 128 (every group size divides both 128 and the MLP's 256)."""
    return make_tiny_model(tmp_path_factory.mktemp("quant") / "float", "llama", hidden=128)


def _float_folder(src, dst, weights: dict[str, torch.Tensor]):
    """`src` with its weights replaced by `weights` in float32."""
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    return dst


def _greedy(engine: Engine) -> list[int]:
    engine.tokenizer.eos_token_ids = frozenset()  # random weights: never stop early
    return [t for ev in engine.stream_ids(PROMPT_IDS, SamplingParams(max_tokens=16)) for t in ev.token_ids]


@pytest.mark.parametrize("case", list(CASES))
def test_a_quantized_checkpoint_is_the_float_model_of_its_weights(case, tiny, tmp_path):
    method, qcfg, options, label = CASES[case]
    meant = quantized_folder(tiny, tmp_path / case, method, qcfg, **options)
    ours = Engine.load(str(tmp_path / case), device="cpu")
    assert ours.weights == label
    params = dict(ours.runner.model.named_parameters())
    for name, w in meant.items():
        if name in params:  # lm_head and the embeddings, and every decoder weight
            assert torch.equal(params[name], w), name
    reference = Engine.load(str(_float_folder(tiny, tmp_path / "float", meant)), device="cpu")
    assert reference.weights == "fp32"
    tokens = _greedy(ours)
    assert tokens == _greedy(reference)
    assert len(set(tokens)) > 3


@pytest.mark.parametrize("case", ["awq-g128", "gptq-g32-sym", "gptq-v2-per-channel-asym", "fp8-per-channel",
                                  "ct-w4a16-asym-g32", "ct-w8a8-int-quantized", "fp8-block-128"])
def test_a_quantized_checkpoint_kept_packed_gives_the_same_tokens(case, tiny, tmp_path, monkeypatch):
    """With packing on (forced here on the CPU, where each call dequantizes), the decoder layers'
    projections are PackedLinears and the greedy tokens those of the dequantizing load."""
    import engine.loader as loader
    from engine.packed_linear import PackedLinear

    method, qcfg, options, label = CASES[case]
    quantized_folder(tiny, tmp_path / case, method, qcfg, **options)
    plain = Engine.load(str(tmp_path / case), device="cpu")
    monkeypatch.setattr(loader, "packs_weights", lambda device, dtype, options, *rest: True)
    packed = Engine.load(str(tmp_path / case), device="cpu")
    mlp = packed.runner.model.model.layers[0].mlp
    if "fp8" in method:  # a device without FP8 (compute capability < 8.9; the CPU) dequantizes it
        assert packed.runs_as == "fp32" and not isinstance(mlp.gate_up_proj, PackedLinear)
    else:
        assert packed.runs_as == label and plain.runs_as == "fp32"
        assert isinstance(mlp.gate_up_proj, PackedLinear) and isinstance(mlp.down_proj, PackedLinear)
    assert _greedy(packed) == _greedy(plain)


def _write(folder, config: dict | None = None, drop: str | None = None, change: dict | None = None):
    from safetensors.torch import load_file, save_file

    if config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["quantization_config"] = config
        (folder / "config.json").write_text(json.dumps(cfg))
    if drop or change:
        state = load_file(str(folder / "model.safetensors"))
        state.pop(drop, None)
        state.update(change or {})
        save_file(state, str(folder / "model.safetensors"))


def _refusal(folder) -> str:
    with pytest.raises(ModelLoadError) as e:
        Engine.load(str(folder), device="cpu")
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unsupported_settings_are_refused_in_one_line(tiny, tmp_path):
    folder = tmp_path / "gptq"
    quantized_folder(tiny, folder, "gptq", GPTQ, group_size=32, sym=True, v2=False)
    _write(folder, {**GPTQ, "desc_act": True})
    assert "desc_act = true is not supported" in _refusal(folder)
    _write(folder, {**AWQ, "version": "gemv"})
    assert "quantization_config.version = \"gemv\"" in _refusal(folder)
    _write(folder, {"quant_method": "bitsandbytes", "load_in_4bit": True})
    assert "quant_method \"bitsandbytes\" is not supported" in _refusal(folder)


def test_act_order_weights_are_refused_even_when_the_config_denies_it(tiny, tmp_path):
    folder = tmp_path / "gptq"
    quantized_folder(tiny, folder, "gptq", GPTQ, group_size=32, sym=True, v2=False)
    name = "model.layers.1.mlp.down_proj.g_idx"
    g_idx = (torch.arange(256, dtype=torch.int32) // 32).flip(0).contiguous()
    _write(folder, change={name: g_idx})
    assert name in _refusal(folder) and "act-order" in _refusal(folder)


def test_a_missing_part_is_named(tiny, tmp_path):
    folder = tmp_path / "awq"
    quantized_folder(tiny, folder, "awq", AWQ, group_size=128)
    _write(folder, drop="model.layers.0.self_attn.v_proj.qzeros")
    msg = _refusal(folder)
    assert "model.layers.0.self_attn.v_proj.qzeros" in msg and "AWQ" in msg


def test_packed_tensors_without_a_quantization_config_are_unexpected(tiny, tmp_path):
    folder = tmp_path / "awq"
    quantized_folder(tiny, folder, "awq", AWQ, group_size=128)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["quantization_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    msg = _refusal(folder)
    assert "qweight" in msg and "unexpected" in msg


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_packed_projections_with_biases_and_qk_norms(arch, tmp_path, monkeypatch):
    """Qwen2's q/k/v biases (which arrive as floats beside the packed weights, for a projection
    built on the meta device) and Qwen3's q/k norms: packed, the greedy tokens of the dequantizing
    load."""
    import engine.loader as loader
    from engine.packed_linear import PackedLinear

    src = make_tiny_model(tmp_path / "float", arch, hidden=128)
    quantized_folder(src, tmp_path / "awq", "awq", AWQ | {"group_size": 64}, group_size=64)
    plain = Engine.load(str(tmp_path / "awq"), device="cpu")
    monkeypatch.setattr(loader, "packs_weights", lambda device, dtype, options, *rest: True)
    packed = Engine.load(str(tmp_path / "awq"), device="cpu")
    qkv = packed.runner.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, PackedLinear)
    if arch == "qwen2":
        assert qkv.bias is not None and not qkv.bias.is_meta
        assert torch.equal(qkv.bias, plain.runner.model.model.layers[0].self_attn.qkv_proj.bias)
    assert _greedy(packed) == _greedy(plain)


def test_compressed_tensors_words_hold_the_documented_bits():
    """The pack-quantized layout as compressed-tensors documents it: q + 8 along K, eight a word,
    the first lowest (q = -8, -1, 0, 7, 3, -2, 5, 1 is the word 0x9D6BF870), the last word
    zero-padded past K; a zero point packed the same way along N."""
    from engine.weights.packed import dequantize, int_weight

    word = torch.tensor([[0x9D6BF870 - (1 << 32), 0x00000098]], dtype=torch.int32)  # then q = 0, 1, padding
    p = int_weight(word, torch.tensor([[0.5]], dtype=torch.bfloat16), None, torch.tensor([1, 10]), None, "layer")
    assert p.shape == (1, 10) and p.bits == 4 and p.group_size == 10
    assert dequantize(p).tolist() == [[v * 0.5 for v in (-8, -1, 0, 7, 3, -2, 5, 1, 0, 1)]]
    rows = torch.tensor([[0x9D6BF870 - (1 << 32)]] * 8, dtype=torch.int32)  # 8 rows of 8 inputs, one group
    zp = torch.tensor([[0x9D6BF870 - (1 << 32)]], dtype=torch.int32)  # zero points -8, -1, ..., 1 by row
    p = int_weight(rows, torch.ones(8, 1), zp, torch.tensor([8, 8]), None, "layer")
    q = torch.tensor([-8, -1, 0, 7, 3, -2, 5, 1], dtype=torch.float32)
    assert torch.equal(dequantize(p), q[None, :] - q[:, None])


def _ct_folder(tiny, tmp_path, **options):
    folder = tmp_path / "ct"
    method, qcfg, opts, _ = CASES["ct-w4a16-asym-g32"]
    quantized_folder(tiny, folder, method, qcfg, **(opts | options))
    return folder


def test_compressed_tensors_refusals_name_the_tensor(tiny, tmp_path):
    folder = _ct_folder(tiny, tmp_path)
    name = "model.layers.1.mlp.down_proj"
    _write(folder, change={f"{name}.weight_g_idx": (torch.arange(256, dtype=torch.int32) // 32).flip(0).contiguous()})
    assert f"{name}.weight_g_idx reorders the groups" in _refusal(folder)
    _write(folder, change={f"{name}.weight_g_idx": torch.arange(256, dtype=torch.int32) // 32})
    Engine.load(str(folder), device="cpu")  # the order of the groups as they are: taken
    _write(folder, change={f"{name}.weight_zero_point": torch.zeros(3, 8, dtype=torch.int32)})
    assert f"{name}.weight_zero_point is int32 of shape (3, 8)" in _refusal(folder)
    _write(folder, drop=f"{name}.weight_shape")
    assert f"lacks {name}.weight_shape; the checkpoint is not a complete compressed-tensors" in _refusal(folder)
    _write(folder, {**CT, "format": "marlin-24"})
    assert 'format = "marlin-24" is not supported' in _refusal(folder)


def test_fp8_blocks_of_the_wrong_grid_are_refused(tiny, tmp_path):
    folder = tmp_path / "fp8"
    method, qcfg, opts, _ = CASES["fp8-block-128"]
    quantized_folder(tiny, folder, method, qcfg, **opts)
    name = "model.layers.0.mlp.down_proj.weight_scale_inv"
    _write(folder, change={name: torch.ones(3, 3)})
    assert f"{name} has shape (3, 3): expected a (1, 2) grid of blocks" in _refusal(folder)
