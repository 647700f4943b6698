"""Sampling tensors: probabilities_t (device-tensor parameters, graph-safe) equals probabilities."""

import pytest
import torch

from engine.sampling import SamplingTensors, filtered, probabilities, probabilities_t
from engine.types import SamplingParams


def test_probabilities_t_equals_probabilities_for_every_cut():
    g = torch.Generator().manual_seed(0)
    tensors = SamplingTensors(torch.device("cpu"))
    for trial in range(400):
        vocab = int(torch.randint(5, 300, (1,), generator=g))
        logits = torch.randn(3, vocab, generator=g) * float(torch.rand(1, generator=g) * 5 + 0.1)
        p = SamplingParams(temperature=float(torch.rand(1, generator=g)) + 0.2,
                           top_k=int(torch.randint(0, vocab + 5, (1,), generator=g)) if trial % 2 else 0,
                           top_p=float(torch.rand(1, generator=g)) * 0.99 + 0.01 if trial % 3 else 1.0,
                           min_p=float(torch.rand(1, generator=g)) * 0.3 if trial % 5 == 0 else 0.0)
        tensors.set(p, vocab)
        want = probabilities(logits, p)
        got = probabilities_t(logits, tensors, filtered(p))
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert torch.equal(got > 0, want > 0), p  # the same tokens cut


@pytest.mark.parametrize("kw,cut", [({}, False), ({"top_k": 3}, True), ({"top_p": 0.5}, True), ({"min_p": 0.1}, True),
                                    ({"top_k": 0, "top_p": 1.0, "min_p": 0.0}, False)])
def test_filtered(kw, cut):
    assert filtered(SamplingParams(temperature=0.7, **kw)) is cut
