"""Configs and GGUF metadata are checked before anything is allocated: every bad value ends in
one line and exit status 2, in moments, however large the model it describes."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from app.cli import main
from engine.config import ModelConfig
from engine.errors import ModelLoadError, UserError
from tests.tiny import make_tiny_model

FAST_S = 10.0  # generous on a loaded 2-core machine; the cases fixed here took minutes before


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("validation") / "llama", "llama")


def run_cli(capsys, *args) -> tuple[int, list[str], float]:
    t0 = time.perf_counter()
    rc = main(["run", "--device", "cpu", "--max-tokens", "2", *args])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, [line for line in err.strip().splitlines() if not line.startswith("[localchat]")], elapsed


def assert_refused(capsys, args, needle: str) -> None:
    rc, lines, elapsed = run_cli(capsys, *args)
    assert rc == 2, lines
    assert len(lines) == 1, lines
    assert needle.lower() in lines[0].lower(), lines[0]
    assert elapsed < FAST_S, f"took {elapsed:.1f} s"


def edited(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is _DELETE:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


_DELETE = object()
_LLAMA3_NO_LOW = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}


@pytest.mark.parametrize("changes,needle", [
    ({"num_hidden_layers": 100000}, "num_hidden_layers"),
    ({"num_hidden_layers": 500}, "hold 2 layers"),  # within bounds: caught against the tensors
    ({"num_hidden_layers": 1}, "hold 2 layers"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"hidden_size": "abc"}, "hidden_size must be an integer"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ({"intermediate_size": [128]}, "intermediate_size must be an integer"),
    ({"architectures": "LlamaForCausalLM"}, "list of strings"),
    ({"rms_norm_eps": "nan"}, "rms_norm_eps"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
    ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ({"rope_theta": -1}, "rope_theta"),
    ({"rope_theta": 0, "rope_scaling": None, "rope_parameters": None}, "rope_theta"),
    ({"rope_scaling": _LLAMA3_NO_LOW, "rope_parameters": _DELETE}, "low_freq_factor"),
    ({"rope_scaling": {"rope_type": "linear"}, "rope_parameters": _DELETE}, "factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": "4"}, "rope_parameters": _DELETE}, "rope_scaling.factor"),
    ({"rope_scaling": ["llama3"], "rope_parameters": _DELETE}, "rope_scaling must be a json object"),
    ({"vocab_size": 1000}, "embedding has shape"),
    ({"hidden_size": 62, "head_dim": _DELETE}, "not divisible"),
    ({"head_dim": 15}, "head_dim must be even"),
    ({"eos_token_id": "</s>"}, "eos_token_id must be an integer"),
    ({"max_position_embeddings": 10**30}, "max_position_embeddings"),
])
def test_bad_config_values(tmp_path, llama, capsys, changes, needle):
    folder = edited(llama, tmp_path / "m", **changes)
    assert_refused(capsys, ["--model", str(folder), "hi"], needle)


def test_a_5000_digit_integer(tmp_path, llama, capsys):
    folder = edited(llama, tmp_path / "m")
    text = (folder / "config.json").read_text().replace('"vocab_size": 384', '"vocab_size": 1' + "0" * 5000)
    (folder / "config.json").write_text(text)
    assert_refused(capsys, ["--model", str(folder), "hi"], "5001 digits")


def test_a_config_that_is_not_an_object(tmp_path, llama, capsys):
    folder = edited(llama, tmp_path / "m")
    (folder / "config.json").write_text(json.dumps([{"architectures": ["LlamaForCausalLM"]}]))
    assert_refused(capsys, ["--model", str(folder), "hi"], "must hold a json object")


def test_a_config_that_is_not_utf8(tmp_path, llama, capsys):
    folder = edited(llama, tmp_path / "m")
    (folder / "config.json").write_bytes(b'{"architectures": ["\xff"]}')
    assert_refused(capsys, ["--model", str(folder), "hi"], "not valid json")


def test_a_bad_generation_config(tmp_path, llama, capsys):
    folder = edited(llama, tmp_path / "m")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ["x"]}))
    assert_refused(capsys, ["--model", str(folder), "hi"], "eos_token_id must be an integer")


def test_the_unchanged_model_still_answers(llama, capsys):
    """The checks refuse what is wrong, not what is unusual: the fixture itself loads and answers."""
    rc, lines, _ = run_cli(capsys, "--model", str(llama), "hi")
    assert rc == 0, lines


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_real_configs_pass(tmp_path, arch):
    """Each tiny architecture's config (llama3, yarn and linear RoPE scaling) and its tensors pass."""
    from engine.weights.checkpoint import tensor_shapes, weight_files

    folder = make_tiny_model(tmp_path / arch, arch)
    cfg = ModelConfig.from_file(folder / "config.json")
    cfg.check_tensors(tensor_shapes(weight_files(folder)), arch)


# --- GGUF -----------------------------------------------------------------------------------
VOCAB, HIDDEN, FF, HEADS = 16, 32, 64, 2
_META = {"block_count": 1, "context_length": 64, "embedding_length": HIDDEN, "feed_forward_length": FF,
         "attention.head_count": HEADS, "attention.head_count_kv": HEADS}


def write_gguf(path, meta: dict | None = None, tokens: bool = True, blocks: int = 1):
    """A complete one-block llama GGUF (zero weights) with `meta` overriding its metadata."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {**_META, **(meta or {})}.items():
        if value is None:
            continue
        if isinstance(value, str):
            w.add_string(f"llama.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"llama.{key}", value)
        else:
            w.add_uint64(f"llama.{key}", value) if value >= 2**32 else w.add_uint32(f"llama.{key}", value)
    if tokens:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(VOCAB)])
    zeros = lambda *shape: np.zeros(shape, dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", zeros(VOCAB, HIDDEN))
    w.add_tensor("output_norm.weight", zeros(HIDDEN))
    for b in range(blocks):
        for name, shape in [("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)), ("attn_v", (HIDDEN, HIDDEN)),
                            ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (FF, HIDDEN)), ("ffn_up", (FF, HIDDEN)),
                            ("ffn_down", (HIDDEN, FF)), ("attn_norm", (HIDDEN,)), ("ffn_norm", (HIDDEN,))]:
            w.add_tensor(f"blk.{b}.{name}.weight", zeros(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_complete_gguf_passes_the_checks(tmp_path):
    from engine.weights.gguf import gguf_shapes, hf_config, open_gguf

    path = write_gguf(tmp_path / "ok.gguf")
    reader = open_gguf(path)
    cfg = ModelConfig.from_hf(hf_config(reader, path), path.name)
    cfg.check_tensors(gguf_shapes(reader), path.name)
    assert (cfg.num_layers, cfg.vocab_size, cfg.hidden_size) == (1, VOCAB, HIDDEN)


@pytest.mark.parametrize("meta,tokens,needle", [
    ({"block_count": 1_000_000}, True, "llama.block_count"),
    ({"block_count": 500}, True, "block_count = 500 but the weights hold 1 layer"),
    ({"attention.head_count": 0}, True, "llama.attention.head_count"),
    ({"attention.head_count_kv": 0}, True, "head_count_kv"),
    ({"block_count": "many"}, True, "llama.block_count must be an integer"),
    ({"embedding_length": None}, True, "llama.embedding_length"),
    ({"attention.layer_norm_rms_epsilon": float("nan")}, True, "layer_norm_rms_epsilon"),
    ({"rope.freq_base": -1.0}, True, "rope.freq_base"),
    ({}, False, "tokenizer.ggml.tokens"),
])
def test_bad_gguf_metadata(tmp_path, capsys, meta, tokens, needle):
    path = write_gguf(tmp_path / "bad.gguf", meta, tokens=tokens)
    assert_refused(capsys, ["--model", str(path), "hi"], needle)


def test_gguf_blocks_beyond_block_count(tmp_path):
    from engine.weights.gguf import gguf_shapes, hf_config, open_gguf

    path = write_gguf(tmp_path / "extra.gguf", blocks=3)
    reader = open_gguf(path)
    with pytest.raises(ModelLoadError, match="block_count|num_hidden_layers"):
        ModelConfig.from_hf(hf_config(reader, path), path.name).check_tensors(gguf_shapes(reader), path.name)


def test_hub_configs_that_are_not_objects(tmp_path):
    """The pairing check reads downloaded config.json files: a list or a nested list is one line."""
    from engine.hub.pairing import check_draft_pair, read_config

    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="JSON object"):
        read_config(tmp_path)
    target = {"architectures": ["LlamaForCausalLM"], "text_config": [], "vocab_size": 10, "hidden_size": 8}
    draft = {"architectures": "Eagle3Speculator", "transformer_layer_config": ["x"], "draft_vocab_size": 4,
             "vocab_size": 12}
    with pytest.raises(UserError, match="vocabulary 12 vs 10"):
        check_draft_pair("some/llama", target, "some/head", draft)
