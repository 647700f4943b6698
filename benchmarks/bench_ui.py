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


def bare(args, prompts) -> list[dict]:
    """What `localchat run --json` reports, one process per prompt, with the app's system prompt
    (the same messages, so greedy decoding writes the same answers)."""
    import subprocess

    from app.settings import Settings

    out = []
    for p in prompts:
        cmd = [sys.executable, "-m", "app.cli", "run", "--json", "--model", args.model, "--max-tokens",
               str(args.max_tokens)] + (["--system", Settings().system_prompt] if Settings().system_prompt else [])
        cmd += ["--draft", args.draft] if args.draft else []
        cmd += ["--device", args.device] if args.device else []
        cmd += ["--no-spec"] if args.no_spec else []
        res = subprocess.run(cmd + [p], capture_output=True, text=True, check=True)
        report = json.loads(res.stdout)
        out.append({"tok_s": report["stats"]["decode_tok_s"], "text": report["text"]})
    return out


async def in_app(args, home) -> list[dict]:
    """The chat app loading the model on its own engine thread, as `localchat` does."""
    from textual import events

    from app.settings import Settings, save_settings
    from app.tui import LocalChatApp
    from app.widgets.prompt_input import PromptInput

    save_settings(Path(home) / "config" / "settings.toml",
                  Settings(max_tokens=args.max_tokens, temperature=0.0, speculative=not args.no_spec))
    app = LocalChatApp(model=args.model, draft=args.draft, device=args.device, home=home)
    rates = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.runner.engine is None and app.runner.load_error is None:
            await asyncio.sleep(0.1)
        first = True
        for p in [PROMPTS[0]] + PROMPTS:  # the first answer warms up
            await pilot.press("ctrl+n")  # each prompt in a new chat, as `bare` runs them
            # ...and from an empty cache, as each `bare` process starts. Otherwise the app reuses
            # the system prompt's K/V from the last chat, prefills fewer rows, and on a GPU those
            # other matmul shapes can change the last bits and so the answer (seen on the H200).
            app.runner.engine.reset()
            await asyncio.sleep(1.0)  # a person reads and types: the UI settles between answers
            app.screen.query_one(PromptInput).text = p
            # Enter as the terminal driver sends it. pilot.press would then wait for the process to go idle,
            # polling 50 times a second for a second or two while the engine decodes: test-harness work.
            app.post_message(events.Key("enter", "\r"))
            deadline = time.monotonic() + 120
            # Plain sleeps, not pilot.pause: a pause forces a full repaint, which is test-harness
            # work a real terminal session does not do.
            msgs = []
            while time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                chat = app.screen.chat
                msgs = app.store.messages(chat.id) if chat is not None else []
                if app.screen.answer is None and msgs and msgs[-1].role == "assistant" and msgs[-2].content == p:
                    break
            else:
                raise RuntimeError(f"no answer stored for {p!r}: {[m.role for m in msgs]}")
            if not first:
                rates.append({"tok_s": msgs[-1].stats["decode_tok_s"], "text": msgs[-1].content})
            first = False
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
    with tempfile.TemporaryDirectory() as home:
        ui = asyncio.run(in_app(args, home))
    plain = bare(args, PROMPTS)
    app_rates, bare_rates = [r["tok_s"] for r in ui], [r["tok_s"] for r in plain]
    report = {"model": args.model, "draft": args.draft, "device": args.device, "speculative": not args.no_spec,
              "max_tokens": args.max_tokens, "bare_tok_s": bare_rates, "app_tok_s": app_rates,
              # Greedy decoding of the same messages: the answers must match, or the rates compare
              # different texts (and, with speculation, different accepted lengths).
              "same_text": [a["text"] == b["text"] for a, b in zip(ui, plain)],
              "ratio_per_prompt": [a / b for a, b in zip(app_rates, bare_rates)],
              "ratio": sum(app_rates) / sum(bare_rates)}
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
