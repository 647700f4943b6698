"""build_engine: resolve, load and wire a target (and its draft) into an Engine."""

from __future__ import annotations

import dataclasses
import time

import torch

from engine.hub.demo import demo_draft_path
from engine.errors import UserError
from engine.loader import load_folder, load_gguf
from engine.options import KernelOptions
from engine.weights.prepared import is_current, prepared_dir
from engine.hub.resolve import resolve
from engine.runner import ModelRunner
from engine.threads import apply_threads


def build_engine(cls, model: str, draft: str | None, device: str | None, max_seq_len: int | None,
                 draft_steps: int, use_graphs: bool, on_progress, defer_capture: bool = False,
                 threads: int | None = None, options: KernelOptions | None = None):
    """options: the kernel switches (None: KernelOptions.from_env()); batch_invariant is set here,
    from whether a draft comes with the target."""
    from engine.device import pick_device

    def say(msg: str, frac: float | None = None) -> None:
        if on_progress:
            on_progress(msg, frac)

    if max_seq_len is not None and max_seq_len < 16:
        raise UserError(f"--max-seq-len must be at least 16, got {max_seq_len}")
    if not 1 <= draft_steps <= 15:  # a verify step of k + 1 <= 16 rows keeps batch invariance (routing.py)
        raise UserError(f"--draft-steps must be between 1 and 15, got {draft_steps}")
    dev = pick_device(device)
    apply_threads(dev.type, threads)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    src = resolve(model, log=say)
    draft_spec = draft
    if draft_spec is None and src.is_demo:
        found = demo_draft_path()
        draft_spec = str(found) if found else None
    if draft_spec == "none":
        draft_spec = None
    # The draft is found before the target loads: a wrong --draft fails in a moment, not after
    # loading a large model.
    draft_path = draft_name = None
    if draft_spec in ("demo-eagle3", "demo-mtp"):  # the drafts trained for the demo model, in assets/
        if not src.is_demo:
            raise UserError(f"--draft {draft_spec} was trained for the demo model, not {src.name}")
        draft_path, draft_name = demo_draft_path(draft_spec[len("demo-"):]), draft_spec
    if draft_spec == "mtp:builtin" and src.is_gguf:
        raise UserError(f"--draft mtp:builtin: {src.name} ships no MTP layers (MiMoForCausalLM checkpoints do); "
                        "give a draft folder instead")
    if draft_spec and draft_path is None and draft_spec != "mtp:builtin":
        draft_src = resolve(draft_spec, log=say, what="draft")
        draft_path, draft_name = draft_src.path, draft_src.name

    # A draft's verify rows must carry the bits of the plain decode steps they stand for, and the
    # target's kernels are chosen once, here: with a draft, the batch-invariant ones from the start.
    options = dataclasses.replace(options or KernelOptions.from_env(), batch_invariant=bool(draft_spec))
    say(f"loading {src.name}", 0.1)
    if src.is_gguf:
        prepared = prepared_dir(src.path, src.is_demo)
        if not is_current(prepared, src.path, dtype):
            say(f"converting {src.name} once (later starts read the prepared copy)", 0.1)
        loaded = load_gguf(src.path, dev, dtype, max_seq_len, prepared_dir=prepared, log=say, options=options)
    else:
        loaded = load_folder(src.path, dev, dtype, max_seq_len, options)
    runner = ModelRunner(loaded.model, loaded.model.cos_sin.shape[0])
    t_loaded = time.perf_counter()

    speculator = None
    if draft_spec:
        say("loading the draft", 0.6)
        from speculative.build import build_speculator  # the one place engine reaches into speculative

        if draft_spec == "mtp:builtin":  # MTP layers shipped inside the target checkpoint
            if loaded.config.architecture != "MiMoForCausalLM":
                raise UserError(f"--draft mtp:builtin: {src.name} ships no MTP layers (MiMoForCausalLM "
                                "checkpoints do); give a draft folder instead")
            draft_path, draft_name = src.path, f"{src.name} (built-in MTP)"
        speculator = build_speculator(draft_path, runner, loaded.config, draft_steps, src.name)
    t_draft = time.perf_counter()
    t_target_graphs = t_draft
    if use_graphs and dev.type == "cuda":
        say("capturing CUDA graphs", 0.8)
        target_counts = [1] + ([speculator.k + 1] if speculator else [])
        if defer_capture and speculator is not None:
            runner.defer(target_counts)
        else:
            runner.capture(target_counts)
        t_target_graphs = time.perf_counter()
        if speculator is not None:
            say("capturing the draft's CUDA graphs", 0.9)
            speculator.capture(defer=defer_capture)
    engine = cls(runner, loaded.tokenizer, src.name, speculator, draft_name)
    engine.weights = loaded.weights  # the checkpoint's weight format, for run --json
    engine.runs_as = loaded.runs_as  # what its projections run in: that format decoded in place, or bf16
    t_end = time.perf_counter()
    engine.load_s = t_end - t0
    engine.load_phases = {k: round(v, 3) for k, v in (
        ("load_s", t_loaded - t0), ("draft_s", t_draft - t_loaded),
        ("target_graphs_s", t_target_graphs - t_draft), ("capture_s", t_end - t_draft))}
    say("ready", 1.0)
    return engine
