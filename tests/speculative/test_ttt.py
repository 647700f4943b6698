"""Training-time test computes what the speculator computes: extend, then chained decode steps."""

import pytest
import torch

from engine.config import ModelConfig
from engine.kv_cache import KVCache
from speculative.eagle3.config import DraftConfig
from speculative.eagle3.model import Eagle3Draft
from speculative.train.export import head_config
from speculative.train.ttt import DocFeatures, TTTBatch, chain_accept_len, ttt_loss, unroll

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


def test_packing_places_each_sequence_and_pads_the_rest():
    g = torch.Generator().manual_seed(6)
    a, b, c = _doc(4, g, resp=True), _doc(3, g), _doc(6, g)
    batch = TTTBatch.from_rows([[a, b], [c]], seq_len=8)
    assert batch.doc.tolist() == [[0, 0, 0, 0, 1, 1, 1, -1], [0, 0, 0, 0, 0, 0, -1, -1]]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5, 0, 0]]
    assert torch.equal(batch.tokens[0, 4:7], b.tokens) and torch.equal(batch.aux[1, :6], c.aux)
    assert torch.equal(batch.greedy[0, :4], a.greedy) and batch.is_response[0].tolist() == [True] * 4 + [False] * 4
    assert not batch.aux[1, 6:].any() and not batch.label_hidden[0, 7].any()


def test_greedy_weight_adds_the_hard_loss_on_the_greedy_token():
    from speculative.train.ttt import greedy_in_draft

    draft = _draft()
    embed = torch.nn.Embedding(96, 32)
    g = torch.Generator().manual_seed(7)
    batch = TTTBatch.from_rows([[_doc(9, g), _doc(6, g)]], seq_len=16)
    draft_ids = torch.arange(40) * 2  # as _draft's d2t: draft i is target 2i
    greedy = greedy_in_draft(batch.greedy, draft_ids, 96)
    assert ((greedy >= 0) == ((batch.greedy % 2 == 0) & (batch.greedy < 80))).all()
    assert torch.equal(draft_ids[greedy[greedy >= 0]], batch.greedy[greedy >= 0])
    target = torch.randn(1, 16, 40)
    with torch.no_grad():
        logits = unroll(draft, embed, batch, 2)
    soft = ttt_loss(logits, batch, target, draft.d2t, 1.0)
    both = ttt_loss(logits, batch, target, draft.d2t, 1.0, greedy, 0.5)
    for t in range(2):
        has = batch.valid(t) & (greedy >= 0)
        hard = -torch.log_softmax(logits[t], -1).gather(-1, greedy.clamp(min=0)[..., None])[..., 0][has].mean()
        assert abs(both.step_loss[t] - (soft.step_loss[t] + 0.5 * float(hard))) < 1e-4
    assert both.step_acc == soft.step_acc


def test_soft_temperature_fits_the_distributions_at_that_temperature():
    """soft_temperature T: the soft loss is the cross-entropy of the head's softmax(logits / T)
    against the target's softmax(target / T), masked like the rest; T = 1 is the plain loss, and
    the greedy token's hard loss is the same at any T."""
    from speculative.train.ttt import greedy_in_draft

    draft = _draft()
    embed = torch.nn.Embedding(96, 32)
    g = torch.Generator().manual_seed(11)
    batch = TTTBatch.from_rows([[_doc(9, g), _doc(6, g)]], seq_len=16)
    target = torch.randn(1, 16, 40, generator=g) * 3
    with torch.no_grad():
        logits = unroll(draft, embed, batch, 2)
    plain = ttt_loss(logits, batch, target, draft.d2t, 1.0)
    assert ttt_loss(logits, batch, target, draft.d2t, 1.0, soft_temperature=1.0).step_loss == plain.step_loss
    warm = ttt_loss(logits, batch, target, draft.d2t, 1.0, soft_temperature=0.7)
    for t in range(2):
        valid = batch.valid(t)
        ce = -(torch.softmax(target / 0.7, -1) * torch.log_softmax(logits[t] / 0.7, -1)).sum(-1)
        assert abs(warm.step_loss[t] - float(ce[valid].mean())) < 1e-4
        assert abs(warm.step_loss[t] - plain.step_loss[t]) > 1e-3
    greedy = greedy_in_draft(batch.greedy, torch.arange(40) * 2, 96)
    for temp in (1.0, 0.7):
        soft = ttt_loss(logits, batch, target, draft.d2t, 1.0, soft_temperature=temp)
        both = ttt_loss(logits, batch, target, draft.d2t, 1.0, greedy, 0.5, soft_temperature=temp)
        hard = [b - s for b, s in zip(both.step_loss, soft.step_loss)]
        if temp == 1.0:
            first = hard
    assert all(abs(a - b) < 1e-4 for a, b in zip(hard, first))


@pytest.mark.parametrize("chunk", [7, 8, 16])
def test_chunked_queries_compute_what_one_call_computes(monkeypatch, chunk):
    """Queries in chunks (each with step 0's keys up to its last row and the later steps' keys
    of its own rows) give the logits and gradients of one call over every key."""
    import speculative.train.ttt as ttt

    g = torch.Generator().manual_seed(9)
    docs = [_doc(7, g), _doc(11, g), _doc(5, g), _doc(9, g)]
    batch = TTTBatch.from_rows([[docs[0], docs[1]], [docs[2], docs[3]]], seq_len=24)
    embed = torch.nn.Embedding(96, 32)
    target = torch.randn(2, 24, 40, generator=g)
    out = {}
    for name, size in (("one call", 10 ** 9), ("chunks", chunk)):
        monkeypatch.setattr(ttt, "Q_CHUNK", size)
        draft = _draft()
        logits = unroll(draft, embed, batch, 4)
        ttt_loss(logits, batch, target, draft.d2t, 0.8).loss.backward()
        out[name] = ([x.detach() for x in logits], {n: p.grad for n, p in draft.named_parameters()})
    for t, (a, b) in enumerate(zip(out["one call"][0], out["chunks"][0])):
        valid = batch.valid(t)
        torch.testing.assert_close(a[valid], b[valid], rtol=1e-5, atol=1e-5)
    for name, grad in out["one call"][1].items():
        if grad is not None:
            torch.testing.assert_close(grad, out["chunks"][1][name], rtol=1e-4, atol=1e-6)
