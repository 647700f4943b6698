"""quantization_config: what is read, the label it gives, and every unsupported setting refused in one line."""

import pytest

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.quant_config import QuantConfig

BASE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4}


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
])
def test_supported_configs(raw, expected, label):
    assert QuantConfig.from_hf(raw) == expected and expected.label == label
    assert ModelConfig.from_hf({**BASE, "quantization_config": raw}).quantization == expected


def test_no_quantization_config_is_a_float_model():
    assert ModelConfig.from_hf(BASE).quantization is None
    assert ModelConfig.from_hf({**BASE, "quantization_config": None}).quantization is None


@pytest.mark.parametrize("raw,says", [
    ({"quant_method": "bitsandbytes"}, 'quant_method "bitsandbytes" is not supported (supported: awq, gptq, fp8)'),
    ({"quant_method": "compressed-tensors"}, 'quant_method "compressed-tensors" is not supported'),
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
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "weight_block_size = [128, 128] is not supported"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt = \"e5m2\""),
])
def test_unsupported_settings_are_refused_naming_them(raw, says):
    with pytest.raises(ModelLoadError) as e:
        ModelConfig.from_hf({**BASE, "quantization_config": raw}, "m/config.json")
    assert says in str(e.value) and str(e.value).startswith("m/config.json: ") and "\n" not in str(e.value)


def test_a_quantization_config_that_is_not_an_object_is_refused():
    with pytest.raises(ModelLoadError, match="quantization_config must be a JSON object"):
        ModelConfig.from_hf({**BASE, "quantization_config": "awq"})
