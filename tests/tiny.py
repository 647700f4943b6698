"""Tiny real models for tests: a byte-level BPE tokenizer and random-weight HF checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you!",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "Speculative decoding drafts tokens and verifies them in one forward pass.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Unicode: café, naïve, 東京, 😀.",
] * 20


def write_tokenizer(folder: Path, vocab_size: int = 384) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))


ARCH_CONFIGS = {
    # GQA, untied, llama3 RoPE scaling
    "llama": dict(cls="LlamaConfig", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    # tied embeddings, multi-head (no GQA)
    "mistral": dict(cls="MistralConfig", num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                    sliding_window=None),
    # q/k/v bias, tied, yarn scaling
    "qwen2": dict(cls="Qwen2Config", num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
    # q/k norm, explicit head_dim != hidden/heads, linear scaling
    "qwen3": dict(cls="Qwen3Config", num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  tie_word_embeddings=False, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def make_tiny_model(folder: Path, arch: str = "llama", num_layers: int = 2, hidden: int = 64,
                    seed: int = 0, **overrides) -> Path:
    """Writes config.json, model.safetensors and tokenizer files of a random tiny model."""
    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder)
    spec = dict(ARCH_CONFIGS[arch])
    spec.update(overrides)
    cls = getattr(transformers, spec.pop("cls"))
    scaling = spec.pop("rope_scaling", None)
    cfg = cls(vocab_size=384, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
              max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, **spec)
    if scaling is not None:
        params = dict(scaling, rope_theta=10000.0)
        cfg.rope_parameters = params
        if hasattr(cfg, "rope_scaling"):
            try:
                cfg.rope_scaling = params
            except Exception:
                pass
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def read_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())
