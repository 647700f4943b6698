"""benchmarks/draft_temperature.py on the demo model: it sees every verify step of a sampled
answer and reports, per draft temperature, overlaps that are probabilities."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # real weights on the CPU
def test_the_draft_temperature_overlaps_are_recorded_at_every_verify_step(demo_gguf, tmp_path):
    out = tmp_path / "dt.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "draft_temperature.py"), "--prompts", "1",
                    "--new-tokens", "24", "--out", str(out)], check=True, cwd=ROOT, env=dict(os.environ),
                   capture_output=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["verify_steps"] > 0 and report["temperature"] == 0.7
    assert set(report["by_ratio"]) == {"0.6", "0.7", "0.8", "0.9", "1.0", "1.1", "1.25", "1.5"}
    for entry in report["by_ratio"].values():
        assert 0.0 < entry["position_1"] <= 1.0 and len(entry["by_position"]) >= 1
        assert all(0.0 <= v <= 1.0 for v in entry["by_position"])
