"""speculative/kernels/sampled_pick.py: the fused draws and acceptance equal their torch
references, and the references equal speculative sampling with its random numbers given.

The kernel cases run on CUDA (marked gpu), and on CPU through Triton's interpreter only with
LOCALCHAT_TRITON_INTERPRET=1 (run this file alone then; see tests/engine/test_kernels.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)

from speculative.kernels.sampled_pick import (draft_sample, draft_sample_ref, draw_from,  # noqa: E402
                                              sampled_accept, sampled_accept_ref)
from speculative.verify import rejection_accept  # noqa: E402

DEVICES = [
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")),
]


def vocabularies(gen, V, Dv):
    """A draft vocabulary of Dv target ids (d2t offsets as EAGLE-3 stores them) and its inverse."""
    targets = torch.randperm(V, generator=gen)[:Dv].sort().values
    to_draft = torch.full((V,), -1, dtype=torch.int32)
    to_draft[targets] = torch.arange(Dv, dtype=torch.int32)
    return targets, targets - torch.arange(Dv), to_draft


def test_the_reference_is_rejection_sampling_with_its_draws():
    """sampled_accept_ref (draft distributions over the draft's vocabulary) gives rejection_accept's
    accepted count and next token (the same distributions scattered over the target's) when fed
    the random numbers rejection_accept draws; some drafted tokens carry no draft mass."""
    g = torch.Generator().manual_seed(0)
    k, V, Dv = 4, 12, 8
    for trial in range(300):
        targets, _, to_draft = vocabularies(g, V, Dv)
        p = torch.softmax(torch.randn(k + 1, V, generator=g) * 2, -1)
        qd = torch.softmax(torch.randn(k, Dv, generator=g) * 2, -1)
        if trial % 3 == 0:
            qd[:, 3] = 0.0
            qd = qd / qd.sum(-1, keepdim=True)
        q = torch.zeros(k, V).index_copy(1, targets, qd)
        drafts = torch.stack([targets[torch.multinomial(qd[i], 1, generator=g)[0]] for i in range(k)])
        if trial % 5 == 0:
            drafts[1] = targets[3]  # a token the draft gives no mass: always rejected
        seed = 1000 + trial
        want = rejection_accept(drafts, q, p, torch.Generator().manual_seed(seed))
        draws = torch.Generator().manual_seed(seed)
        u = torch.rand(k, generator=draws)
        e = torch.empty(V).exponential_(1.0, generator=draws)
        got = sampled_accept_ref(p, drafts, qd, to_draft, targets, u, e, torch.zeros(2, dtype=torch.long))
        assert got.tolist() == [int(want[0]), int(want[1])], trial


def test_the_draft_draw_follows_q():
    """draw_from's race over the draft's vocabulary draws each token at its probability."""
    g = torch.Generator().manual_seed(1)
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    offsets = torch.tensor([10, 10, 10, 10])
    tok = torch.zeros(1, dtype=torch.long)
    counts = torch.zeros(4)
    for _ in range(4000):
        draw_from(q, torch.empty(4).exponential_(1.0, generator=g), offsets, tok)
        counts[int(tok) - 10] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, q, atol=0.03) and counts[3] == 0, freq


def _race_two(q: torch.Tensor, g: torch.Generator) -> tuple[int, int]:
    """A draw from q and one from q without it: the first two places of an exponential race."""
    score = q / torch.empty(q.shape[0]).exponential_(1.0, generator=g)
    first = int(score.argmax())
    score[first] = -1.0
    return first, int(score.argmax())


def test_runners_up_keep_the_target_distribution():
    """A chain of k = 2 drafts with a runner-up each: the first two tokens an answer emits come
    from the target's p0(t1) * p1[t1](t2), as plain sampling gives them, though the draft's q
    differs from p (the runner-up's second round is taken often) and gives one token no mass.
    Tokens the iteration does not reach come from the target's rows, as the next one would."""
    g = torch.Generator().manual_seed(7)
    k, V = 2, 5
    targets = torch.tensor([0, 1, 2, 3])  # token 4 is outside the draft's vocabulary
    to_draft = torch.tensor([0, 1, 2, 3, -1], dtype=torch.int32)
    p0 = torch.tensor([0.05, 0.30, 0.05, 0.30, 0.30])
    p1 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # p1[t1]: the target's row after t1
    tail = torch.softmax(torch.randn(V, generator=g), -1)  # any row after two tokens
    q = torch.tensor([[0.70, 0.10, 0.15, 0.05], [0.10, 0.40, 0.25, 0.25]])
    want = p0[:, None] * p1
    counts = torch.zeros(V, V)
    took_alt = 0
    trials = 12000
    for _ in range(trials):
        d1, c1 = _race_two(q[0], g)
        d2, c2 = _race_two(q[1], g)
        drafts = targets[torch.tensor([d1, d2])]
        alts = targets[torch.tensor([c1, c2])]
        # verify rows: bonus, d1, d2, then the runners-up c1 (after the bonus), c2 (after d1)
        p = torch.stack([p0, p1[drafts[0]], tail, p1[alts[0]], tail])
        out = sampled_accept_ref(p, drafts, q, to_draft, targets, torch.rand(k, generator=g),
                                 torch.empty(V).exponential_(1.0, generator=g), torch.zeros(3, dtype=torch.long),
                                 alts, torch.rand(k, generator=g))
        a, nxt, took = out.tolist()
        emitted = [int(t) for t in drafts[:a]]
        if took:
            emitted[a - 1] = int(alts[a - 1])
            took_alt += 1
        emitted.append(nxt)
        if len(emitted) == 1:  # the next iteration's first token, from the target's row after t1
            emitted.append(int(torch.multinomial(p1[emitted[0]], 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
    freq = counts / trials
    sigma = (want * (1 - want) / trials).sqrt()
    assert ((freq - want).abs() <= 4.5 * sigma + 1e-3).all(), (freq - want).abs().max()
    assert took_alt > trials // 20, took_alt  # the second round did run


def test_the_runner_up_draw_is_the_race_second_place():
    """draw_from's alt_out: a draw from q without the first token, never the first, each token
    at its probability given the first."""
    g = torch.Generator().manual_seed(2)
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    offsets = torch.zeros(4, dtype=torch.long)
    tok, alt = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    after_0 = torch.zeros(4)
    for _ in range(4000):
        draw_from(q, torch.empty(4).exponential_(1.0, generator=g), offsets, tok, alt)
        assert int(tok) != int(alt) and int(alt) != 3
        if int(tok) == 0:
            after_0[int(alt)] += 1
    freq = after_0 / after_0.sum()
    assert torch.allclose(freq, torch.tensor([0.0, 0.6, 0.4, 0.0]), atol=0.04), freq


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V,Dv", [(50, 20), (49152, 6144), (32000 + 7, 32000 + 7)])
def test_draft_sample_equals_its_reference(device, V, Dv):
    g = torch.Generator().manual_seed(V)
    _, offsets, _ = vocabularies(g, V, Dv)
    offsets = offsets.to(device)
    for temp, dtype in ((0.7, torch.float32), (1.3, torch.bfloat16)):
        logits = (torch.randn(Dv, generator=g) * 3).to(device, dtype)
        e = torch.empty(Dv).exponential_(1.0, generator=g).to(device)
        t = torch.tensor(temp, device=device)
        q, q_ref = torch.zeros(Dv, device=device), torch.zeros(Dv, device=device)
        tok, tok_ref = torch.zeros(3, dtype=torch.long, device=device), torch.zeros(3, dtype=torch.long, device=device)
        draft_sample(logits.view(1, -1), t, e, offsets, q, tok[1:2])
        draft_sample_ref(logits, t, e, offsets, q_ref, tok_ref[1:2])
        torch.testing.assert_close(q, q_ref, atol=1e-6, rtol=1e-4)
        assert torch.equal(tok, tok_ref), (temp, dtype)
        if dtype != torch.float32:
            # The lean draft's bf16 logits read as they are: their fp32 copy's draw, and its q to
            # a few units in the last place (a GPU compiles the two loads into different code).
            q32, tok32 = torch.zeros_like(q), torch.zeros_like(tok)
            draft_sample(logits.float().view(1, -1), t, e, offsets, q32, tok32[1:2])
            torch.testing.assert_close(q, q32, atol=1e-12, rtol=1e-6)
            assert torch.equal(tok32[1], tok[1])
        # with the runner-up: the same draw, and the race's second place beside it
        draft_sample(logits.view(1, -1), t, e, offsets, q, tok[0:1], tok[2:3])
        draft_sample_ref(logits, t, e, offsets, q_ref, tok_ref[0:1], tok_ref[2:3])
        assert torch.equal(tok, tok_ref) and tok[0] == tok[1] and tok[2] != tok[0], (temp, dtype, tok, tok_ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k", [1, 5])
def test_sampled_accept_moves_the_chain_as_advance_does(device, k):
    """The acceptance's launch moving the chain on (the sampled iteration's graph) writes what
    ChainState.advance writes after it, field for field: the result, the extend window, n, the
    bonus, and the draft positions, clamped where they reach the cache's end."""
    from speculative.chain_state import ChainState

    V, Dv = 1000 + 3, 200
    g = torch.Generator().manual_seed(11 + k)
    targets, _, to_draft = vocabularies(g, V, Dv)
    seen = set()
    for trial in range(8):
        logits = torch.randn(k + 1, V, generator=g) * 2
        if trial % 2:
            logits[:, targets] += 6  # most drafts kept
        qd = torch.softmax(logits[:k, targets] / 0.8 + 0.3 * torch.randn(k, Dv, generator=g), -1)
        drafts = torch.stack([targets[torch.multinomial(qd[i], 1, generator=g)[0]] for i in range(k)])
        u, e = torch.rand(k, generator=g), torch.empty(V).exponential_(1.0, generator=g)
        chains, outs = [], []
        for moved in (True, False):
            chain = ChainState(k, 36, device)  # n + a + 1 + i passes 36 in some trials: clamped
            chain.ids[0], chain.n = 7, torch.tensor(28 + trial, device=device)
            chain.ids[1:k + 1] = drafts.to(device)
            out = torch.zeros(2, dtype=torch.long, device=device)
            sampled_accept(logits.to(device), torch.tensor(0.8, device=device), chain.ids[1:k + 1], qd.to(device),
                           to_draft.to(device), u.to(device), e.to(device), out, chain=chain if moved else None)
            if not moved:
                chain.advance(out[0], out[1])
            chains.append(chain)
            outs.append(out.tolist())
        assert outs[0] == outs[1], trial
        for field in ("ids", "n", "result", "window", "draft_pos"):
            assert torch.equal(getattr(chains[0], field), getattr(chains[1], field)), (trial, field)
        seen.add(outs[0][0])
    assert len(seen) > 1 or k == 1, seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,V,Dv", [(1, 40, 16), (5, 49152, 6144), (4, 1000 + 3, 1000 + 3)])
def test_sampled_accept_equals_its_reference(device, k, V, Dv):
    """Over random logits, draft distributions and draws, including drafts taken from the target's
    own distribution (long accepted runs, all k kept), and a drafted token with no draft mass."""
    g = torch.Generator().manual_seed(k * V)
    targets, _, to_draft = vocabularies(g, V, Dv)
    seen = set()
    for trial in range(12 if device == "cuda" or V < 5000 else 3):
        temp = (0.6, 1.0, 1.4)[trial % 3]
        logits = torch.randn(k + 1, V, generator=g) * 2
        if trial % 2:  # the draft agrees with the target: most drafts kept
            logits[:, targets] += 6
        p = torch.softmax(logits / temp, -1)
        qd = torch.softmax(logits[:k, targets] / temp + 0.3 * torch.randn(k, Dv, generator=g), -1)
        drafts = torch.stack([targets[torch.multinomial(qd[i], 1, generator=g)[0]] for i in range(k)])
        if trial == 4:
            qd[0, to_draft[drafts[0]]] = 0.0  # drafted, yet no mass: rejected at once
        u = torch.rand(k, generator=g)
        e = torch.empty(V).exponential_(1.0, generator=g)
        want = sampled_accept_ref(p, drafts, qd, to_draft, targets, u, e, torch.zeros(2, dtype=torch.long))
        dev = lambda t: t.to(device)  # noqa: E731
        out = torch.zeros(2, dtype=torch.long, device=device)
        for dtype in (torch.float32, torch.bfloat16):
            if dtype == torch.bfloat16:  # the kernel reads bf16 logits as they are: compare on those
                lg = logits.to(torch.bfloat16)
                want = sampled_accept_ref(torch.softmax(lg.float() / temp, -1), drafts, qd, to_draft, targets, u, e,
                                          torch.zeros(2, dtype=torch.long))
            else:
                lg = logits
            sampled_accept(dev(lg), torch.tensor(temp, device=device), dev(drafts), dev(qd), dev(to_draft), dev(u),
                           dev(e), out)
            assert out.tolist() == want.tolist(), (trial, dtype)
            seen.add(int(want[0]))
    assert 0 in seen and (k in seen or V > 5000), seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,V,Dv", [(1, 40, 16), (5, 49152, 6144), (4, 1000 + 3, 1000 + 3)])
def test_sampled_accept_with_runners_up_equals_its_reference(device, k, V, Dv):
    """The same with each draft's runner-up verified too: runners-up kept and refused, drafts
    all kept, and a runner-up with no draft mass (never kept)."""
    g = torch.Generator().manual_seed(k * V + 1)
    targets, _, to_draft = vocabularies(g, V, Dv)
    seen = set()
    for trial in range(16 if device == "cuda" or V < 5000 else 4):
        temp = (0.6, 1.0, 1.4)[trial % 3]
        logits = torch.randn(2 * k + 1, V, generator=g) * 2
        if trial % 2:
            logits[:, targets] += 6
        p = torch.softmax(logits / temp, -1)
        qd = torch.softmax(logits[:k, targets] / temp + 0.8 * torch.randn(k, Dv, generator=g), -1)
        picks = [_race_two(qd[i], g) for i in range(k)]
        drafts = targets[torch.tensor([d for d, _ in picks])]
        alts = targets[torch.tensor([c for _, c in picks])]
        if trial == 5:
            qd[0, to_draft[alts[0]]] = 0.0  # a runner-up without mass
        u, u_alt = torch.rand(k, generator=g), torch.rand(k, generator=g)
        if trial % 4 == 2:
            u[0] = 0.999  # the first draft likely refused: its runner-up's round decides
        e = torch.empty(V).exponential_(1.0, generator=g)
        dev = lambda t: t.to(device)  # noqa: E731
        out = torch.zeros(3, dtype=torch.long, device=device)
        for dtype in (torch.float32, torch.bfloat16):
            lg = logits.to(dtype)
            want = sampled_accept_ref(torch.softmax(lg.float() / temp, -1), drafts, qd, to_draft, targets, u, e,
                                      torch.zeros(3, dtype=torch.long), alts, u_alt)
            sampled_accept(dev(lg), torch.tensor(temp, device=device), dev(drafts), dev(qd), dev(to_draft), dev(u),
                           dev(e), out, dev(alts), dev(u_alt))
            assert out.tolist() == want.tolist(), (trial, dtype)
            seen.add((int(want[0]), int(want[2])))
    assert (any(took for _, took in seen) and any(a == 0 for a, _ in seen)) or V > 5000, seen
