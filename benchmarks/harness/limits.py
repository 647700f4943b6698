"""The bandwidth limit of a decode step: the measured copy bandwidth over the weight bytes one step
reads. A report written before the bench counted those (its `decode_bytes`) holds `weight_bytes`,
every parameter's bytes: for a named shape with untied embeddings that includes the whole table,
of which a step reads one row, and step_bytes takes it off."""

from __future__ import annotations

import torch

from benchmarks.harness.random_packed import FLOAT_TABLES
from benchmarks.harness.shapes import LLAMA_8B


def decode_bytes(model: torch.nn.Module) -> int:
    """The weight bytes one decode step reads: every parameter and packed projection once, but
    an embedding table that nothing else reads (untied from the lm_head) only one row, the
    step's token's. Counting the whole table would lower the bandwidth limit by its size (1 GB of
    an 8B's 16) and flatter every fraction of it."""
    from engine.packed_linear import PackedEmbedding, PackedLinear

    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(module)
    total = 0
    for p in model.parameters():  # each tensor once, however many modules hold it
        lookup_only = all(isinstance(m, torch.nn.Embedding) for m in owners[id(p)])
        total += (p.shape[-1] if lookup_only else p.numel()) * p.element_size()
    linear_buffers = {t.data_ptr() for m in model.modules() if isinstance(m, PackedLinear) for t in m.buffers()}
    for m in model.modules():
        if isinstance(m, PackedLinear):
            total += m.nbytes
        elif isinstance(m, PackedEmbedding) and not any(t.data_ptr() in linear_buffers for t in m.buffers()):
            total += -(-m.nbytes // m.num_embeddings)  # one row, its share of the scales with it
    return total


def step_bytes(report: dict) -> int:
    """The bytes a decode step of the report's model reads: its decode_bytes, else (an older
    report) its weight_bytes less the untied embedding table it counted, for 'random llama-8b'
    with the table a bf16 parameter (bf16 weights, AWQ, FP8; a GGUF layout's table is
    packed, and weight_bytes never held it)."""
    if "decode_bytes" in report:
        return report["decode_bytes"]
    model = report["model"]
    if model == "random llama-8b" or model.startswith("random llama-8b ") and model.split()[-1] in FLOAT_TABLES:
        assert not LLAMA_8B["tie_word_embeddings"]
        return report["weight_bytes"] - (LLAMA_8B["vocab_size"] - 1) * LLAMA_8B["hidden_size"] * 2
    if model.startswith("random llama-8b "):
        return report["weight_bytes"]  # less the one packed row a step reads (a few KB)
    raise ValueError(f"{model}: the report holds no decode_bytes, and its table's bytes are not known here")


def step_limit_tok_s(report: dict) -> float:
    """The report's bandwidth limit in tok/s from the bytes a step reads (step_bytes)."""
    return report["copy_bandwidth_GBps"] * 1e9 / step_bytes(report)
