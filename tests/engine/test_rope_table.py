"""rope_cos_sin builds its table on the CPU in fp32 whatever the default device and dtype (a
model is built under torch.device(cuda) with bf16 as the default dtype)."""

import pytest
import torch

from engine.config import ModelConfig
from engine.rope import rope_cos_sin

SCALINGS = [None, {"rope_type": "linear", "factor": 2.0},
            {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64},
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
            {"rope_type": "dynamic", "factor": 2.0}]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: (s or {}).get("rope_type", "default"))
def test_table_is_cpu_fp32_under_another_default_device_and_dtype(scaling):
    cfg = ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 1,
                               "vocab_size": 100, "max_position_embeddings": 64, "rope_theta": 10000.0,
                               "rms_norm_eps": 1e-5, **({"rope_scaling": scaling} if scaling else {})})
    plain = rope_cos_sin(cfg, 96)
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            other = rope_cos_sin(cfg, 96)
    finally:
        torch.set_default_dtype(saved)
    assert other.device.type == "cpu" and other.dtype == torch.float32 and other.shape == (96, 16)
    assert torch.equal(other, plain)
