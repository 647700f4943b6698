"""Sampled speculation on the demo model with its shipped head: temperature alone, with top-p,
and with top-k + min-p, speculation off and on in one process, on held-out chitchat prompts
(seed = prompt index, 256 tokens). Reports tokens/s both ways, the speed-up, the accepted length
and whether the request ran as a captured SampledIteration graph.

    python benchmarks/sampled_cuts.py OUT.json
"""

import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.prompts import chat_prompts_from
from engine.engine import Engine
from engine.types import SamplingParams


def main() -> None:
    e = Engine.load("demo", device="cuda")
    prompts, which = chat_prompts_from(8)
    out = {"machine": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "python": platform.python_version()},
           "model": "demo", "draft": e.draft_name, "draft_steps": e.speculator.k, "max_tokens": 256,
           "seeds": "prompt index", "prompt_set": which, "rows": []}
    for name, kw in [("t0.7", {"temperature": 0.7}), ("t0.7 top_p0.9", {"temperature": 0.7, "top_p": 0.9}),
                     ("t0.7 top_k40 min_p0.05", {"temperature": 0.7, "top_k": 40, "min_p": 0.05})]:
        plain_s = spec_s = plain_n = spec_n = 0
        accept = []
        for i, m in enumerate(prompts):
            p = SamplingParams(max_tokens=256, seed=i, **kw)
            e.reset()
            a = e.generate(m, p, speculative=False)
            e.reset()
            b = e.generate(m, p, speculative=True)
            plain_s += a.stats.decode_s
            plain_n += len(a.token_ids)
            spec_s += b.stats.decode_s
            spec_n += len(b.token_ids)
            accept.append(b.stats.accept_len_mean)
        sampled = e.speculator.sampled
        row = {"sampling": name, "plain_tok_s": plain_n / plain_s, "spec_tok_s": spec_n / spec_s,
               "speedup": (spec_n / spec_s) / (plain_n / plain_s), "accept": sum(accept) / len(accept),
               "graph": sampled.graphs[sampled.cut] is not None}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
