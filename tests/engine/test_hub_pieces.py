"""Catalog, draft/target pairing, fit estimate, progress meter and units: no network, no GPU."""

from __future__ import annotations

import threading

import pytest

from engine.hub.catalog import MTP_BUILTIN, ModelShape, load_catalog
from engine.hub.progress import DownloadCancelled, ProgressMeter
from engine.errors import UserError
from engine.hub.fit import GpuMemory, estimate_fit, shape_from_config
from engine.hub.pairing import check_draft_pair, draft_widths, is_draft_config
from engine.units import format_bytes, format_eta

GiB = 2**30


def test_catalog_has_the_pairs_a_one_gpu_user_picks():
    catalog = load_catalog()
    pairs = {e.target.repo: e.draft.repo if e.draft else None for e in catalog.entries}
    assert pairs["meta-llama/Llama-3.1-8B-Instruct"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert pairs["Qwen/Qwen3-8B"] in ("AngelSlim/Qwen3-8B_eagle3", "Tengyunw/qwen3_8b_eagle3")
    assert pairs["Qwen/Qwen3-1.7B"] == "AngelSlim/Qwen3-1.7B_eagle3"
    assert pairs["Qwen/Qwen3-4B"] == "AngelSlim/Qwen3-4B_eagle3"
    assert pairs["deepseek-ai/DeepSeek-R1-Distill-Llama-8B"] == "yuhuili/EAGLE3-DeepSeek-R1-Distill-LLaMA-8B"
    assert pairs["XiaomiMiMo/MiMo-7B-RL"] == MTP_BUILTIN
    demo = catalog.by_id("demo")
    assert demo.target.size_bytes == 98_362_432 and demo.draft.is_shipped and not demo.draft.needs_download
    assert catalog.for_target("meta-llama/Llama-3.1-8B-Instruct").target.is_gated
    for e in catalog.entries:
        assert e.target.licence and e.target.shape.num_layers > 0 and e.target.size_bytes > 0


def test_kv_bytes_follow_the_formula():
    # Llama-3.1-8B: 2 * 32 layers * 8 kv heads * 128 * 8192 tokens * 2 bytes = 1 GiB
    assert ModelShape(32, 8, 128).kv_bytes(8192) == GiB


def test_fit_verdicts():
    shape = ModelShape(32, 8, 128)
    need = 16 * GiB + GiB + GiB  # weights + KV at 8192 + overhead
    assert estimate_fit(16 * GiB, shape, gpu=GpuMemory("x", 80 * GiB, 80 * GiB)).verdict == "fits"
    assert estimate_fit(16 * GiB, shape, gpu=GpuMemory("x", int(need * 1.05), 80 * GiB)).verdict == "tight"
    assert estimate_fit(16 * GiB, shape, gpu=GpuMemory("x", need - 1, 80 * GiB)).verdict == "does not fit"
    fit = estimate_fit(16 * GiB, shape, draft_bytes=GiB, draft_shape=ModelShape(1, 8, 128), gpu=None)
    assert fit.verdict == "no GPU" and fit.need_bytes == need + GiB + GiB // 32
    with pytest.raises(ValueError):
        estimate_fit(1, shape, context=0)


def test_a_quantized_model_that_does_not_fit_dense_is_fitted_packed(tmp_path):
    """Where a quantized model's bf16 weights would not fit (the loader then keeps them packed),
    the estimate counts the packed bytes and says so; a model that fits dense stays dense, and a
    float model has no packed figure at all."""
    from engine.hub.fit import packed_catalog_bytes, packed_gguf_bytes
    from engine.hub.catalog import load_catalog

    shape = ModelShape(32, 8, 128)
    small_gpu = GpuMemory("12 GB card", 11 * GiB, 12 * GiB)
    fit = estimate_fit(16 * GiB, shape, gpu=small_gpu, packed_weights_bytes=5 * GiB)
    assert fit.packed and fit.need_bytes == 5 * GiB + 2 * GiB and fit.verdict == "fits"
    assert fit.as_text == "fits (packed)"
    dense = estimate_fit(16 * GiB, shape, gpu=GpuMemory("x", 80 * GiB, 80 * GiB), packed_weights_bytes=5 * GiB)
    assert not dense.packed and dense.need_bytes == 18 * GiB and dense.as_text == "fits"
    assert estimate_fit(16 * GiB, shape, gpu=small_gpu).verdict == "does not fit"  # a float model
    assert not estimate_fit(16 * GiB, shape, gpu=None, packed_weights_bytes=5 * GiB).packed  # no GPU: no rule
    entry = load_catalog().by_id("llama-3.1-8b-q4km")
    t = entry.target
    packed = packed_catalog_bytes(t.weights_bytes, t.weights, t.hidden_size, t.vocab_size)
    assert 0.3 * t.weights_bytes < packed < 0.6 * t.weights_bytes
    assert packed == int(t.weights_bytes * 4.95 / 16)  # the embeddings packed like the rest (a GGUF)
    awq = packed_catalog_bytes(t.weights_bytes, "AWQ", t.hidden_size, t.vocab_size)
    embed = 2 * t.hidden_size * t.vocab_size  # an AWQ checkpoint's, in bf16
    assert awq == int((t.weights_bytes - embed) * 4.4 / 16) + embed
    assert packed_catalog_bytes(t.weights_bytes, None, t.hidden_size, t.vocab_size) is None

    from tests.tiny_gguf import make_tiny_gguf
    from engine.weights.gguf_header import read_tensor_infos

    path = make_tiny_gguf(tmp_path / "tiny-Q4_K.gguf", tmp_path / "work", qtype="Q4_K", hidden=256)
    infos = read_tensor_infos(path)
    layer = [t for t in infos if (t.name.startswith("blk.") and len(t.shape) == 2)
             or t.name in ("output.weight", "token_embd.weight")]
    assert {"output.weight", "token_embd.weight"} <= {t.name for t in layer}  # lm_head and embeddings packed too
    want = sum(int(t.n_elements * 4.625 / 8) for t in layer) + sum(t.n_elements * 2 for t in infos if t not in layer)
    assert packed_gguf_bytes(path) == want
    f32 = make_tiny_gguf(tmp_path / "tiny-F32.gguf", tmp_path / "work", qtype="F32", hidden=256)
    assert packed_gguf_bytes(f32) is None  # nothing to pack


def test_shape_from_config_defaults_head_dim():
    assert shape_from_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}) == ModelShape(2, 4, 16)
    assert shape_from_config({"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                              "head_dim": 128, "hidden_size": 2560}) == ModelShape(36, 8, 128)
    assert shape_from_config({"architectures": ["X"]}) is None


TARGET = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096}


@pytest.mark.parametrize("draft", [
    {"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000, "vocab_size": 128256, "hidden_size": 4096},
    {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 128256, "hidden_size": 2048, "target_hidden_size": 4096,
     "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}},
    {"architectures": ["Eagle3Speculator"], "speculators_config": {}, "draft_vocab_size": 32000,
     "transformer_layer_config": {"vocab_size": 128256, "hidden_size": 4096}},
])
def test_every_eagle3_format_is_read(draft):
    assert is_draft_config(draft)
    assert draft_widths(draft) == (128256, 4096)
    check_draft_pair("some/llama", TARGET, "some/head", draft)


def test_mismatched_widths_are_refused_naming_both():
    draft = {"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000, "vocab_size": 151936, "hidden_size": 4096}
    with pytest.raises(UserError, match=r"draft some/head does not match target some/llama: vocabulary 151936 vs 128256"):
        check_draft_pair("some/llama", TARGET, "some/head", draft)
    with pytest.raises(UserError, match=r"some/model is not an EAGLE-3 draft head.*target some/llama"):
        check_draft_pair("some/llama", TARGET, "some/model", TARGET)


def test_catalog_pairing_is_enforced():
    with pytest.raises(UserError, match=r"draft AngelSlim/Qwen3-4B_eagle3 is made for Qwen/Qwen3-4B, not for target Qwen/Qwen3-8B"):
        check_draft_pair("Qwen/Qwen3-8B", None, "AngelSlim/Qwen3-4B_eagle3", None)
    check_draft_pair("Qwen/Qwen3-8B", None, "AngelSlim/Qwen3-8B_eagle3", None)


def test_builtin_mtp_needs_mtp_layers():
    check_draft_pair("XiaomiMiMo/MiMo-7B-RL", {"num_nextn_predict_layers": 1}, MTP_BUILTIN, None)
    with pytest.raises(UserError, match=r"mtp:builtin needs a target with MTP layers, and some/llama has none"):
        check_draft_pair("some/llama", TARGET, MTP_BUILTIN, None)


def test_meter_speed_eta_and_cancel():
    now = [0.0]
    seen = []
    cancel = threading.Event()
    meter = ProgressMeter(1000, seen.append, cancel, interval=0.0, clock=lambda: now[0])
    meter.start_file("a/b.safetensors")
    for _ in range(4):
        now[0] += 1.0
        meter.add(100)
    p = seen[-1]
    assert (p.done_bytes, p.filename) == (400, "a/b.safetensors")
    assert p.speed == pytest.approx(100.0) and p.eta_s == pytest.approx(6.0) and p.fraction == pytest.approx(0.4)
    meter.add(-100)  # a restarted file gives back what it had
    assert meter.done_bytes == 300
    meter.add(50)
    assert meter.done_bytes == 350
    cancel.set()
    with pytest.raises(DownloadCancelled):
        meter.add(1)


def test_units():
    assert format_bytes(98_362_432) == "98.4 MB"
    assert format_bytes(16_060_522_496) == "16.1 GB"
    assert format_bytes(512) == "512 B"
    assert format_eta(None) == "--:--" and format_eta(75) == "1:15" and format_eta(7322) == "2h02m"


def test_quantized_variants_pair_with_their_models_drafts():
    """The catalog's quantized variants (GGUF Q4_K_M / Q8_0, AWQ): one file of a GGUF repo or an
    AWQ checkpoint, the shape and draft of the model they quantize, a download of their own size
    and, dequantized to bf16 on the GPU today, that model's GPU bytes; the draft serves them, and
    still no other model."""
    from engine.hub.gguf_files import parse_gguf_spec
    from engine.hub.pairing import check_draft_pair

    catalog = load_catalog()
    variants = [e for e in catalog.entries if e.variant_of]
    formats = {e.target.weights for e in variants}
    assert {"Q4_K_M", "Q8_0", "AWQ"} <= formats
    assert {e.variant_of for e in variants} >= {"qwen3-8b", "llama-3.1-8b"}
    for e in variants:
        base = catalog.by_id(e.variant_of)
        assert e.target.shape == base.target.shape and e.draft == base.draft
        assert e.target.weights_bytes == base.target.size_bytes > e.target.size_bytes
        gguf = parse_gguf_spec(e.target.repo)
        assert (gguf is not None and gguf[1] == e.target.weights) or e.target.weights == "AWQ"
        assert catalog.pairs(e.target.repo, e.draft.repo) and catalog.for_target(e.target.repo) is e
        check_draft_pair(e.target.repo, None, e.draft.repo, None)  # no "made for another model"
    with pytest.raises(UserError, match="made for Qwen/Qwen3-8B"):
        check_draft_pair("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF:Q4_K_M", None, "AngelSlim/Qwen3-8B_eagle3", None)
