"""Which weight format a model runs in: `localchat run --json` says it, `doctor` says the demo's."""

import json

import pytest

from app.cli import main
from tests.tiny_gguf import make_tiny_gguf


@pytest.fixture(scope="module")
def q4_0_gguf(tmp_path_factory):
    base = tmp_path_factory.mktemp("weights-format")
    return make_tiny_gguf(base / "tiny-Q4_0.gguf", base / "work", qtype="Q4_0")


def _run_json(capsys, model) -> dict:
    assert main(["run", "--model", str(model), "--device", "cpu", "--json", "--max-tokens", "2", "Hi"]) == 0, \
        capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_run_json_names_the_weight_format(tiny_models, q4_0_gguf, capsys):
    assert _run_json(capsys, tiny_models["llama"])["weights"] == "fp32"  # transformers saved it in float32
    result = _run_json(capsys, q4_0_gguf)
    assert result["weights"] == "Q4_0" and result["model"] == q4_0_gguf.name
    assert result["runs_as"] == "fp32"  # the CPU dequantizes it
    assert _run_json(capsys, q4_0_gguf)["weights"] == "Q4_0"  # from the prepared copy this time


def test_the_status_bar_says_what_the_weights_run_in():
    from types import SimpleNamespace as E

    from app.engine_worker import weights_text

    assert weights_text(E(weights="Q4_1", runs_as="Q4_1")) == "Q4_1"  # decoded in place on a GPU
    assert weights_text(E(weights="Q4_K_M", runs_as="bf16")) == "Q4_K_M as bf16"  # dequantized at load
    assert weights_text(E(weights="bf16", runs_as="bf16")) == "bf16"
    assert weights_text(E(weights="fp32", runs_as="bf16")) == "bf16"  # a float checkpoint in this device's dtype
    assert weights_text(E()) == ""  # a server: unknown


def test_doctor_names_the_demos_weight_format(q4_0_gguf, tmp_path, monkeypatch, capsys):
    import shutil

    from engine.hub.demo import demo_gguf_path

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    assert main(["doctor"]) == 0
    assert "(not fetched yet)" in capsys.readouterr().out
    demo_gguf_path().parent.mkdir(parents=True)
    shutil.copy(q4_0_gguf, demo_gguf_path())  # a stand-in: doctor reads only the header
    assert main(["doctor"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("demo model"))
    assert line.endswith("(present, Q4_0 weights)")


def test_doctor_says_what_quantized_weights_run_in(monkeypatch, capsys):
    from app.commands import _quantized_rule

    assert main(["doctor"]) == 0
    assert "quantized    GGUF, AWQ, GPTQ and FP8 weights run dequantized to fp32 (CPU)" in capsys.readouterr().out
    monkeypatch.delenv("LOCALCHAT_PACKED_WEIGHTS", raising=False)
    assert "where that fits in the GPU's free memory" in _quantized_rule(True)
    monkeypatch.setenv("LOCALCHAT_PACKED_WEIGHTS", "0")
    assert "dequantized to bf16" in _quantized_rule(True)
    monkeypatch.setenv("LOCALCHAT_PACKED_WEIGHTS", "1")
    assert "decoded in place" in _quantized_rule(True)
    assert "rounded to int8" in _quantized_rule(True)
    monkeypatch.setenv("LOCALCHAT_PACKED_ROW_X", "bf16")
    assert "int8" not in _quantized_rule(True)
