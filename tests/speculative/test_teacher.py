"""Packed feature extraction equals one forward per conversation."""

from pathlib import Path

import torch

from engine.forward_batch import ForwardBatch
from engine.loader import load_folder
from speculative.train.teacher import Teacher
from speculative.train.data import Sequence
from tests.tiny import make_tiny_model


def test_packed_features_equal_separate_forwards(tmp_path: Path):
    folder = make_tiny_model(tmp_path / "m", "qwen3", num_layers=4)
    loaded = load_folder(folder, torch.device("cpu"), torch.float32, 256)
    aux = (1, 2, 3)
    teacher = Teacher(loaded, aux, 256, 1 << 30)
    teacher.PACK_TOKENS = 50  # several packs of several sequences
    g = torch.Generator().manual_seed(0)
    seqs = [Sequence(ids=torch.randint(3, 380, (n,), generator=g).tolist(), response_start=-1)
            for n in (7, 19, 12, 30, 5, 16)]
    feats = teacher.features_many([(("k", i), s) for i, s in enumerate(seqs)])
    model = loaded.model
    for s, f in zip(seqs, feats):
        ids = torch.tensor(s.ids)
        out = model(ForwardBatch.eager(ids, 0), teacher.kv, aux)
        assert torch.allclose(f.aux, out.aux_hidden[:-1], rtol=1e-4, atol=1e-4)
        assert torch.allclose(f.label_hidden, out.hidden[1:], rtol=1e-4, atol=1e-4)
        assert torch.equal(f.greedy, model.logits(out.hidden).argmax(-1)[1:])
        assert torch.equal(f.tokens, ids[1:])
    # Cached: a second call returns the same objects without running the model.
    before = teacher.forward_s
    again = teacher.features_many([(("k", 2), seqs[2])])
    assert again[0] is feats[2] and teacher.forward_s == before
