"""Draft configs and d2t maps are checked at load: one line and exit status 2 for every bad
value, before the draft is built or a wrong token is sampled mid-answer."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main
from tests.speculative.heads import head_tensors, write_head
from tests.speculative.mtp_layers import random_layers, write_localchat_mtp
from tests.tiny import make_tiny_model, read_config

FAST_S = 10.0


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("draft-validation") / "llama", "llama", num_layers=4)


def make_head(folder, target, **config_changes):
    cfg = read_config(target)
    head = write_head(folder, cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64, (1, 2, 3))
    raw = json.loads((head / "config.json").read_text())
    raw.update(config_changes)
    (head / "config.json").write_text(json.dumps(raw))
    return head


def set_d2t(head, d2t: torch.Tensor) -> None:
    tensors = load_file(head / "model.safetensors")
    tensors["d2t"] = d2t
    save_file(tensors, str(head / "model.safetensors"))


def assert_refused(capsys, target, draft, needle: str) -> None:
    t0 = time.perf_counter()
    rc = main(["run", "--device", "cpu", "--max-tokens", "2", "--model", str(target), "--draft", str(draft), "hi"])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[localchat]")]
    assert "Traceback" not in err
    assert rc == 2 and len(lines) == 1, lines
    assert needle.lower() in lines[0].lower(), lines[0]
    assert elapsed < FAST_S, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("aux_ids", [None, [-1, 1, 2]])  # SGLang's -1: the embedding output
def test_the_valid_head_loads_and_answers(tmp_path, target, capsys, aux_ids):
    head = make_head(tmp_path / "h", target)
    if aux_ids is not None:
        raw = json.loads((head / "config.json").read_text())
        raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = aux_ids
        (head / "config.json").write_text(json.dumps(raw))
    rc = main(["run", "--device", "cpu", "--max-tokens", "2", "--model", str(target), "--draft", str(head), "hi"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("changes,needle", [
    ({"hidden_size": "abc"}, "hidden_size must be an integer"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"architectures": "LlamaForCausalLMEagle3"}, "list of strings"),
    ({"eagle_config": [1, 2]}, "eagle_config must be a json object"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": "0,1,2"}}, "eagle_aux_hidden_state_layer_ids"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-2, 1, 2]}}, "between -1 and"),
    ({"draft_vocab_size": 10**5000}, "5001 digits"),
    ({"rms_norm_eps": "nan"}, "rms_norm_eps"),
    ({"rope_theta": -1}, "rope_theta"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
])
def test_bad_head_configs(tmp_path, target, capsys, changes, needle):
    if changes.get("draft_vocab_size") == 10**5000:  # json.dumps cannot write it: patch the text
        head = make_head(tmp_path / "h", target)
        text = (head / "config.json").read_text().replace('"draft_vocab_size": 200', '"draft_vocab_size": 1' + "0" * 5000)
        (head / "config.json").write_text(text)
    else:
        head = make_head(tmp_path / "h", target, **changes)
    assert_refused(capsys, target, head, needle)


@pytest.mark.parametrize("shift,needle", [(-1, "-1"), (+1, "outside the target vocabulary")])
def test_d2t_outside_the_target_vocabulary(tmp_path, target, capsys, shift, needle):
    """`draft + d2t[draft]` must land in [0, vocab): below 0 (first id) or past the end (last id)."""
    head = make_head(tmp_path / "h", target)
    d2t = load_file(head / "model.safetensors")["d2t"].clone()
    vocab = read_config(target)["vocab_size"]
    if shift < 0:
        d2t[0] = -1  # draft id 0 -> target id -1
    else:
        d2t[-1] = vocab - (len(d2t) - 1)  # the last draft id -> target id == vocab
    set_d2t(head, d2t)
    assert_refused(capsys, target, head, needle)


def test_d2t_that_is_not_integer(tmp_path, target, capsys):
    head = make_head(tmp_path / "h", target)
    set_d2t(head, load_file(head / "model.safetensors")["d2t"].float() + 0.5)
    assert_refused(capsys, target, head, "integer")


def test_mtp_layer_count_checked_against_the_tensors(tmp_path, target, capsys):
    cfg = read_config(target)
    mtp = write_localchat_mtp(tmp_path / "mtp", cfg, random_layers(2, cfg), chain=True)
    raw = json.loads((mtp / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 900
    (mtp / "config.json").write_text(json.dumps(raw))
    assert_refused(capsys, target, mtp, "num_nextn_predict_layers = 900 but the weights hold 2 layers")


def test_mtp_config_with_bad_values(tmp_path, target, capsys):
    cfg = read_config(target)
    mtp = write_localchat_mtp(tmp_path / "mtp", cfg, random_layers(2, cfg), chain=True)
    raw = json.loads((mtp / "config.json").read_text())
    raw["num_attention_heads"] = "four"
    (mtp / "config.json").write_text(json.dumps(raw))
    assert_refused(capsys, target, mtp, "num_attention_heads must be an integer")
