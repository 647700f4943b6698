"""`localchat train-draft --kind mtp` on a tiny target: the loss falls, the layers are in the
LocalchatMTP format, load through Engine.load, and speculation with them is lossless (greedy)."""

import json
from argparse import Namespace

import pytest
import torch
from safetensors import safe_open

from engine import Engine
from engine.types import SamplingParams
from speculative.train.mtp_unroll import shift_left, valid
from speculative.train.command import cmd_train
from speculative.train.data import heldout_prompts
from speculative.train.ttt import DocFeatures, TTTBatch
from tests.speculative.mtp_layers import LAYER_KEYS
from tests.speculative.test_train import _write_data
from tests.tiny import make_tiny_model

S = 3


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: threads only add overhead (and contend with other processes)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    base = tmp_path_factory.mktemp("mtp")
    target = make_tiny_model(base / "target", "llama", num_layers=4)
    data = _write_data(base / "data.jsonl")
    out = base / "mtp"
    args = Namespace(model=str(target), out=str(out), kind="mtp", data=str(data), mtp_layers=S, steps=120,
                     device="cpu", seq_len=128, batch_tokens=512, gen=24, prompt_sets="instruct", gen_tokens=48, eval_every=40,
                     eval_prompts=2, lr=3e-3, time_budget=None)
    assert cmd_train(args) == 0
    return target, data, out


@pytest.mark.slow  # the module's training run
def test_loss_falls_and_provenance(trained):
    _, _, out = trained
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["kind"] == "mtp" and prov["train"]["mtp_layers"] == S
    assert prov["train"]["steps_done"] == 120
    assert prov["train"]["last_loss"] < prov["train"]["first_loss"] - 0.3
    assert prov["validation_history"] and len(prov["final_eval"]["step_acc"]) == S
    assert prov["final_eval"]["accept_len_estimate"] >= 1.0
    assert prov["final_eval"]["speculator"]["identical"] == 2
    assert (out / "README.md").read_text().startswith("# Chain-MTP layers")


@pytest.mark.slow  # the module's training run
def test_localchat_format(trained):
    _, _, out = trained
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LocalchatMTP"] and cfg["num_nextn_predict_layers"] == S
    assert cfg["mtp_chain"] is True and cfg["hidden_size"] == 64 and cfg["vocab_size"] == 384
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("mtp_layers.0.input_proj.weight").dtype == torch.bfloat16
    assert names == {f"mtp_layers.{i}.{k}" for i in range(S) for k in LAYER_KEYS}


@pytest.mark.slow  # the module's training run
def test_layers_load_and_are_lossless(trained):
    target, data, out = trained
    engine = Engine.load(str(target), draft=str(out), device="cpu", draft_steps=S)
    for msgs in heldout_prompts(2, data=str(data)):
        params = SamplingParams(max_tokens=64)
        plain = engine.generate(msgs, params, speculative=False)
        engine.reset()
        spec = engine.generate(msgs, params, speculative=True)
        engine.reset()
        assert spec.token_ids == plain.token_ids
        assert spec.stats.verify_steps > 0


def test_alignment():
    """Layer s at p reads t_{p+s+1} and is labelled by the target at p+s+1, inside p's sequence."""
    def doc(n, off):
        m = n - 1
        return DocFeatures(tokens=torch.arange(m) + off, aux=torch.zeros(m, 2), label_hidden=torch.zeros(m, 2),
                           greedy=torch.arange(m) + off, is_response=torch.zeros(m, dtype=torch.bool))

    batch = TTTBatch.from_rows([[doc(4, 0), doc(3, 100)]], 8)  # entries: 0 1 2 | 100 101 | pad
    assert shift_left(batch.tokens, 2)[0, :3].tolist() == [2, 100, 101]
    assert valid(batch, 0)[0].tolist() == [True] * 5 + [False] * 3
    assert valid(batch, 1)[0].tolist() == [True, True, False, True, False, False, False, False]
    assert valid(batch, 2)[0].tolist() == [True] + [False] * 7


@pytest.mark.slow  # the module's training run
def test_unroll_equals_the_inference_layers(trained):
    """The sequence-parallel training forward gives, at every position and layer, what MTPDraft.step
    (the engine's path, one KV cache per layer) computes over the whole sequence in chain mode."""
    from engine.forward_batch import ForwardBatch
    from engine.kv_cache import KVCache
    from engine.loader import load_folder
    from speculative.train.mtp import init_layers
    from speculative.train.mtp_unroll import unroll
    from speculative.train.teacher import Teacher
    from speculative.train.data import Sequence

    target = trained[0]
    loaded = load_folder(target, torch.device("cpu"), torch.float32, 64)
    m = loaded.model
    draft, mc = init_layers(loaded, S, seed=1)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    ids = [(7 * i + 5) % 300 for i in range(20)]
    teacher = Teacher(loaded, (loaded.config.num_layers,), 64, 1 << 20)
    batch = TTTBatch.from_rows([[teacher.features("k", Sequence(ids))]], 32)
    with torch.no_grad():
        normed = unroll(draft, m.model.embed_tokens, m.model.norm, batch, m.cos_sin)
        kv = KVCache(loaded.config.num_layers, 64, loaded.config.num_kv_heads, loaded.config.head_dim,
                     torch.float32, "cpu")
        x = m(ForwardBatch.eager(torch.tensor(ids), 0), kv).hidden  # h_0 .. h_{n-1}
        n = len(ids)
        for s in range(S):
            count = n - 1 - s  # positions p whose token t_{p+s+1} exists
            tok = torch.tensor(ids[s + 1:s + 1 + count])
            cache = KVCache(1, 64, mc.num_kv_heads, mc.head_dim, torch.float32, "cpu")
            x, ref = draft.step(s, tok, x[:count], ForwardBatch.eager(tok, 0), m.model.embed_tokens, cache, m.cos_sin)
            torch.testing.assert_close(normed[s][0, :count], ref, atol=1e-4, rtol=1e-4)
