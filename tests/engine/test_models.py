"""Our model against transformers: same greedy tokens, same logits, for every architecture."""

import pytest
import torch

from engine.engine import Engine
from engine.types import SamplingParams

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]


def _hf(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, tiny_models):
    eng = Engine.load(str(tiny_models[arch]), device="cpu")
    hf = _hf(tiny_models[arch])
    ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": "Hello, how are you today?"}])
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0, -1]
    ours, _, _ = eng.runner.forward(torch.tensor(ids), 0, all_logits=False)
    assert torch.allclose(ours[-1], ref, atol=1e-4, rtol=0), (ours[-1] - ref).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_64_tokens_match_transformers(arch, tiny_models):
    eng = Engine.load(str(tiny_models[arch]), device="cpu")
    eng.tokenizer.eos_token_ids = frozenset()  # random weights: never stop early
    hf = _hf(tiny_models[arch])
    ids = eng.tokenizer.apply_chat_template([{"role": "user", "content": "The quick brown fox"}])
    with torch.no_grad():
        x = torch.tensor([ids])
        ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=64, do_sample=False, eos_token_id=None,
                          min_new_tokens=64, pad_token_id=0)[0, len(ids):].tolist()
    res = list(eng.stream_ids(ids, SamplingParams(max_tokens=64)))
    ours = [t for ev in res for t in ev.token_ids]
    assert len(ref) == 64
    assert ours == ref
    assert len(set(ours)) > 3  # a degenerate run would prove little


def test_cached_decode_equals_full_recompute(tiny_models):
    """Logits after decoding token by token equal one forward over the whole sequence."""
    eng = Engine.load(str(tiny_models["qwen3"]), device="cpu")
    ids = list(range(3, 40))
    r = eng.runner
    r.forward(torch.tensor(ids[:20]), 0)
    for i in range(20, len(ids) - 1):
        r.forward(torch.tensor(ids[i:i + 1]), i)
    last, _, _ = r.forward(torch.tensor(ids[-1:]), len(ids) - 1)
    full, _, _ = r.forward(torch.tensor(ids), 0)
    assert torch.allclose(last[-1], full[-1], atol=1e-5)


def test_packed_attention_equals_a_block_diagonal_causal_mask():
    """attention_packed (padded batches of similar lengths) == one masked attention over the
    whole pack, GQA included: sequences of 1 token, uneven lengths, and groups of several."""
    from engine.attention import attention_packed

    import engine.attention as attention

    g = torch.Generator().manual_seed(0)
    groups, default = {}, attention.PAD_SLACK
    for slack in (attention.PAD_SLACK, attention.PAD_SLACK_CUDA, 100.0):  # 100: one padded group
        attention.PAD_SLACK = slack
        attention._pack_plan.cache_clear()
        try:
            for lengths in ((5, 1, 17, 9), (5, 1, 17, 9, 16, 15, 4, 5, 5, 1), (7,)):
                _check_packed(attention_packed, lengths, g)
            groups[slack] = len(attention._pack_plan((5, 1, 17, 9, 16, 15, 4, 5, 5, 1), torch.device("cpu")))
        finally:
            attention.PAD_SLACK = default
            attention._pack_plan.cache_clear()
    assert list(groups.values()) == sorted(groups.values(), reverse=True) and groups[100.0] == 1
    assert groups[default] > groups[100.0]
    with pytest.raises(AssertionError):
        attention_packed(*(torch.zeros(4, h, 8) for h in (2, 2, 2)), (1, 2), 0.3)


def test_packed_attention_falls_back_when_the_flash_call_refuses(monkeypatch):
    """Where the variable-length flash call raises (here: a CPU, which has no such kernel), the
    pack is computed by the padded groups, the reason is kept, and later packs skip the call."""
    import engine.attention as attention
    from engine.attention import attention_packed

    monkeypatch.setattr(attention, "_VARLEN_FAILED", None)
    monkeypatch.setattr(attention, "_varlen_ok", lambda q: attention._VARLEN_FAILED is None)
    g = torch.Generator().manual_seed(1)
    _check_packed(attention_packed, (5, 1, 17, 9), g)
    assert attention._VARLEN_FAILED and attention._VARLEN_FAILED.startswith("NotImplementedError")
    _check_packed(attention_packed, (3, 4), g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_attention_on_cuda_varlen_and_padded_groups():
    """On CUDA a pack runs as one variable-length flash call (and that call works on this GPU);
    the padded groups (PAD_SLACK_CUDA, the fallback) too. Both equal the block-diagonal
    reference within bf16 rounding, from q/k/v split out of one qkv row as the model does."""
    import torch.nn.functional as F

    import engine.attention as attention
    from engine.attention import attention_packed

    g = torch.Generator(device="cuda").manual_seed(0)
    for lengths in ((5, 1, 17, 9, 16, 15, 4, 5, 5, 1), (300, 40, 700, 41, 128, 9, 515), (1,)):
        T, Hq, Hkv, D = sum(lengths), 9, 3, 64
        qkv = torch.randn(T, (Hq + 2 * Hkv) * D, generator=g, device="cuda", dtype=torch.bfloat16)
        q, k, v = (x.view(T, -1, D) for x in qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1))
        seg = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))
        rows = torch.arange(T, device="cuda")
        mask = (rows[None, :] <= rows[:, None]) & (seg[None, :] == seg[:, None])
        want = F.scaled_dot_product_attention(*(x.float().transpose(0, 1) for x in (q, k, v)), attn_mask=mask,
                                              scale=0.125, enable_gqa=True).transpose(0, 1)
        for varlen in (True, False):
            attention.USE_VARLEN = varlen
            try:
                got = attention_packed(q, k, v, lengths, 0.125).float()
            finally:
                attention.USE_VARLEN = True
            assert attention._VARLEN_FAILED is None
            assert got.shape == want.shape and (got - want).abs().max() < 0.03, varlen


def _check_packed(attention_packed, lengths, g):
    import torch.nn.functional as F

    T, Hq, Hkv, D = sum(lengths), 6, 2, 16
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (Hq, Hkv, Hkv))
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    rows = torch.arange(T)
    mask = (rows[None, :] <= rows[:, None]) & (seg[None, :] == seg[:, None])
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                          scale=0.3, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(attention_packed(q, k, v, lengths, 0.3), want)


def test_ignore_eos_decodes_past_an_eos_and_leaves_the_tokenizer_alone(tiny_models):
    """SamplingParams.ignore_eos (benchmarks time a fixed number of tokens): EOS ends nothing."""
    import copy

    loaded = Engine.load(str(tiny_models["llama"]), device="cpu")
    ids = list(range(3, 20))
    plain = [t for ev in loaded.stream_ids(ids, SamplingParams(max_tokens=6)) for t in ev.token_ids]
    tokenizer = copy.copy(loaded.tokenizer)
    cut = next(i for i, t in enumerate(plain) if i and t not in plain[:i])
    tokenizer.eos_token_ids = frozenset({plain[cut]})  # a token of the answer, not its first, is an EOS
    eng = Engine(loaded.runner, tokenizer, "tiny")
    stopped = list(eng.stream_ids(ids, SamplingParams(max_tokens=6)))
    assert [t for ev in stopped for t in ev.token_ids] == plain[:cut] and stopped[-1].finish_reason == "stop"
    eng.reset()
    ran = list(eng.stream_ids(ids, SamplingParams(max_tokens=6, ignore_eos=True)))
    assert [t for ev in ran for t in ev.token_ids] == plain and ran[-1].finish_reason == "length"
    assert tokenizer.eos_token_ids == {plain[cut]}
