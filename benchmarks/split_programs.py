"""benchmarks/tree_shapes.py with another count of the attention's split programs a row for steps
of several rows (engine/kernels/attention.py, _split_programs): min(splits, max(F, ceil(W * SMs /
(kv heads * rows)))), where the engine takes F = 4, W = 2. A split's partial does not depend on
which program reads it, so the answers stay the same; only the time moves.

    python benchmarks/split_programs.py F W --model demo --prompts 24 --tree 4,4,15 --tree 4,5,24 --out FILE
"""
import math
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import engine.kernels.attention as A  # noqa: E402

if len(sys.argv) < 3:
    raise SystemExit("usage: python benchmarks/split_programs.py F W TREE_SHAPES_ARGS...")
F, W = int(sys.argv[1]), float(sys.argv[2])
orig = A._split_programs


def programs(num_splits, num_kv_heads, num_sms, rows=1):
    if rows == 1:
        return orig(num_splits, num_kv_heads, num_sms, rows)
    return min(num_splits, max(F, math.ceil(W * num_sms / (num_kv_heads * rows))))


A._split_programs = programs
sys.argv = [str(ROOT / "benchmarks/tree_shapes.py")] + sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")
