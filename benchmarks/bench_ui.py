"""The chat app's cost to the engine: decode tokens/s with the app attached (headless, Pilot)
against the bare engine (what `localchat run` does), same engine, same prompts, one process.

    python benchmarks/bench_ui.py --model demo [--draft D] [--device cuda] --out ui.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = ["Tell me a short story about a robot learning to paint.",
           "Explain how rainbows form, in a few paragraphs.",
           "Write a poem about autumn leaves."]


def bare(engine, params, speculative) -> list[float]:
    out = []
    for p in PROMPTS:
        engine.reset()
        last = None
        for ev in engine.stream([{"role": "user", "content": p}], params, speculative=speculative):
            last = ev
        out.append(last.stats.decode_tok_s)
    return out


async def in_app(engine, max_tokens, speculative, home) -> list[float]:
    from app.settings import Settings, save_settings
    from app.tui import LocalChatApp
    from app.widgets.prompt_input import PromptInput

    save_settings(Path(home) / "config" / "settings.toml",
                  Settings(max_tokens=max_tokens, temperature=0.0, speculative=speculative))
    app = LocalChatApp(lambda on_progress: engine, model=engine.model_name, home=home)
    rates = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.runner.engine is None:
            await pilot.pause(0.05)
        for p in PROMPTS:
            engine.reset()
            app.screen.query_one(PromptInput).text = p
            await pilot.press("enter")
            await pilot.pause(0.1)
            deadline = time.monotonic() + 300
            while app.screen.answer is not None and time.monotonic() < deadline:
                await pilot.pause(0.02)
            msgs = app.store.messages(app.screen.chat.id)
            while msgs[-1].role != "assistant" and time.monotonic() < deadline:
                await pilot.pause(0.02)  # the answer is stored just after it is drawn
                msgs = app.store.messages(app.screen.chat.id)
            rates.append(msgs[-1].stats["decode_tok_s"])
    return rates


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--no-spec", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from engine import Engine
    from engine.types import SamplingParams

    engine = Engine.load(args.model, draft=args.draft, device=args.device)
    spec = engine.has_draft and not args.no_spec
    params = SamplingParams(max_tokens=args.max_tokens)
    bare(engine, params, spec)  # warm-up
    with tempfile.TemporaryDirectory() as home:
        ui = asyncio.run(in_app(engine, args.max_tokens, spec, home))
    plain = bare(engine, params, spec)
    report = {"model": engine.model_name, "draft": engine.draft_name, "device": engine.device, "speculative": spec,
              "bare_tok_s": plain, "app_tok_s": ui, "ratio": sum(ui) / sum(plain)}
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
