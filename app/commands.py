"""`localchat run` and `localchat doctor`."""

from __future__ import annotations

import dataclasses
import json
import sys


def _progress(msg: str, frac) -> None:
    print(f"[localchat] {msg}", file=sys.stderr, flush=True)


def load_engine(args, quiet: bool = False, defer_capture: bool = False):
    from engine import Engine

    return Engine.load(args.model, draft=args.draft, device=args.device, max_seq_len=args.max_seq_len,
                       draft_steps=args.draft_steps, use_graphs=not args.no_graphs,
                       on_progress=None if quiet else _progress, defer_capture=defer_capture)


def sampling_from_args(args):
    from engine.types import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed,
                          max_tokens=args.max_tokens, stop=tuple(args.stop))


def default_system_prompt() -> str:
    """The chat app's default system prompt (settings.toml, when it exists and reads cleanly; the
    built-in default otherwise), so that `run` answers as a new chat in the app would. Some models
    answer badly under their template's own default: the demo model began "three tips for
    learning to cook" with "1. **10111111..."."""
    from app.paths import AppPaths
    from app.settings import Settings, load_settings

    try:
        path = AppPaths.resolve().settings_path
        if not path.is_file():
            return Settings().system_prompt
    except OSError:  # an unreadable config folder: the built-in default
        return Settings().system_prompt
    settings, notes = load_settings(path)  # a bad value: the default, and a line saying so
    for note in notes:
        print(f"localchat: {note}", file=sys.stderr)
    return settings.system_prompt


def cmd_run(args) -> int:
    from engine.errors import UserError

    if args.prompt == "-":  # `... | localchat run -`: the prompt is what comes in on stdin
        try:
            args.prompt = sys.stdin.read()
        except UnicodeDecodeError:
            raise UserError("the prompt on stdin is not UTF-8 text") from None
    if not args.prompt.strip():
        raise UserError("the prompt is empty")
    params = sampling_from_args(args)  # validate before the slow load
    # One answer: graphs it would not replay are not captured before its first token.
    engine = load_engine(args, quiet=args.json, defer_capture=True)
    system = default_system_prompt() if args.system is None else args.system
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": args.prompt})
    text, ids, last = [], [], None
    try:
        for ev in engine.stream(messages, params, speculative=not args.no_spec):
            text.append(ev.text)
            ids.extend(ev.token_ids)
            last = ev
            if not args.json and ev.text:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl+C or SIGTERM mid-answer: what came so far is the answer, then cli exits 130/143
        # The engine's live stats may already count tokens of a step that was never handed out.
        stats = dataclasses.replace(last.stats, generated_tokens=len(ids)) if last else None
        _report(args, engine, "".join(text), ids, stats, "interrupted")
        raise
    _report(args, engine, "".join(text), ids, last.stats, last.finish_reason)
    return 0


def _report(args, engine, text: str, ids: list[int], stats, finish_reason: str) -> None:
    """The end of an answer: the JSON object (--json), or a line break after the streamed text and a stats line
    on stderr."""
    if args.json:
        print(json.dumps({"text": text, "token_ids": ids, "finish_reason": finish_reason,
                          "model": engine.model_name, "draft": engine.draft_name,
                          "stats": stats.to_json() if stats else None}))
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    if stats is None:
        return
    extra = f", accepted length {stats.accept_len_mean:.2f}" if stats.speculative else ""
    if finish_reason == "interrupted":
        extra += ", interrupted"
    print(f"[{stats.generated_tokens} tokens, {stats.decode_tok_s:.1f} tok/s, first token {stats.ttft_s * 1000:.0f} ms"
          f"{extra}]", file=sys.stderr)


def cmd_doctor(args) -> int:
    import platform

    from engine.paths import cache_dir, config_dir, data_dir

    lines = [f"python       {platform.python_version()} ({sys.executable})"]
    for mod in ("torch", "transformers", "triton", "textual", "huggingface_hub", "gguf", "safetensors"):
        try:
            m = __import__(mod)
            lines.append(f"{mod:<12} {getattr(m, '__version__', '?')}")
        except Exception:
            lines.append(f"{mod:<12} not installed")
    import torch

    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            lines.append(f"gpu {i}        {p.name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free), "
                         f"CUDA {torch.version.cuda}")
    else:
        lines.append("gpu          none visible to PyTorch (CPU mode: fp32, no graphs)")
    from engine.demo import demo_gguf_path

    lines += [f"cache        {cache_dir()}", f"data         {data_dir()}", f"config       {config_dir()}",
              f"demo model   {demo_gguf_path()} ({'present' if demo_gguf_path().exists() else 'not fetched yet'})"]
    import os

    lines.append(f"hf cache     {os.environ.get('HF_HUB_CACHE') or os.environ.get('HF_HOME') or '~/.cache/huggingface'}")
    print("\n".join(lines))
    return 0
