"""Acceptance rules on hand-built logits, and the exactness of speculative sampling."""

import torch

from speculative.verify import greedy_accept, rejection_accept


def test_greedy_accepts_the_matching_prefix():
    target_choice = torch.tensor([5, 7, 9, 2])  # after bonus, d1, d2, d3
    assert [int(x) for x in greedy_accept(torch.tensor([5, 7, 9]), target_choice)] == [3, 2]
    assert [int(x) for x in greedy_accept(torch.tensor([5, 8, 9]), target_choice)] == [1, 7]
    assert [int(x) for x in greedy_accept(torch.tensor([4, 7, 9]), target_choice)] == [0, 5]


def test_greedy_from_logits():
    logits = torch.full((3, 6), -1.0)
    logits[0, 3] = logits[1, 1] = logits[2, 4] = 2.0
    acc, nxt = greedy_accept(torch.tensor([3, 2]), logits.argmax(-1))
    assert int(acc) == 1 and int(nxt) == 1


def _one_hot(i, n=4):
    p = torch.zeros(n)
    p[i] = 1.0
    return p


def test_rejection_keeps_a_draft_the_target_agrees_with():
    # Target and draft both certain of token 2, then the target is certain of 3.
    q = torch.stack([_one_hot(2)])
    p = torch.stack([_one_hot(2), _one_hot(3)])
    acc, nxt = rejection_accept(torch.tensor([2]), q, p, torch.Generator().manual_seed(0))
    assert int(acc) == 1 and int(nxt) == 3


def test_rejection_replaces_a_draft_the_target_never_picks():
    q = torch.stack([_one_hot(1), _one_hot(1)])
    p = torch.stack([_one_hot(0), _one_hot(2), _one_hot(3)])
    acc, nxt = rejection_accept(torch.tensor([1, 1]), q, p, torch.Generator().manual_seed(0))
    assert int(acc) == 0 and int(nxt) == 0  # residual max(0, p - q) is all on token 0


def test_speculative_sampling_reproduces_the_target_distribution():
    """Chi-square-style check: first-token frequencies over many trials match p, for a draft
    distribution q that is deliberately different from p."""
    g = torch.Generator().manual_seed(1234)
    V, k, trials = 6, 2, 20000
    p = torch.tensor([[0.05, 0.30, 0.10, 0.25, 0.20, 0.10],
                      [0.40, 0.10, 0.10, 0.10, 0.20, 0.10],
                      [0.10, 0.10, 0.50, 0.10, 0.10, 0.10]])
    q = torch.tensor([[0.40, 0.05, 0.25, 0.10, 0.10, 0.10],
                      [0.10, 0.40, 0.10, 0.20, 0.10, 0.10]])
    counts = torch.zeros(V)
    second = torch.zeros(V)
    n_second = 0
    for _ in range(trials):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(k)])
        acc, nxt = rejection_accept(drafts, q, p, g)
        first = drafts[0] if int(acc) >= 1 else nxt
        counts[first] += 1
        if int(acc) >= 1 and int(drafts[0]) == 1:  # second token given first == 1 follows p[1]
            tok = drafts[1] if int(acc) >= 2 else nxt
            second[tok] += 1
            n_second += 1
    freq = counts / trials
    assert torch.allclose(freq, p[0], atol=0.012), freq
    assert n_second > 800
    assert torch.allclose(second / n_second, p[1], atol=0.05), second / n_second
    # The draft's own distribution is far from p: a broken rule would reproduce q instead.
    assert (q[0] - p[0]).abs().max() > 0.2
