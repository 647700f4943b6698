"""`localchat download` stopped by SIGINT or SIGTERM in a real process: nothing partial stays, a rerun completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hub_fixtures import fake_hub  # noqa: F401
from tests.hub_server import Tamper

ROOT = Path(__file__).resolve().parents[2]
SHARD = "model-00001-of-00002.safetensors"


def download(fake_hub, tmp_path: Path, *argv: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf"), "LOCALCHAT_HOME": str(tmp_path / "lc"),
            "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "app.cli", "download", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def partials(cache: Path) -> list[Path]:
    return list(cache.rglob("*.incomplete")) if cache.exists() else []


def partial_bytes(cache: Path) -> int:
    """Bytes in the partial files now; a small file's partial may be renamed between the listing
    and its stat (it finished), which counts as none."""
    total = 0
    for p in partials(cache):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


# SIGTERM: 143 from the download command's own handler; 130 where the CLI turns SIGTERM into Ctrl+C first
@pytest.mark.parametrize("sig, codes", [(signal.SIGINT, (130,)), (signal.SIGTERM, (143, 130))])
def test_a_signal_mid_download_leaves_nothing_partial_and_a_rerun_completes(fake_hub, tmp_path, sig, codes):
    cache = tmp_path / "hf" / "hub"
    fake_hub.tampers[("tiny/llama", SHARD)] = Tamper(rate_bytes_per_s=20_000)  # about 14 s for this shard
    try:
        proc = download(fake_hub, tmp_path, "tiny/llama")
        wait_for(lambda: partial_bytes(cache) > 0, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        fake_hub.reset()
    assert proc.returncode in codes, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("localchat: download stopped; finished files are kept")
    assert partials(cache) == []
    assert not list(cache.glob(f"models--tiny--llama/snapshots/*/{SHARD}"))  # nothing counted as present
    proc = download(fake_hub, tmp_path, "tiny/llama")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (Path(out.strip()) / SHARD).read_bytes() == fake_hub.repos["tiny/llama"].files[SHARD]
