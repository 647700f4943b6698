"""Accepted length of the demo model's head with and without the chat app's default system
prompt, on held-out chitchat prompts and held-out instruction requests (greedy, one engine).
The shipped head was trained under the model's own template default (no system message).

    python benchmarks/system_prompt_accept.py [--device cpu] [--prompts 6] [--max-tokens 128] OUT.json
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.prompts import chat_prompts_from  # noqa: E402
from app.settings import Settings  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.types import SamplingParams  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    engine = Engine.load("demo", device=args.device)
    app_system = Settings().system_prompt
    report = {"device": engine.device, "prompts": args.prompts, "max_tokens": args.max_tokens,
              "app_system_prompt": app_system, "accept_len_mean": {}, "per_prompt": {}}
    for prompt_set in ("chitchat", "instruct"):
        convs, _ = chat_prompts_from(args.prompts, prompt_set)
        for label, system in (("template default", None), ("app default", app_system)):
            accept = []
            for messages in convs:
                engine.reset()
                head = [{"role": "system", "content": system}] if system else []
                result = engine.generate(head + messages, SamplingParams(max_tokens=args.max_tokens))
                accept.append(round(result.stats.accept_len_mean, 3))
            key = f"{prompt_set} / {label}"
            report["per_prompt"][key] = accept
            report["accept_len_mean"][key] = round(sum(accept) / len(accept), 3)
            print(f"{key}: {report['accept_len_mean'][key]:.2f}  {accept}", flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
