"""Random-weight models: named shapes (LLAMA_8B), and an engine on random bf16 weights of a shape."""

from __future__ import annotations

import dataclasses

import torch

from engine.config import ModelConfig
from engine.config_checks import read_json
from engine.device import pick_device
from engine.engine import Engine
from engine.errors import UserError
from engine.loader import build_model
from engine.model import CausalLM
from engine.ops import Ops
from engine.options import KernelOptions
from engine.runner import ModelRunner
from engine.threads import apply_threads

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


class IdTokenizer:
    """Stands in for a tokenizer when the model has random weights: ids only, no text, no EOS."""

    eos_token_ids = frozenset()

    def decode(self, ids):
        return ""

    def apply_chat_template(self, messages):
        raise NotImplementedError("random-weight models take token ids")


def random_engine(config: str, device: str | None = None, max_seq_len: int | None = None,
                  options: KernelOptions | None = None, force_accept: float | None = None, draft_steps: int = 5,
                  use_graphs: bool = True, threads: int | None = None, quant: str | None = None) -> Engine:
    """An engine on random weights of `config` ('llama-8b' or a config.json): bf16 on a GPU, fp32
    on the CPU, a KV cache of max_seq_len rows (default 4096), graphs captured on CUDA unless
    use_graphs is False. options: the kernel switches (None: from the environment). force_accept:
    also a random EAGLE-3 head (speculative/testing.py) whose verify steps give force_accept
    tokens (each step, or on average when it is not a whole number); the target then gets the batch-invariant kernels a real draft's target gets (options
    may ask for them without a head too: profiling the target's side). quant: a layout of
    harness/random_packed.py (Q4_K_M, AWQ, ...): the decoder layers' projections random packed
    weights of it instead (CUDA)."""
    from speculative.testing import random_eagle3

    if force_accept is not None and not 1 <= force_accept <= draft_steps + 1:
        raise UserError(f"--force-accept must be between 1 and k + 1 = {draft_steps + 1}")
    raw = LLAMA_8B if config == "llama-8b" else read_json(config)
    cfg = ModelConfig.from_hf(raw, str(config))
    dev = pick_device(device)
    apply_threads(dev.type, threads)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    max_len = max_seq_len or 4096
    options = options or KernelOptions.from_env()
    options = dataclasses.replace(options, batch_invariant=options.batch_invariant or force_accept is not None)
    if quant is not None:
        from benchmarks.harness.random_packed import check_layout

        if dev.type != "cuda":
            raise UserError("--random-quant needs a GPU (the CPU dequantizes quantized weights at load)")
        check_layout(quant, cfg)  # before minutes of building a model it cannot pack
    model = build_model(cfg, _random_tensors(cfg, dev, dtype), "random weights", dev, dtype, max_len, options)
    if quant is not None:
        from benchmarks.harness.random_packed import pack_model

        pack_model(model, quant)
        torch.cuda.reset_peak_memory_stats(dev)  # the bf16 weights it replaced are gone
    runner = ModelRunner(model, max_len)
    speculator = None if force_accept is None else random_eagle3(runner, draft_steps, force_accept)
    if use_graphs and dev.type == "cuda":
        runner.capture([1] + ([draft_steps + 1] if speculator else []))
        if speculator:
            speculator.capture()
    name = "random " + (config if config == "llama-8b" else cfg.architecture) + (f" {quant}" if quant else "")
    return Engine(runner, IdTokenizer(), name, speculator, "random EAGLE-3 head (forced acceptance)" if speculator else None)


def _random_tensors(cfg: ModelConfig, dev: torch.device, dtype: torch.dtype):
    """(name, tensor) for each of the model's parameters: norms 1, the rest N(0, 0.02), seeded."""
    gen = torch.Generator(device=dev).manual_seed(0)
    with torch.device("meta"):
        shapes = CausalLM(cfg, 16, Ops.for_device(torch.device("cpu")))
    for name, p in shapes.named_parameters():
        if name.endswith("norm.weight"):
            yield name, torch.ones(p.shape, dtype=dtype, device=dev)
        else:
            yield name, torch.randn(p.shape, dtype=dtype, device=dev, generator=gen) * 0.02
