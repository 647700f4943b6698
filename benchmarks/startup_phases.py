"""Where a fresh process's time to first token goes: importing torch, CUDA init, importing the
engine, Engine.load (with its own phases) and the first streamed token. Prints one JSON line;
run it several times (the first runs on a machine fill its caches).

    python benchmarks/startup_phases.py [--defer] [--profile FILE]

--profile FILE: also writes the top functions (cumulative time) of Engine.load and the first
token to FILE, from cProfile (which slows both a little; the JSON line then says so).
"""

import time

t0 = time.perf_counter()
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

t1 = time.perf_counter()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t2 = time.perf_counter()
from engine.engine import Engine
from engine.types import SamplingParams

t3 = time.perf_counter()
prof_out = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None
if prof_out:
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
e = Engine.load("demo", device="cuda", defer_capture="--defer" in sys.argv)
t4 = time.perf_counter()
first = None
for ev in e.stream([{"role": "user", "content": "Say hello."}], SamplingParams(max_tokens=8)):
    if first is None:
        first = time.perf_counter()
        if prof_out:
            prof.disable()
t5 = time.perf_counter()
if prof_out:
    import io
    import pstats

    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
    Path(prof_out).write_text(buf.getvalue())
print(json.dumps({"import_torch": t1 - t0, "cuda_init": t2 - t1, "import_engine": t3 - t2, "load": t4 - t3,
                  "phases": e.load_phases, "first_token_after_load": first - t4, "first_token_total": first - t0,
                  "end": t5 - t0, "deferred": "--defer" in sys.argv, "profiled": bool(prof_out)}))
