"""Drafts that ship pytorch_model*.bin (as most EAGLE-3 heads on the Hub do): read as plain
tensors, the same weights as their safetensors twin, and lossless against plain decoding."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.engine import Engine
from engine.errors import ModelLoadError
from engine.types import SamplingParams
from tests.speculative.heads import head_tensors, markov_target, write_head
from tests.speculative.mtp_layers import make_mimo, random_layers, write_localchat_mtp
from tests.tiny import make_tiny_model, read_config

PROMPT = [{"role": "user", "content": "Tell me about the quick brown fox."}]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("bin_target") / "llama", "llama", num_layers=4, seed=3)


def to_bin(folder: Path, dtype: torch.dtype | None = None) -> Path:
    """Replaces every safetensors file (and index) by pytorch_model*.bin written with torch.save."""
    st_index = folder / "model.safetensors.index.json"
    if st_index.exists():
        data = json.loads(st_index.read_text())
        rename = {f: f.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
                  for f in set(data["weight_map"].values())}
        data["weight_map"] = {k: rename[v] for k, v in data["weight_map"].items()}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(data))
        st_index.unlink()
    else:
        rename = {f.name: "pytorch_model.bin" for f in folder.glob("*.safetensors")}
    for st, bin_name in rename.items():
        tensors = load_file(str(folder / st))
        if dtype is not None:
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
        torch.save(tensors, folder / bin_name)
        (folder / st).unlink()
    return folder


def run(engine, speculative, n=24):
    engine.reset()
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    events = list(engine.stream_ids(ids, SamplingParams(max_tokens=n), speculative=speculative))
    return [t for ev in events for t in ev.token_ids], events[-1].stats


def load(target, draft, k=3):
    e = Engine.load(str(target), draft=str(draft), device="cpu", draft_steps=k)
    e.tokenizer.eos_token_ids = frozenset()
    return e


CASES = [  # (format, draft hidden, draft vocab, aux input-of-layer ids, dtype of the .bin)
    ("eagle", 64, 200, None, None),  # EAGLE official: LlamaForCausalLM + draft_vocab_size
    ("eagle", 64, 200, None, torch.bfloat16),  # as the Hub's heads are stored
    ("sglang", 64, 160, (1, 2, 4), None),  # SGLang/SpecForge: LlamaForCausalLMEagle3
    ("speculators", 48, 160, (0, 2, 3), None),  # narrower than the target: its own embeddings
]


@pytest.mark.parametrize("fmt,hidden,draft_vocab,aux_ids,dtype", CASES)
def test_a_bin_head_is_lossless_and_drafts_like_its_safetensors_twin(tmp_path, target, fmt, hidden, draft_vocab,
                                                                     aux_ids, dtype):
    cfg = read_config(target)
    t = head_tensors(hidden, cfg["hidden_size"], 3, cfg["vocab_size"], draft_vocab, seed=1)
    if dtype is not None:  # the twin holds the same rounded values, so the drafts must agree exactly
        t = {k: v.to(dtype).float() if v.is_floating_point() else v for k, v in t.items()}
    st_head = write_head(tmp_path / "st", cfg, fmt, t, hidden, aux_ids)
    bin_head = to_bin(Path(shutil.copytree(st_head, tmp_path / "bin")), dtype)
    assert sorted(p.name for p in bin_head.iterdir()) == ["config.json", "pytorch_model.bin"]
    e = load(target, bin_head)
    twin = dict(load(target, st_head).speculator.draft.named_parameters())
    for name, p in e.speculator.draft.named_parameters():
        assert torch.equal(p, twin[name]), name
    assert torch.equal(e.speculator.draft.d2t, t["d2t"])
    plain, _ = run(e, False)
    spec, stats = run(e, True)
    assert spec == plain
    assert stats.speculative and stats.verify_steps > 0 and stats.draft_steps == 3


def test_a_bin_head_the_target_agrees_with_is_accepted_in_full(tmp_path, target):
    """A Markov target that repeats token a, and a bf16 .bin head (EAGLE official format) whose
    logits are all equal, so it always proposes draft id 0, which its d2t maps to a."""
    cfg = read_config(target)
    last = Engine.load(str(target), device="cpu").tokenizer.apply_chat_template(PROMPT)[-1]
    a, k = 40, 4
    markov = markov_target(target, tmp_path / "markov", {last: a, a: a})
    t = head_tensors(64, 64, 3, cfg["vocab_size"], 16, seed=2)
    t["lm_head.weight"] = torch.zeros_like(t["lm_head.weight"])
    t["d2t"] = torch.zeros(16, dtype=torch.long)
    t["d2t"][0] = a
    head = to_bin(write_head(tmp_path / "const", cfg, "eagle", t, 64, None), torch.bfloat16)
    e = load(markov, head, k)
    plain, _ = run(e, False, n=40)
    spec, stats = run(e, True, n=40)
    assert spec == plain == [a] * 40
    assert stats.accept_len_mean > k  # every verify step keeps all k drafts plus the bonus


def test_localchat_mtp_layers_in_a_bin_are_lossless(tmp_path, target):
    cfg = read_config(target)
    draft = to_bin(write_localchat_mtp(tmp_path / "mtp", cfg, random_layers(2, cfg, seed=4), chain=True))
    e = load(target, draft)
    assert e.speculator.k == 2
    plain, _ = run(e, False)
    spec, stats = run(e, True)
    assert spec == plain and stats.speculative and stats.verify_steps > 0


def test_a_sharded_bin_target_with_builtin_mtp_layers(tmp_path):
    """MiMo's layout as .bin shards: the target skips its MTP layers, the draft reads only them."""
    mimo = to_bin(make_mimo(make_tiny_model(tmp_path / "mimo", "qwen2", num_layers=2, seed=9)))
    assert (mimo / "pytorch_model.bin.index.json").is_file() and not list(mimo.glob("*.safetensors"))
    e = Engine.load(str(mimo), draft="mtp:builtin", device="cpu")
    e.tokenizer.eos_token_ids = frozenset()
    shard = torch.load(mimo / "pytorch_model-00002-of-00002.bin", weights_only=True)
    assert torch.equal(e.speculator.draft.mtp_layers[0].input_proj.weight, shard["model.mtp_layers.0.input_proj.weight"])
    plain, _ = run(e, False)
    spec, stats = run(e, True)
    assert spec == plain and stats.speculative


class RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_head_whose_pickle_needs_code_is_refused(tmp_path, target):
    cfg = read_config(target)
    head = to_bin(write_head(tmp_path / "head", cfg, "eagle", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64,
                             None))
    tensors = torch.load(head / "pytorch_model.bin", weights_only=True)
    marker = tmp_path / "ran"
    torch.save(dict(tensors, **{"norm.weight": RunsCode(marker)}), head / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="refused to load .*pytorch_model.bin: it calls posix.system"):
        load(target, head)
    assert not marker.exists()


def test_buffers_a_trainer_saved_beside_the_weights_are_ignored(tmp_path, target):
    """EAGLE's own checkpoints carry t2d, and some trainers save RoPE's inv_freq buffer."""
    cfg = read_config(target)
    t = head_tensors(64, cfg["hidden_size"], 3, cfg["vocab_size"], 200, seed=4)
    head = to_bin(write_head(tmp_path / "h", cfg, "eagle", t, 64, None))
    state = torch.load(head / "pytorch_model.bin", weights_only=True)
    state["t2d"] = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    state["midlayer.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    torch.save(state, head / "pytorch_model.bin")
    e = load(target, head)
    plain, _ = run(e, False)
    spec, stats = run(e, True)
    assert spec == plain and stats.speculative
