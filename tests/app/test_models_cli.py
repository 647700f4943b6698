"""`localchat models` answers at once: no torch import, the GGUF header only, nvidia-smi for the GPU."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.hub.fit import GpuMemory, detect_gpu

ROOT = Path(__file__).resolve().parents[2]
DEMO_ELEMENTS = 134_515_008  # parameters in the demo GGUF's tensors (a fact of the file, sha256-pinned)


def test_models_with_the_demo_answers_quickly_without_torch(demo_gguf, tmp_path):
    code = ("import sys, time\nt = time.perf_counter()\nfrom app.cli import main\nrc = main(['models', '--json'])\n"
            "print(rc, 'torch' in sys.modules, 'gguf' in sys.modules, time.perf_counter() - t, file=sys.stderr)")
    _fake_smi(tmp_path, "echo 'Test GPU, 20000, 24000'\n")  # the same answer on every machine, without torch
    env = dict(os.environ, PATH=str(tmp_path))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - t0
    rc, torch_loaded, gguf_loaded, inside = out.stderr.split()[-4:]
    assert (rc, torch_loaded, gguf_loaded) == ("0", "False", "False"), out.stderr
    assert float(inside) < 10 and wall < 30, (inside, wall)  # it took 27-30 s; ~1 s is expected
    data = json.loads(out.stdout)
    demo = next(m for m in data["local"] if m["name"] == "demo")
    from engine.hub.catalog import load_catalog
    from engine.hub.fit import estimate_fit

    shape = load_catalog().by_id("demo").target.shape
    assert demo["need_bytes"] == estimate_fit(DEMO_ELEMENTS * 2, shape, 8192).need_bytes
    assert demo["kind"] == "model" and demo["size_bytes"] == demo_gguf.stat().st_size and demo["fit"] == "fits"
    assert data["gpu"] == {"name": "Test GPU", "free_bytes": 20000 * 2**20, "total_bytes": 24000 * 2**20}


def test_models_table_keeps_its_fields(demo_gguf, capsys):
    from app.cli import main

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GPU: ")
    assert "Downloaded (" in out and "Catalog (needs: weights + draft + KV cache for 8192 tokens" in out
    demo_line = next(line for line in out.splitlines() if line.strip().startswith("demo ") and " model " in line)
    assert "98.4 MB" in demo_line and "needs 1.5 GB" in demo_line


def _fake_smi(folder: Path, body: str) -> Path:
    smi = folder / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$@" > "${0%/*}/args"\n' + body)  # builtins only: PATH is this folder
    smi.chmod(0o755)
    return folder / "args"


def test_gpu_from_nvidia_smi(tmp_path, monkeypatch):
    args = _fake_smi(tmp_path, "echo 'NVIDIA H200, 140000, 143771'\necho 'NVIDIA H200, 1, 143771'\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert detect_gpu() == GpuMemory("NVIDIA H200", 140000 * 2**20, 143771 * 2**20)
    assert "-i" not in args.read_text().split()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")  # CUDA's device 0 is the first one listed
    detect_gpu()
    assert args.read_text().split()[-2:] == ["-i", "3"]


@pytest.mark.parametrize("visible", ["", "-1"])
def test_no_visible_device_means_no_gpu(tmp_path, monkeypatch, visible):
    _fake_smi(tmp_path, "echo 'NVIDIA H200, 140000, 143771'\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert detect_gpu() is None


def test_a_failing_nvidia_smi_without_a_driver_is_no_gpu(tmp_path, monkeypatch):
    import engine.hub.fit as fit

    _fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(fit, "_LINUX_GPU_DRIVERS", (str(tmp_path / "no-driver"),))
    monkeypatch.setattr(fit, "_ask_torch", lambda: pytest.fail("torch asked although no driver is present"))
    assert detect_gpu() is None
