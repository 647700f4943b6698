"""Training-time test computes what the speculator computes: extend, then chained decode steps."""

import torch

from engine.config import ModelConfig
from engine.kv_cache import KVCache
from speculative.config import DraftConfig
from speculative.eagle3 import Eagle3Draft
from speculative.train_export import head_config
from speculative.ttt import DocFeatures, TTTBatch, chain_accept_len, ttt_loss, unroll

TARGET = ModelConfig(architecture="LlamaForCausalLM", vocab_size=96, hidden_size=32, intermediate_size=64,
                     num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256)


def _draft(seed=0):
    dc = DraftConfig.from_hf(head_config(TARGET, 40, (1, 2, 3)), TARGET)
    torch.manual_seed(seed)
    draft = Eagle3Draft(dc, TARGET, 128, None)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        draft.d2t.copy_(torch.arange(40) * 2 - torch.arange(40))  # draft id i -> target id 2i
    return draft


def _doc(m, g, resp=False):
    return DocFeatures(tokens=torch.randint(0, 96, (m,), generator=g), aux=torch.randn(m, 96, generator=g),
                       label_hidden=torch.randn(m, 32, generator=g), greedy=torch.randint(0, 96, (m,), generator=g),
                       is_response=torch.full((m,), resp))


def test_unroll_matches_extend_then_decode_steps():
    draft = _draft()
    embed = torch.nn.Embedding(96, 32)
    g = torch.Generator().manual_seed(1)
    docs = [_doc(7, g), _doc(11, g), _doc(5, g)]
    batch = TTTBatch.from_rows([[docs[0], docs[1]], [docs[2]]], seq_len=20)
    T = 4
    with torch.no_grad():
        logits = unroll(draft, embed, batch, T)
    # Row 0, second sequence (offset 7): extend over entries 0..n0-1, then T-1 decode steps.
    f, off = docs[1], 7
    for n0 in (1, 3, 6):
        kv = KVCache(1, 64, 2, 8, torch.float32, "cpu")
        with torch.no_grad():
            d_logits, d_hidden = draft(f.tokens[:n0], torch.arange(n0), f.aux[:n0], True, embed, kv, start_pos=0)
            torch.testing.assert_close(d_logits, logits[0][0, off:off + n0], rtol=1e-4, atol=1e-4)
            hidden = d_hidden[-1:]
            for s in range(1, T):
                p = n0 - 1 + s
                if p >= f.num_entries:
                    break
                step_logits, hidden = draft(f.tokens[p:p + 1], torch.tensor([p]), hidden, False, embed, kv,
                                            start_pos=p)
                torch.testing.assert_close(step_logits[0], logits[s][0, off + p], rtol=1e-4, atol=1e-4)


def test_loss_and_chain_estimate():
    draft = _draft()
    embed = torch.nn.Embedding(96, 32)
    g = torch.Generator().manual_seed(2)
    docs = [_doc(9, g, resp=True), _doc(6, g)]
    batch = TTTBatch.from_rows([docs], seq_len=16)
    logits = unroll(draft, embed, batch, 3)
    target = torch.randn(1, 16, 40)
    stats = ttt_loss(logits, batch, target, draft.d2t, 0.8)
    stats.loss.backward()
    assert draft.fc.weight.grad is not None and draft.midlayer.self_attn.qkv_proj.weight.grad.abs().sum() > 0
    # Force known correctness: everything right in the first sequence -> every start accepts 3.
    correct = [batch.doc == 0] * 3
    est, n = chain_accept_len(batch, correct)
    assert n == 9
    # Starts near the end of the sequence run out of entries (counted as rejections).
    expected = 1 + sum(min(3, 9 - p) for p in range(9)) / 9
    assert abs(est - expected) < 1e-6


def test_unrolled_head_learns_a_predictable_target():
    """Tokens follow a fixed permutation and the target state carries the answer: every draft
    step must become right, through training-time test alone."""
    torch.manual_seed(0)
    draft = _draft()
    draft.d2t.zero_()  # draft id == target id for ids < 40
    embed = torch.nn.Embedding(96, 32)
    perm = torch.randperm(40)
    g = torch.Generator().manual_seed(3)
    code = torch.randn(40, 96, generator=g)

    def doc(m):
        x = [int(torch.randint(0, 40, (1,), generator=g))]
        for _ in range(m + 1):
            x.append(int(perm[x[-1]]))
        x = torch.tensor(x)
        return DocFeatures(tokens=x[1:m + 1], aux=code[x[2:m + 2]], label_hidden=torch.zeros(m, 32),
                           greedy=x[2:m + 2], is_response=torch.ones(m, dtype=torch.bool))

    opt = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    for _ in range(100):
        batch = TTTBatch.from_rows([[doc(12), doc(9)], [doc(20)]], seq_len=24)
        target = torch.nn.functional.one_hot(batch.greedy, 40).float() * 12
        stats = ttt_loss(unroll(draft, embed, batch, 3), batch, target, draft.d2t, 0.8)
        opt.zero_grad()
        stats.loss.backward()
        opt.step()
    assert min(stats.step_acc) > 0.9, stats.step_acc
    assert chain_accept_len(batch, stats.correct)[0] > 3.0
