"""Whether speculation is the faster default for a model and its draft on this GPU or CPU:
measured once, then remembered.

A draft pays only where it beats plain decoding with no draft loaded, which a user gets by
unloading it. Whether it does depends on the model, the draft, the GPU and the kernels (the demo
model's EAGLE-3 head gains about 1.7x on an H200, its two MTP layers lose: 0.6x;
docs/performance.md), so the first load of a pair on a device times both on a few short chat
requests under the app's default system prompt, greedy, alternating, each after an uncounted
warm-up: speculation on the engine as loaded, plain decoding on its twin with no draft
(Engine.without_draft; where that twin's KV cache does not fit, plain decoding with the draft
loaded). The verdict is cached in the cache folder under the model, the draft, the GPU's name
(on a CPU: its model name and torch's thread count), torch's version, the draft settings and this
file's contents; later loads read it at once.

Where an EAGLE-3 head's greedy chains may verify the head's runners-up beside the chain (a GPU's
default), speculation is timed both with them and with the chain alone, and the faster is kept
(Eagle3Speculator.use_runners_up) and remembered with the verdict: they win back tokens where a
draft is wrong, for rows every verify step pays, so which pays depends on the head and the model
(on an H200 the demo's head gains from them; the 8B shape with a forced head, whose runners-up
are never taken, lost 9% to them; docs/performance.md).

A GPU also times both at SAMPLED_TEMPERATURE, each answer from its own seed: sampled speculation
accepts fewer tokens a step than greedy, and plain decoding draws its tokens on the device as fast
as it picks them greedily, so a draft that pays greedily may not pay there (verdict(sampled=True);
the demo's head on an H200: docs/performance.md). A CPU takes the greedy verdict for both.

A CPU measures less (CPU_PROMPTS, CPU_TOKENS: some 20 s for the demo model on 2 cores) and asks
for a margin (CPU_PAYS_FROM): there a verify step costs the arithmetic of every row it checks, so
speculation is close to plain decoding either way (the demo's first head: 0.96x on 2 cores, the
head trained on the request sets: 1.18x-1.22x; docs/performance.md), a short measurement is
noisier, and a verdict too kind would make every later answer slower. LOCALCHAT_CPU_SPEC=off
skips the measurement: speculation off by default on a CPU (Engine.speculation_pays).
"""

from __future__ import annotations

import functools
import hashlib
import time
from pathlib import Path
from typing import Callable

PROMPTS = ("Give me three ideas for a rainy afternoon at home.",
           "How do I reverse a string in JavaScript?",
           "Summarize what a hash table is in a short paragraph.",
           "Write a haiku about autumn leaves.")
SYSTEM = "You are a helpful assistant."
TOKENS = 192  # long enough that the first steps of an answer do not decide the verdict (docs/performance.md)
# Below this ratio of tokens per second (speculation over plain decoding without the draft),
# speculation is off by default; ties go to the draft the user chose to load.
PAYS_FROM = 1.0
SAMPLED_TEMPERATURE = 0.7  # the sampled verdict's answers (no top-k, top-p or min-p)
CPU_PROMPTS = PROMPTS[:3]
CPU_TOKENS = 48
CPU_PAYS_FROM = 1.1


def draft_settings(engine) -> str:
    """The loaded draft's settings a verdict holds for: its steps and tree shape."""
    tree = getattr(engine.speculator, "tree", None)
    return f"k={getattr(engine.speculator, 'k', '?')} tree={tree if tree is not None else 'off'}"


def cache_key(engine, settings: str, code: tuple[Path, ...] = (Path(__file__),)) -> str:
    """What a measurement on `engine` is remembered under: the model, the draft, the GPU's name (or
    the device), torch's version, `settings` and the files of the code measured (`code`)."""
    import torch

    device = engine.device
    if device.startswith("cuda") and torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    elif device == "cpu":
        device = f"cpu {cpu_name()} x{torch.get_num_threads()}"
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in code)).hexdigest()[:12]
    return "|".join([engine.model_name, str(engine.draft_name), device, torch.__version__, settings, digest])


def cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo, else the platform module's)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def answer_tok_s(engine, prompt: str, speculative: bool, tokens: int, temperature: float = 0.0) -> tuple[int, float]:
    """(tokens after the first, seconds they took) of one answer to `prompt` under SYSTEM, cut at
    `tokens`: greedy, or at `temperature` from a seed of the prompt's (the same draws for either
    setting)."""
    from engine.types import SamplingParams

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=len(prompt) if temperature else None)
    first, n = None, 0
    for ev in engine.stream(messages, params, speculative=speculative):
        if first is None and ev.token_ids:
            first = time.perf_counter()
        n += len(ev.token_ids)
    if first is None or n < 2:
        return 0, 0.0
    return n - 1, time.perf_counter() - first


def chooses_runners_up(engine) -> bool:
    """Whether `engine`'s greedy chains may verify with or without runners-up (an EAGLE-3 head on
    a GPU, chains rather than a tree, LOCALCHAT_SPEC_ALTS unset): the measurement times both."""
    spec = getattr(engine, "speculator", None)
    return bool(getattr(spec, "runners_up_choice", False)) and getattr(spec, "tree", None) is None


def alternate(settings: dict, prompts, tokens: int, timer=answer_tok_s, warmup: int = 8,
              warm_each: bool = False) -> dict[str, float]:
    """Tokens per second of each setting (name: (engine, speculative, runners-up or None)), prompt by
    prompt, the order turning each time, each after an uncounted warm-up answer of `warmup` tokens
    to the first prompt, or (warm_each, a GPU) to every prompt, as long as the answers measured:
    kernels are compiled for the context lengths they meet, and one compile inside a timed answer
    (a fresh machine's) outweighs the rest of a setting's answers (the demo's head with its
    runners-up measured 483 against 2513 tok/s for the chain alone that way, and 1.78x against
    1.74x of no draft over 12 requests on the same machine; docs/performance.md). The timed
    answers repeat the warm-ups' (greedy, or drawn from the same seeds), so they meet no new
    length."""
    def run(name, prompt, n):
        eng, spec, runners_up = settings[name]
        if runners_up is not None:
            eng.speculator.use_runners_up(runners_up)
        return timer(eng, prompt, spec, n)

    for name in settings:  # warm-up: graphs captured, kernels compiled
        for prompt in prompts if warm_each else prompts[:1]:
            run(name, prompt, warmup)
    done = {name: [0, 0.0] for name in settings}
    names = list(settings)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            n, s = run(name, prompt, tokens)
            done[name][0] += n
            done[name][1] += s
    return {name: (n / s if s else 0.0) for name, (n, s) in done.items()}


def choose_runners_up(engine, speeds: dict[str, float]) -> bool | None:
    """Leaves `engine` verifying with runners-up or not, whichever `speeds` ("spec": with them,
    "spec_chain": the chain alone) found faster; None where there was no choice."""
    if "spec_chain" not in speeds:
        return None
    on = speeds["spec"] >= speeds["spec_chain"]
    engine.speculator.use_runners_up(on)
    return on


def measure(engine, prompts=PROMPTS, tokens: int = TOKENS, timer=answer_tok_s, sampled: bool | None = None) -> dict:
    """Tokens per second of greedy speculation on `engine` and of plain decoding without its draft
    (the twin), alternating prompt by prompt, the order turning each time; where the head may
    verify the chain alone (chooses_runners_up), speculation both ways, the faster kept. {"spec",
    "plain", "baseline": "no draft" | "draft loaded", "ratio", "built_twin": whether the twin was
    built for this (and may go again), and with the choice "runners_up" (kept or not),
    "spec_runners_up", "spec_chain"}. sampled (None: on a GPU): the same at SAMPLED_TEMPERATURE
    too (timer(..., temperature=...)), as "sampled_spec", "sampled_plain", "sampled_ratio"."""
    had_twin = engine.has_twin
    twin = engine.without_draft(if_fits=True)
    built_here = twin is not None and not had_twin
    baseline = "no draft" if twin is not None else "draft loaded"
    plain = (twin, False, None) if twin is not None else (engine, False, None)
    choice = chooses_runners_up(engine)
    settings = {"spec": (engine, True, True if choice else None), "plain": plain}
    if choice:
        settings["spec_chain"] = (engine, True, False)
    gpu = str(engine.device).startswith("cuda")
    speeds = alternate(settings, prompts, tokens, timer, warmup=tokens if gpu else 8, warm_each=gpu)
    result = {"plain": speeds["plain"], "baseline": baseline, "built_twin": built_here}
    kept = choose_runners_up(engine, speeds)
    if kept is not None:
        result.update(runners_up=kept, spec_runners_up=speeds["spec"], spec_chain=speeds["spec_chain"])
    result["spec"] = max(speeds["spec"], speeds.get("spec_chain", 0.0))
    result["ratio"] = result["spec"] / speeds["plain"] if speeds["plain"] else 0.0
    if sampled if sampled is not None else gpu:
        drawn = alternate({"spec": (engine, True, None), "plain": plain}, prompts, tokens,
                          functools.partial(timer, temperature=SAMPLED_TEMPERATURE), warmup=tokens, warm_each=gpu)
        result.update(sampled_spec=drawn["spec"], sampled_plain=drawn["plain"],
                      sampled_ratio=drawn["spec"] / drawn["plain"] if drawn["plain"] else 0.0)
    return result


def reason_for(result: dict, device: str = "GPU", sampled: bool = False) -> str:
    """The few words the status bar and `localchat run` give for speculation off."""
    ratio = result["sampled_ratio" if sampled else "ratio"]
    slower = "slower" if ratio < 1.0 else "not clearly faster"
    where = f" at temperature {SAMPLED_TEMPERATURE:g}" if sampled else ""
    return f"{slower}{where} on this {device} ({ratio:.2f}x of {result['baseline']})"


def verdict(engine, settings: str, cache_file: Path | None = None, log: Callable[[str], None] | None = None,
            measurer: Callable | None = None, sampled: bool = False) -> tuple[bool, str]:
    """(whether speculation pays on `engine`'s GPU, and if not, why), from the cache or a
    measurement now (written to the cache; a twin built only for it is let go again). sampled:
    for answers drawn at a temperature (the measurement's sampled figures where it has them, else
    the greedy ones)."""
    from engine.errors import UserError
    from engine.paths import cache_dir, read_json_cache, write_json_cache

    measurer = measurer or measure
    cpu = engine.device == "cpu"
    device = "CPU" if cpu else "GPU"
    cache_file = cache_file or cache_dir() / "speculation-calibration.json"
    key = cache_key(engine, settings)
    cached = read_json_cache(cache_file)
    entry = cached.get(key)
    if not (isinstance(entry, dict) and isinstance(entry.get("ratio"), (int, float))
            and isinstance(entry.get("baseline"), str)):
        if log:
            log(f"measuring whether speculation pays on this {device} (once for this model and draft"
                + (", some seconds)" if cpu else ")"))
        try:
            entry = measurer(engine, CPU_PROMPTS, CPU_TOKENS) if cpu else measurer(engine)
        except (UserError, RuntimeError):  # out of memory, a context too short: unmeasured, a GPU keeps
            # speculation on (where drafts mostly pay), a CPU off (where they are close at best)
            return (False, "not measured on this CPU") if cpu else (True, "")
        # a twin built only for this goes again, unless plain decoding (on it) is to be the default
        # for greedy or sampled answers
        pays_from = CPU_PAYS_FROM if cpu else PAYS_FROM
        if entry.pop("built_twin", False) and entry["ratio"] >= pays_from \
                and entry.get("sampled_ratio", pays_from) >= pays_from:
            engine.drop_twin()
        cached[key] = entry
        write_json_cache(cache_file, cached)
    if chooses_runners_up(engine) and isinstance(entry.get("runners_up"), bool):
        engine.speculator.use_runners_up(entry["runners_up"])
    sampled = sampled and isinstance(entry.get("sampled_ratio"), (int, float))
    if entry["sampled_ratio" if sampled else "ratio"] >= (CPU_PAYS_FROM if cpu else PAYS_FROM):
        return True, ""
    return False, reason_for(entry, device, sampled)
