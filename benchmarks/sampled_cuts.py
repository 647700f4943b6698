"""Sampled speculation on the demo model with its shipped head: temperature alone, with top-p,
and with top-k + min-p, in one process on held-out chitchat prompts under the app's default
system prompt (seed = prompt index, at most 256 tokens, ending at EOS): plain decoding with no
draft loaded (Engine.without_draft), with the draft loaded and speculation off, and speculation
on. Reports tokens/s each way (tokens after the first over decode time, summed over the prompts),
the speed-ups over both plain figures, the accepted length and whether the request ran as a
captured SampledIteration graph.

    python benchmarks/sampled_cuts.py OUT.json
"""

import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.settings import Settings
from benchmarks.harness.prompts import chat_prompts_from
from engine.engine import Engine
from engine.types import SamplingParams


def main() -> None:
    e = Engine.load("demo", device="cuda")
    no_draft = e.without_draft()
    prompts, which = chat_prompts_from(8)
    system = Settings().system_prompt  # as a new chat in the app asks
    prompts = [[{"role": "system", "content": system}] + m for m in prompts]
    out = {"machine": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "python": platform.python_version()},
           "model": "demo", "draft": e.draft_name, "draft_steps": e.speculator.k, "max_tokens": 256,
           "seeds": "prompt index", "prompt_set": which, "system_prompt": system, "rows": []}
    for name, kw in [("t0.7", {"temperature": 0.7}), ("t0.7 top_p0.9", {"temperature": 0.7, "top_p": 0.9}),
                     ("t0.7 top_k40 min_p0.05", {"temperature": 0.7, "top_k": 40, "min_p": 0.05})]:
        tokens = {"no_draft": 0, "plain": 0, "spec": 0}
        seconds = dict.fromkeys(tokens, 0.0)
        accept = []
        for i, m in enumerate(prompts):
            p = SamplingParams(max_tokens=256, seed=i, **kw)
            for setting, engine, spec in (("no_draft", no_draft, False), ("plain", e, False), ("spec", e, True)):
                engine.reset()
                r = engine.generate(m, p, speculative=spec)
                tokens[setting] += max(r.stats.generated_tokens - 1, 0)  # decode_s starts after the first
                seconds[setting] += r.stats.decode_s
                if spec:
                    accept.append(r.stats.accept_len_mean)
        tok_s = {k: tokens[k] / seconds[k] for k in tokens}
        sampled = e.speculator.sampled
        row = {"sampling": name, "no_draft_tok_s": tok_s["no_draft"], "plain_tok_s": tok_s["plain"],
               "spec_tok_s": tok_s["spec"], "speedup_vs_no_draft": tok_s["spec"] / tok_s["no_draft"],
               "speedup_vs_draft_off": tok_s["spec"] / tok_s["plain"], "accept": sum(accept) / len(accept),
               "graph": sampled.graphs[sampled.cut] is not None}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
