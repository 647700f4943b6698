"""benchmarks/context_shift.py's chain figures: accepted lengths from each depth's chance of a
kept draft, and the steps a greedy run takes through them."""

import torch

from benchmarks.context_shift import chain_acceptance, walked


def test_a_chain_runs_while_its_drafts_are_kept():
    # depth 1 kept at entries 0, 1, 2, 4; depth 2 (drafting entry j + 1) at entries 1, 2, 3
    top1 = torch.tensor([[1, 1, 1, 0, 1, 0],
                         [0, 1, 1, 1, 0, 0]], dtype=torch.float32)
    # from entry 0: depth 1 kept, depth 2's draft at entry 1 kept: 3 tokens; from 1: 1 and 2: 3;
    # from 2: entry 2 kept, depth 2 at entry 3 kept: 3; from 3: nothing: 1; from 4: 2; from 5: 1
    assert chain_acceptance(top1, 2).tolist() == [3, 3, 3, 1, 2, 1]
    assert chain_acceptance(top1, 1).tolist() == [2, 2, 2, 1, 2, 1]
    # past the answer's end nothing is kept: the last entry's chain has only its first draft
    assert chain_acceptance(torch.ones(2, 3), 2).tolist() == [3, 3, 2]
    # steps from entries 0, 3 (0 + 3) and 4 (3 + 1), the last reaching the end (4 + 2): 3 steps
    # giving the answer's 6 tokens
    assert walked(chain_acceptance(top1, 2)) == (3, 6.0)


def test_the_estimate_multiplies_the_chances_along_the_chain():
    overlaps = torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.4, 0.4]])
    est = chain_acceptance(overlaps, 2)
    assert torch.allclose(est, torch.tensor([1 + 0.5 + 0.5 * 0.4, 1 + 0.5 + 0.5 * 0.4, 1 + 0.5], dtype=torch.float64))
