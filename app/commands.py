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
                       on_progress=None if quiet else _progress, defer_capture=defer_capture,
                       threads=getattr(args, "threads", None), tree=getattr(args, "tree", None))


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
        args.prompt = _stdin_text()
    for what, text in (("the prompt", args.prompt), ("--system", args.system), *(("--stop", s) for s in args.stop)):
        _require_utf8(text, what)
    if not args.prompt.strip():
        raise UserError("the prompt is empty")
    params = sampling_from_args(args)  # validate before the slow load
    # One answer: graphs it would not replay are not captured before its first token.
    engine = load_engine(args, quiet=args.json, defer_capture=True)
    system = default_system_prompt() if args.system is None else args.system
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": args.prompt})
    speculative = not args.no_spec
    decoder = engine  # the engine that answers (the loaded one, or its twin without the draft)
    if engine.has_draft and speculative and not (args.spec or args.draft):
        log = None if args.json else (lambda text: print(f"[localchat] {text}", file=sys.stderr))
        pays, reason = engine.speculation_pays(log, sampled=not params.is_greedy)
        if not pays:
            speculative = False  # the default draft where speculation is slower: plain decoding, said once
            if not args.json:
                print(f"[localchat] speculation off: {reason} (--spec turns it on)", file=sys.stderr)
            # on the engine without the draft where it fits: the faster plain kernels
            decoder = engine.without_draft(if_fits=True) or engine
    text, ids, last = [], [], None
    try:
        for ev in decoder.stream(messages, params, speculative=speculative):
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


def _stdin_text() -> str:
    """stdin decoded as UTF-8, strictly: under a C locale Python would smuggle bad bytes through
    as surrogates, which the tokenizer then rejects after the model has loaded."""
    from engine.errors import UserError

    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"the prompt on stdin is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        "convert it first, e.g. with iconv -t UTF-8") from None


def _require_utf8(text: str | None, what: str) -> None:
    """Command-line arguments that are not UTF-8 arrive as surrogate escapes (PEP 383)."""
    from engine.errors import UserError

    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = ord(text[e.start]) - 0xDC00 if 0xDC80 <= ord(text[e.start]) <= 0xDCFF else None
        shown = f"byte 0x{byte:02x}" if byte is not None else f"character U+{ord(text[e.start]):04X}"
        raise UserError(f"{what} is not valid UTF-8 text ({shown} at position {e.start}); "
                        "pass UTF-8 text") from None


def package_version(dist: str) -> str | None:
    """The installed version from the package's metadata: not every module has __version__
    (gguf has none), and reading metadata imports nothing."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _report(args, engine, text: str, ids: list[int], stats, finish_reason: str) -> None:
    """The end of an answer: the JSON object (--json), or a line break after the streamed text and a stats line
    on stderr."""
    if args.json:
        print(json.dumps({"text": text, "token_ids": ids, "finish_reason": finish_reason,
                          "model": engine.model_name, "weights": engine.weights,
                          "runs_as": getattr(engine, "runs_as", ""), "draft": engine.draft_name,
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
    for dist in ("torch", "transformers", "triton", "textual", "huggingface_hub", "gguf", "safetensors"):
        lines.append(f"{dist:<12} {package_version(dist) or 'not installed'}")
    import torch

    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            lines.append(f"gpu {i}        {p.name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free), "
                         f"CUDA {torch.version.cuda}")
    else:
        lines.append("gpu          none visible to PyTorch (CPU mode: fp32, no graphs)")
    from engine.threads import CpuLoad, choose_threads

    load, threads = CpuLoad.now(), choose_threads(None)
    why = "from OMP_NUM_THREADS" if threads is None else "free now; --threads N sets it"
    lines.append(f"cpu threads  {threads or torch.get_num_threads()} for the CPU path ({why}; {load.usable} usable "
                 f"of {load.cores} cores, load {load.load_1min:.1f})")
    lines.append(f"quantized    {_quantized_rule(torch.cuda.is_available())}")
    from engine.hub.demo import demo_gguf_path

    lines += [f"cache        {cache_dir()}", f"data         {data_dir()}", f"config       {config_dir()}",
              f"demo model   {demo_gguf_path()} ({_demo_state(demo_gguf_path())})"]
    from engine.hub.cache import cache_dir as hub_cache_dir

    lines.append(f"hf cache     {hub_cache_dir()}")
    print("\n".join(lines))
    return 0


def _quantized_rule(gpu: bool) -> str:
    """What a quantized checkpoint's layers run in here (engine/loader.py: packs_weights)."""
    from engine.options import KernelOptions

    if not gpu:
        return "GGUF, AWQ, GPTQ and FP8 weights run dequantized to fp32 (CPU)"
    packed = KernelOptions.from_env().packed_weights
    x = ("; all but FP8 meet the activations rounded to int8 with no draft loaded "
         "(LOCALCHAT_PACKED_ROW_X=bf16 keeps them bf16)" if KernelOptions.from_env().packed_row_x == "int8" else "")
    if packed is None:
        return ("GGUF, AWQ, GPTQ and FP8 weights run as bf16 where that fits in the GPU's free memory, "
                "else decoded in place, as are all with widths of 2,048 and more (FP8 where the GPU has it) "
                "and no draft loaded "
                "(LOCALCHAT_PACKED_WEIGHTS=1 always, =0 never)" + x)
    return ("GGUF, AWQ, GPTQ and FP8 weights run decoded in place (LOCALCHAT_PACKED_WEIGHTS=1)" + x if packed
            else "GGUF, AWQ, GPTQ and FP8 weights run dequantized to bf16 (LOCALCHAT_PACKED_WEIGHTS=0)")


def _demo_state(path) -> str:
    """'present, Q4_1 weights': the weight format read from the file's header (a moment, no tensor data)."""
    if not path.exists():
        return "not fetched yet"
    from engine.weights.gguf_header import header_weights_label

    try:
        return f"present, {header_weights_label(path)} weights"
    except (OSError, ValueError) as e:
        return f"present, unreadable: {e}"
