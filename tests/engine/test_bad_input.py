"""Bad input: exit status 2 and one line saying what is wrong; never a traceback."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest


def _run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def _assert_one_line_error(out, needle):
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = [l for l in out.stderr.strip().splitlines() if not l.startswith("[localchat]")]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


def test_missing_path(tmp_path):
    _assert_one_line_error(_run("run", "--model", str(tmp_path / "nope"), "hi"), "no such file")


def test_folder_without_config(tmp_path):
    _assert_one_line_error(_run("run", "--model", str(tmp_path), "hi"), "config.json")


def test_unsupported_architecture(tmp_path, tiny_models):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    _assert_one_line_error(_run("run", "--model", str(folder), "--device", "cpu", "hi"), "unsupported architecture")


def test_truncated_safetensors(tmp_path, tiny_models):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    _assert_one_line_error(_run("run", "--model", str(folder), "--device", "cpu", "hi"), "model.safetensors")


def test_missing_and_unexpected_tensors_are_named(tmp_path, tiny_models):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    sd = load_file(folder / "model.safetensors")
    sd.pop("model.layers.1.mlp.down_proj.weight")
    sd["model.layers.0.self_attn.extra.weight"] = sd["model.norm.weight"].clone()
    save_file(sd, folder / "model.safetensors")
    out = _run("run", "--model", str(folder), "--device", "cpu", "hi")
    _assert_one_line_error(out, "model.layers.1.mlp.down_proj.weight")
    assert "model.layers.0.self_attn.extra.weight" in out.stderr


def test_gguf_with_unsupported_tensor_type(tmp_path):
    import gguf

    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, val in [("block_count", 1), ("context_length", 64), ("embedding_length", 32),
                     ("feed_forward_length", 64), ("attention.head_count", 2)]:
        getattr(w, "add_uint32")(f"llama.{key}", val)
    w.add_uint32("llama.vocab_size", 16)
    w.add_tokenizer_model("gpt2")  # complete metadata and block 0: the checks before allocation pass
    w.add_token_list([f"t{i}" for i in range(16)])
    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.zeros((32,), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.zeros((8,), dtype=np.int32), raw_dtype=gguf.GGMLQuantizationType.I32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_one_line_error(_run("run", "--model", str(path), "--device", "cpu", "hi"), "I32")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf at all")
    _assert_one_line_error(_run("run", "--model", str(path), "--device", "cpu", "hi"), "junk.gguf")


def test_prompt_longer_than_context(tiny_models):
    out = _run("run", "--model", str(tiny_models["llama"]), "--device", "cpu", "--max-seq-len", "32",
               "word " * 200)
    _assert_one_line_error(out, "context")


@pytest.mark.parametrize("flag,value", [("--temperature", "-1"), ("--top-p", "0"), ("--top-p", "1.5"),
                                        ("--min-p", "1"), ("--top-k", "-3"), ("--max-tokens", "0"),
                                        ("--repetition-penalty", "0"), ("--temperature", "warm")])
def test_invalid_sampling_values(flag, value):
    _assert_one_line_error(_run("run", flag, value, "hi"), flag if value != "warm" else "temperature")


def test_bad_device():
    _assert_one_line_error(_run("run", "--device", "tpu", "hi"), "--device")


def test_corrupt_tokenizer(tmp_path, tiny_models):
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    (folder / "tokenizer.json").write_text("{not json")
    _assert_one_line_error(_run("run", "--model", str(folder), "--device", "cpu", "hi"), "cannot load the tokenizer")


def test_a_wrong_draft_fails_before_the_target_loads(tmp_path, tiny_models, monkeypatch):
    """--draft is found before the target's weights load: a typo costs a moment, not a long load."""
    import engine.build as build
    from engine import Engine
    from engine.errors import UserError

    def no_load(*a, **kw):
        raise AssertionError("the target was loaded before the draft was checked")

    monkeypatch.setattr(build, "load_folder", no_load)
    monkeypatch.setattr(build, "load_gguf", no_load)
    with pytest.raises(UserError, match="no such file or folder"):
        Engine.load(str(tiny_models["llama"]), draft=str(tmp_path / "nope"), device="cpu")
    with pytest.raises(UserError, match="trained for the demo model"):
        Engine.load(str(tiny_models["llama"]), draft="demo-eagle3", device="cpu")


def test_a_closed_stdout_ends_quietly(tiny_models):
    """`localchat run ... | head -c 5`: when the reader goes away, no error and no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "run", "--model", str(tiny_models["llama"]), "--device",
                             "cpu", "--max-tokens", "20", "hello"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ))
    proc.stdout.close()  # before the answer starts: its first write hits a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=240) == 141
    assert "error" not in err.lower() and "Traceback" not in err, err


def test_prompt_from_stdin(tiny_models):
    args = ("run", "--model", str(tiny_models["llama"]), "--device", "cpu", "--max-tokens", "4", "--json", "-")
    out = subprocess.run([sys.executable, "-m", "app.cli", *args], input="hello there\n", capture_output=True,
                         text=True, timeout=240, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["prompt_tokens"] > 0
    empty = subprocess.run([sys.executable, "-m", "app.cli", *args], input="  \n", capture_output=True, text=True,
                           timeout=240, env=dict(os.environ))
    _assert_one_line_error(empty, "the prompt is empty")
