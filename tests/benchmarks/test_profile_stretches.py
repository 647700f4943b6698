"""benchmarks/profile_stretches.py: a step's launches summed from one marker launch to the next,
overlaps counted once; a file that is not a profile refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benchmarks" / "profile_stretches.py")
sys.path.insert(0, str(ROOT))

from benchmarks.profile_stretches import stretches  # noqa: E402


def _slot(name, us, gap):
    return {"name": name, "us": us, "gap_before_us": gap}


def test_launches_go_to_the_stretch_of_the_marker_before_them(tmp_path):
    slots = [_slot("elementwise", 1.0, 2.0), _slot("tree_level_kernel", 12.0, 0.3), _slot("indexSelect", 3.2, 0.2),
             _slot("embed_pair_norm_kernel", 2.0, -0.2), _slot("dot_kernel", 5.3, -1.4),
             _slot("tree_select_kernel", 104.9, -10.1), _slot("embed_rows_kernel", 95.5, -94.4)]
    rows = stretches(slots)
    assert [(r["marker"], r["first"], r["launches"]) for r in rows] == [
        ("start", 0, 1), ("tree_level", 1, 2), ("embed_pair_norm", 3, 2), ("tree_select", 5, 1), ("embed_rows", 6, 1)]
    assert [round(r["wall_us"], 6) for r in rows] == [3.0, 15.7, 5.7, 94.8, 1.1]
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"graph_slots": slots}))
    out = tmp_path / "s.json"
    run = subprocess.run([sys.executable, SCRIPT, str(profile), "--out", str(out)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "total 120.3 us in 7 launches" in run.stdout
    assert json.loads(out.read_text())["by_marker"]["tree_level"] == {"stretches": 1, "launches": 2, "wall_us": 15.7}


def test_a_file_that_is_not_a_profile_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    run = subprocess.run([sys.executable, SCRIPT, str(bad)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip() == f"profile_stretches.py: {bad}: not a profile_iteration.py JSON with graph_slots"
