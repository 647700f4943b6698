"""quantization_config: what is read, the label it gives, and every unsupported setting refused in one line."""

import pytest

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.quant_config import QuantConfig

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4}


CT_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "version": "0.9.4", "ignore": ["lm_head"], "config_groups": {"g": {
                "targets": ["Linear"], "input_activations": None, "output_activations": None,
                "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
                            "actorder": None, "dynamic": False, "observer": "minmax"}}}}
_W = CT_W4A16["config_groups"]["g"]["weights"]


def _ct(weights=None, **top):
    """CT_W4A16 with its one group's weights changed, and top-level keys changed."""
    group = {**CT_W4A16["config_groups"]["g"], "weights": {**_W, **(weights or {})}}
    return {**CT_W4A16, "config_groups": {"g": group}, **top}


@pytest.mark.parametrize("raw,expected,label", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
     QuantConfig("awq", 128), "AWQ-int4-g128"),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "version": "GEMM"}, QuantConfig("awq", 64),
     "AWQ-int4-g64"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
     QuantConfig("gptq", 128, zero_offset=1), "GPTQ-int4-g128"),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1, "checkpoint_format": "gptq_v2"},
     QuantConfig("gptq", -1, zero_offset=0), "GPTQ-int4-per-channel"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32, "format": "gptq_v2", "pack_dtype": "int32"},
     QuantConfig("gptq", 32, zero_offset=0), "GPTQ-int4-g32"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, QuantConfig("fp8"), "FP8-e4m3"),
    ({"quant_method": "FP8", "fmt": "e4m3", "activation_scheme": "static", "weight_block_size": None},
     QuantConfig("fp8"), "FP8-e4m3"),
    # DeepSeek-V3's and Qwen3's FP8 files
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
     QuantConfig("fp8", block=(128, 128)), "FP8-e4m3-block128x128"),
    # llm-compressor's presets as its checkpoints write them
    (CT_W4A16, QuantConfig("compressed-tensors", 128, schemes=(("int", 4),)), "CT-int4-g128"),
    ({**CT_W4A16, "format": "mixed-precision",
      "config_groups": {"g": {**CT_W4A16["config_groups"]["g"], "format": "pack-quantized",
                              "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}}}},
     QuantConfig("compressed-tensors", -1, schemes=(("int", 8),)), "CT-int8-per-channel"),
    ({**CT_W4A16, "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}}},
     QuantConfig("compressed-tensors", -1, schemes=(("float", 8),)), "CT-fp8"),
    ({**CT_W4A16, "format": "float-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                           "block_structure": [128, 128]}}}},
     QuantConfig("compressed-tensors", -1, block=(128, 128), schemes=(("float", 8),)), "CT-fp8"),
    ({**CT_W4A16, "format": "float-quantized", "config_groups": {"g": {  # the older block string
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                           "block_structure": "64x128"}}}},
     QuantConfig("compressed-tensors", -1, block=(64, 128), schemes=(("float", 8),)), "CT-fp8"),
    ({**CT_W4A16, "format": "int-quantized", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}},
      "sparsity_config": {}, "kv_cache_scheme": None},
     QuantConfig("compressed-tensors", -1, schemes=(("int", 8),)), "CT-int8-per-channel"),
    ({**CT_W4A16, "format": "mixed-precision", "config_groups": {
        "attn": {"targets": ["re:.*self_attn.*"], "format": "pack-quantized",
                 "weights": {"num_bits": 8, "type": "int", "group_size": 128, "strategy": "group"}},
        "mlp": {"targets": ["re:.*mlp.*"], "format": "pack-quantized",
                "weights": {"num_bits": 4, "type": "int", "group_size": 128, "strategy": "group"}}}},
     QuantConfig("compressed-tensors", 128, schemes=(("int", 8), ("int", 4))), "CT-int4+int8"),
])
def test_supported_configs(raw, expected, label):
    assert QuantConfig.from_hf(raw) == expected and expected.label == label
    assert ModelConfig.from_hf({**BASE, "quantization_config": raw}).quantization == expected


def test_older_compressed_tensors_checkpoints_keep_it_as_compression_config():
    assert ModelConfig.from_hf({**BASE, "compression_config": CT_W4A16}).quantization.label == "CT-int4-g128"


def test_no_quantization_config_is_a_float_model():
    assert ModelConfig.from_hf(BASE).quantization is None
    assert ModelConfig.from_hf({**BASE, "quantization_config": None}).quantization is None


@pytest.mark.parametrize("raw,says", [
    ({"quant_method": "bitsandbytes"},
     'quant_method "bitsandbytes" is not supported (supported: awq, gptq, fp8, compressed-tensors)'),
    ({"quant_method": "compressed-tensors"}, "compressed-tensors config has no config_groups"),
    (_ct(format="marlin-24"), 'quantization_config.format = "marlin-24" is not supported; 2:4-sparse Marlin'),
    (_ct(format="nvfp4-pack-quantized"), '"nvfp4-pack-quantized" is not supported; FP4 weights are not decoded'),
    (_ct(format="bitpacked"), 'format = "bitpacked" is not supported; supported: pack-quantized'),
    (_ct(sparsity_config={"format": "sparse-24-bitmask", "sparsity_structure": "2:4"}),
     "quantization_config.sparsity_config = {"),
    (_ct(transform_config={"config_groups": {"u": {"type": "hadamard"}}}), "transform_config"),
    (_ct({"num_bits": 2}), "config_groups.g.weights.num_bits = 2 is not supported; int weights are 4- or 8-bit"),
    (_ct({"type": ["int"]}), 'weights.type = ["int"] is not supported; weights are int or float'),
    (_ct({"num_bits": "4"}), 'weights.num_bits = "4" is not supported'),
    (_ct(format=["pack-quantized"]), 'format = ["pack-quantized"] is not supported; a format is a name'),
    (_ct({"type": "float", "num_bits": 4}), "weights.num_bits = 4 is not supported; float weights are FP8"),
    (_ct({"strategy": "tensor_group"}), 'weights.strategy = "tensor_group" is not supported'),
    (_ct({"group_size": 256}), "weights.group_size = 256 is not supported; group sizes are 32, 64, 128"),
    (_ct({"strategy": "block", "block_structure": [128, 128]}), "block scales are read for FP8 weights"),
    (_ct({"type": "float", "num_bits": 8, "strategy": "block", "block_structure": [128, 100]}, format="float-quantized"),
     "block sides are powers of two"),
    (_ct({"type": "float", "num_bits": 8, "strategy": "block"}, format="float-quantized"),
     "weights.block_structure = null is not supported; a block is [rows, inputs]"),
    (_ct({"type": "float", "num_bits": 8, "strategy": "channel"}),
     'format = "pack-quantized" is not supported; it does not hold float weights'),
    ({**CT_W4A16, "config_groups": {"g": {"targets": ["Linear"], "weights": None}}}, "quantizes no weights"),
    ({"bits": 4}, "quant_method null is not supported"),
    ({"quant_method": "awq", "bits": 8}, "AWQ with quantization_config.bits = 8 is not supported; only 4-bit"),
    ({"quant_method": "awq", "w_bit": 3}, "quantization_config.w_bit = 3"),
    ({"quant_method": "awq", "group_size": 256},
     "group_size = 256 is not supported; group sizes are 32, 64, 128 or -1"),
    ({"quant_method": "awq", "zero_point": False}, "zero_point = false"),
    ({"quant_method": "awq", "version": "gemv_fast"}, "version = \"gemv_fast\" is not supported; only AWQ's GEMM"),
    ({"quant_method": "awq", "backend": "llm-awq"}, "backend = \"llm-awq\""),
    ({"quant_method": "gptq", "bits": 4, "desc_act": True}, "desc_act = true is not supported; act-order"),
    ({"quant_method": "gptq", "bits": 2}, "GPTQ with quantization_config.bits = 2"),
    ({"quant_method": "gptq", "checkpoint_format": "marlin"}, "checkpoint_format = \"marlin\""),
    ({"quant_method": "gptq", "is_marlin_format": True}, "is_marlin_format = true"),
    ({"quant_method": "gptq", "pack_dtype": "int64"}, "pack_dtype = \"int64\""),
    ({"quant_method": "gptq", "sym": "yes"}, "quantization_config.sym must be true or false"),
    ({"quant_method": "gptq", "group_size": "128"}, "quantization_config.group_size must be an integer"),
    ({"quant_method": "fp8", "weight_block_size": [128, 96]}, "weight_block_size = [128, 96] is not supported"),
    ({"quant_method": "fp8", "weight_block_size": 128}, "weight_block_size = 128 is not supported; a block is"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}, 'scale_fmt = "ue8m0"'),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt = \"e5m2\""),
])
def test_unsupported_settings_are_refused_naming_them(raw, says):
    with pytest.raises(ModelLoadError) as e:
        ModelConfig.from_hf({**BASE, "quantization_config": raw}, "m/config.json")
    assert says in str(e.value) and str(e.value).startswith("m/config.json: ") and "\n" not in str(e.value)


def test_a_quantization_config_that_is_not_an_object_is_refused():
    with pytest.raises(ModelLoadError, match="quantization_config must be a JSON object"):
        ModelConfig.from_hf({**BASE, "quantization_config": "awq"})
