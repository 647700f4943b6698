"""cmd_train: `localchat train-draft`: self-distils an EAGLE-3 head (or, with --kind mtp, chain-MTP
layers: speculative/train/mtp.py) from a target on chat data."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch

from engine.errors import UserError

from speculative.train.options import TrainOptions, command_line
from speculative.train.progress import log as _log
from speculative.train.prepare import choose_draft_vocab, grow_draft_vocab, prepare_data, reply_cache, vocab_coverage
from speculative.train.target import start_run


def cmd_train(args) -> int:
    out = Path(args.out).expanduser()
    created = not out.exists()
    check_out(out)  # before minutes of work, not at the save after them
    try:
        with _stop_signals_as_ctrl_c():
            if getattr(args, "kind", "eagle3") == "mtp":
                if getattr(args, "resume", False):
                    raise UserError("--resume: only EAGLE-3 runs (--kind eagle3) can be continued")
                if getattr(args, "draft_intermediate", None) is not None:
                    raise UserError("--draft-intermediate sets an EAGLE-3 head's MLP; MTP layers keep the target's")
                if getattr(args, "init", None):
                    raise UserError("--init starts an EAGLE-3 head from another; MTP layers start from the target's "
                                    "last block")
                if getattr(args, "int8_lm_head", False):
                    raise UserError("--int8-lm-head stores an EAGLE-3 head's lm_head; MTP layers use the target's")
                if getattr(args, "soft_temperature", None) is not None:
                    raise UserError("--soft-temperature sets an EAGLE-3 head's loss; MTP layers learn the target's "
                                    "top-64 probabilities as they are")
                from speculative.train.mtp import cmd_train_mtp

                return cmd_train_mtp(args)
            return _train_eagle3(args)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a run that saved nothing leaves no empty folder behind
        raise


def check_out(out: Path) -> None:
    """--out must be a folder this process can write (created if missing); a head already there
    is replaced when the run saves, which the log says up front."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the head")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".localchat-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"--out {out}: cannot write there ({e.strerror or type(e).__name__}); give another folder") \
            from None
    if (out / "model.safetensors").exists():
        _log(f"{out} already holds a head or layers: this run replaces them when it saves")


@contextlib.contextmanager
def _stop_signals_as_ctrl_c():
    """SIGTERM (a job scheduler's stop, `timeout`) stops training as Ctrl+C does: the head is
    saved. A second stop within REPEAT_S of the first is the same stop delivered twice (GNU
    `timeout` signals the process and then its process group) and is ignored; a later one
    aborts the save. SIGINT gets the same handling unless it was ignored when the process
    started (a background job)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def interrupt(signum, frame):
        now = time.monotonic()
        if first and now - first[0] < REPEAT_S:
            return
        first[:] = [now]
        raise KeyboardInterrupt

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, interrupt)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


REPEAT_S = 2.0


def _train_eagle3(args) -> int:
    run = start_run(args, lambda opts: _shape_of_init(opts, args))
    t_start, dev, opts, deadline = run.t_start, run.device, run.opts, run.deadline
    loaded, target_name, target_path = run.loaded, run.target_name, run.target_path
    phases: dict[str, float] = {}
    cfg = loaded.config
    if opts.draft_vocab > cfg.vocab_size:
        raise UserError(f"--draft-vocab {opts.draft_vocab} exceeds the target's vocabulary {cfg.vocab_size}")
    from speculative.train import checkpoint as train_checkpoint
    from speculative.train.reply_cache import target_identity
    from speculative.train.teacher import Teacher
    from speculative.train.export import default_aux_layers

    run_settings = train_checkpoint.settings(opts, target_identity(target_path), dev.type)
    resume = train_checkpoint.load(opts.out, run_settings, dev) if getattr(args, "resume", False) else None
    if resume:
        plan = f"{resume['schedule_s']:.0f} s" if resume["schedule_s"] else f"{opts.steps} steps"
        _log(f"resuming the stopped run at step {resume['step']} ({resume['schedule_used_s']:.0f} s trained; "
             f"its schedule: {plan})")

    aux_ids = default_aux_layers(cfg.num_layers)
    init = _read_init(opts, loaded, aux_ids, target_name) if opts.init else None
    teacher = Teacher(loaded, aux_ids, opts.max_len, opts.cache_bytes)
    phases["load_s"] = time.perf_counter() - t_start

    data = prepare_data(opts, loaded, teacher, t_start, deadline, phases, reply_cache(opts, target_path, loaded),
                        generate=resume is None)  # a resumed run trains on the replies it had
    text, gen, val_gen, val_text = data.text, data.gen, data.val_gen, data.val_text

    if resume:
        draft_ids, coverage = resume["draft_ids"].to(dev), resume["coverage"]
    elif init and opts.draft_vocab > init.draft_ids.numel():
        draft_ids, coverage = grow_draft_vocab(text, gen, cfg.vocab_size, init.draft_ids.to(dev), opts.draft_vocab)
        _log(f"growing the --init head's draft vocabulary from {init.draft_ids.numel()} to {opts.draft_vocab} tokens")
    elif init:
        draft_ids = init.draft_ids.to(dev)
        coverage = vocab_coverage(text, gen, cfg.vocab_size, draft_ids)
    else:
        draft_ids, coverage = choose_draft_vocab(text, gen, cfg.vocab_size, opts.draft_vocab, dev)
    _log(f"draft vocabulary: {opts.draft_vocab} tokens cover {coverage['text']:.1%} of the conversation tokens"
         + (f" and {coverage['replies']:.1%} of the target's replies" if "replies" in coverage else ""))
    draft, config = _init_draft(loaded, aux_ids, draft_ids, opts)
    if resume:
        draft.load_state_dict(resume["draft"])
    elif init:
        init.load_into(draft, draft_ids)
        _log(f"starting from the head in {opts.init}")

    from speculative.train.loop import final_checks, train, val_rows, validate

    train_deadline = None if deadline is None else deadline - opts.reserve_s
    _log(f"training {opts.steps} steps of {opts.batch_tokens} tokens ({opts.ttt_steps} unrolled draft steps)"
         + (f", stopping by {train_deadline - t_start:.0f} s into the run" if deadline else ""))
    val_seqs = val_gen + val_text  # replies first: the first validation rows hold them all
    res = train(draft, teacher, {"text": text, "gen": gen}, val_seqs, opts, draft_ids, train_deadline, _log,
                resume=resume)
    phases["train_s"] = res.train_s
    phases["target_features_s"] = teacher.forward_s
    ran = res.steps_done - (resume["step"] if resume else 0)
    _log(f"trained {ran} steps in {res.train_s:.1f} s: {res.entries / res.train_s:,.0f} tokens/s, "
         f"{res.train_s / max(ran, 1):.3f} s/step (target features: {teacher.forward_s:.1f} s); "
         f"loss {res.first_loss:.3f} -> {res.last_loss:.3f}")
    from engine import attention

    if attention.varlen_fallback():
        _log(f"(the target's packed forwards fell back to padded attention: {attention.varlen_fallback()})")

    t = time.perf_counter()
    from speculative.train.export import head_readme, save_head, write_provenance

    save_head(opts.out, config, draft, cfg.vocab_size, opts.int8_lm_head)  # first: a failing check below loses nothing
    earlier = list(resume.get("parts") or []) if resume else []  # the parts before this one
    if res.interrupted:
        this_part = {"wall_s": round(time.perf_counter() - t_start, 1), "steps": ran}
        train_checkpoint.save(opts.out, draft, res, draft_ids, coverage, run_settings, [*earlier, this_part])
        if not res.out_of_memory:  # below: what to do instead
            _log(f"to train on along the same schedule: {command_line(args, resume=True)}")
    else:
        train_checkpoint.discard(opts.out)
    final, failed = final_checks(
        res, lambda: validate(draft, teacher, val_rows(val_seqs, opts), opts, draft_ids) if val_seqs else {},
        (lambda: teacher.check_speculator(opts.out, data.eval_msgs[:opts.eval_prompts], opts.ttt_steps,
                                          opts.gen_tokens)) if opts.eval_prompts else None, _log)
    phases["final_eval_s"] = time.perf_counter() - t
    wall = time.perf_counter() - t_start
    # A resumed run's provenance covers the whole run: its parts' seconds add up, and the command
    # is the one that started it (each later part ran it again with --resume).
    parts = [*earlier, {"wall_s": round(wall, 1), "steps": ran}]
    prov = {
        "target": target_name, "command": command_line(args, resume=False),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "wall_s": round(sum(p["wall_s"] for p in parts), 1),
        **({"parts": parts} if len(parts) > 1 else {}),
        "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None, "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "draft_vocab_size": opts.draft_vocab, "aux_layer_ids_input": list(aux_ids),
        "draft_vocab_coverage": coverage,
        **({"init": {"head": opts.init, "sha256": init.sha256, "draft_vocab_size": init.draft_ids.numel()}}
           if init else {}),
        "data": data.provenance(),
        "train": {**{k: v for k, v in asdict(opts).items() if k not in ("out", "model", "data")},
                  "steps_done": res.steps_done, "entries": res.entries, "first_loss": round(res.first_loss, 4),
                  "last_loss": round(res.last_loss, 4), "tokens_per_s": round(res.entries / max(res.train_s, 1e-9))},
        "interrupted": res.interrupted, "out_of_memory": res.out_of_memory,
        "resumed_at_step": resume["step"] if resume else None,
        "validation_history": res.history,
        "final_eval": final,
    }
    write_provenance(opts.out, prov, head_readme(prov), _log)
    if res.out_of_memory:  # --resume keeps the settings that ran out; --init starts anew from this head
        _log(f"the GPU ran out of memory; the head trained so far is in {opts.out}: go on from it with a smaller "
             f"--batch-tokens (--init {opts.out} --batch-tokens {max(opts.batch_tokens // 2, 1)} --out NEW), or "
             "with --resume once the memory is free")
        return 1
    return 130 if res.interrupted else 1 if failed else 0


def _init_draft(loaded, aux_ids, draft_ids: torch.Tensor, opts: TrainOptions):
    """A fresh head (fp32 master weights) whose lm_head starts as the target's rows of the draft
    vocabulary and whose final norm starts as the target's."""
    from speculative.eagle3.config import DraftConfig
    from speculative.eagle3.model import Eagle3Draft
    from speculative.train.export import head_config

    cfg = loaded.config
    config = head_config(cfg, opts.draft_vocab, aux_ids, opts.draft_intermediate or None)
    dc = DraftConfig.from_hf(config, cfg)
    dev = draft_ids.device
    draft = Eagle3Draft(dc, cfg, opts.seq_len, None).to(dev)
    with torch.no_grad():
        draft.d2t.copy_(draft_ids - torch.arange(opts.draft_vocab, device=dev))
        draft.lm_head.weight.copy_(loaded.model.lm_head.weight.index_select(0, draft_ids).float())
        draft.norm.weight.copy_(loaded.model.model.norm.weight.float())
    return draft, config


def _shape_of_init(opts: TrainOptions, args) -> TrainOptions:
    """With --init, the head's draft vocabulary and MLP width are the run's; a different MLP width
    asked for on the command line is refused (the weights could not carry over), and so is a smaller
    vocabulary. A larger --draft-vocab grows the head's: its tokens keep their rows, and the most
    frequent others join (grow_draft_vocab; _Init.load_into)."""
    if not opts.init:
        return opts
    import dataclasses

    from engine.config_checks import read_json

    from speculative.mtp.config import MTPConfig

    folder = _init_folder(opts.init, opts.model)
    raw = read_json(folder / "config.json")
    if MTPConfig.describes_mtp(raw):
        raise UserError(f"--init {opts.init}: that folder holds MTP layers; --init takes an EAGLE-3 head")
    vocab, width = raw.get("draft_vocab_size") or raw.get("vocab_size"), raw.get("intermediate_size")
    if not isinstance(vocab, int) or not isinstance(width, int):
        raise UserError(f"--init {folder}: config.json names no draft_vocab_size and intermediate_size; "
                        "give the folder of an EAGLE-3 head")
    asked = getattr(args, "draft_vocab", None)
    if asked is not None and asked < vocab:
        raise UserError(f"--draft-vocab {asked}: the --init head has {vocab} tokens; a vocabulary can grow "
                        "from there, not shrink (leave --draft-vocab out to keep it)")
    asked_width = getattr(args, "draft_intermediate", None)
    if asked_width is not None and asked_width != width:
        raise UserError(f"--draft-intermediate {asked_width}: the --init head has {width}; "
                        "leave --draft-intermediate out to keep it")
    return dataclasses.replace(opts, draft_vocab=max(vocab, asked or 0), draft_intermediate=width, init=str(folder))


def _init_folder(spec: str, model: str) -> Path:
    """--init's folder: demo-eagle3 (the demo model's head, for --model demo), a local folder, or
    a Hub repo id (downloaded as --draft's are)."""
    from engine.hub.demo import demo_draft_path
    from engine.hub.resolve import resolve

    if spec in ("demo-eagle3", "demo-mtp"):
        if spec == "demo-mtp":
            raise UserError("--init demo-mtp: those are MTP layers; --init takes an EAGLE-3 head (demo-eagle3)")
        if model != "demo":
            raise UserError(f"--init {spec} was trained for the demo model, not {model}")
        found = demo_draft_path("eagle3")
        if found is None:
            raise UserError(f"--init {spec}: this install has no assets/demo-eagle3")
        return found
    src = resolve(spec, log=_log, what="draft")
    if src.is_gguf or not (Path(src.path) / "config.json").is_file():
        raise UserError(f"--init {spec}: give the folder of an EAGLE-3 head (config.json and model.safetensors)")
    return Path(src.path)


NEW_ROW_NORM = 0.1  # a grown vocabulary's new lm_head rows, against the head's own (_Init.load_into)


class _Init:
    """An --init head's weights and draft vocabulary, read and checked before any work."""

    def __init__(self, folder: Path, tensors: dict, draft_ids: torch.Tensor, sha256: str):
        self.folder, self.tensors, self.draft_ids, self.sha256 = folder, tensors, draft_ids, sha256

    def load_into(self, draft, draft_ids: torch.Tensor | None = None) -> None:
        """The head's weights into `draft`, whose draft vocabulary `draft_ids` holds the head's own
        tokens, and where it was grown, more: a kept token's lm_head row is the head's, a new
        token's the target's row (what `draft` starts with) scaled to NEW_ROW_NORM of the head's
        rows' mean norm: quiet enough that the new tokens do not take the head's choices before
        training gives them their weight (at the full norm they took most of them: CPU, the demo's
        head grown to 15,360, greedy chains' accepted length 1.22 against 2.74; at 0.1 2.72)."""
        from engine.weights.load import load_weights

        tensors = {k: v for k, v in self.tensors.items() if k not in ("d2t", "t2d")}
        if draft_ids is not None and draft_ids.numel() != self.draft_ids.numel():
            own = tensors["lm_head.weight"].float()
            at = torch.searchsorted(draft_ids.cpu(), self.draft_ids)  # the head's tokens among the grown ones
            rows = draft.lm_head.weight.detach().float().cpu()
            scale = NEW_ROW_NORM * own.norm(dim=1).mean() / rows[at].norm(dim=1).mean().clamp_min(1e-12)
            grown = rows * scale
            grown[at] = own
            tensors["lm_head.weight"] = grown
        load_weights(draft, tensors.items(), f"--init {self.folder}")


def _read_init(opts: TrainOptions, loaded, aux_ids, target_name: str) -> _Init:
    """The --init head must be one this run could have trained: the same layer shape, aux layers
    and target (its draft vocabulary and MLP width are taken as they are: _shape_of_init)."""
    import dataclasses
    import hashlib

    from engine.errors import ModelLoadError
    from engine.weights.checkpoint import iter_tensors, weight_files
    from engine.weights.int8_rows import widen_int8_rows
    from speculative.build import check_d2t
    from speculative.eagle3.config import DraftConfig
    from speculative.train.export import head_config

    folder = Path(opts.init)
    cfg = loaded.config
    try:
        dc = DraftConfig.from_folder(folder, cfg)
        dc.check_fits(cfg, folder.name, target_name)
        files = weight_files(folder)
        # copies: a .bin tensor is a view of the file's mapping, and these are kept until the data is ready
        tensors = {name: t.clone() for name, t in widen_int8_rows(iter_tensors(files), folder.name)}
    except ModelLoadError as e:
        raise UserError(f"--init: {e}") from None
    # the vocabulary may grow (_shape_of_init): the rest of the head must be what this run builds
    want = DraftConfig.from_hf(head_config(cfg, dc.draft_vocab_size, aux_ids, opts.draft_intermediate), cfg)
    differ = [f.name for f in dataclasses.fields(DraftConfig)
              if f.name != "format" and getattr(dc, f.name) != getattr(want, f.name)]
    if differ:
        raise UserError(f"--init {folder}: its {', '.join(differ)} differ from the head train-draft builds for "
                        f"{target_name}; give a head trained by train-draft for this target")
    d2t = tensors.get("d2t")
    if d2t is None:
        if dc.draft_vocab_size != cfg.vocab_size:
            raise UserError(f"--init {folder}: a reduced draft vocabulary ({dc.draft_vocab_size}) without d2t")
        d2t = torch.zeros(dc.draft_vocab_size, dtype=torch.long)
    if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.shape != (dc.draft_vocab_size,):
        raise UserError(f"--init {folder}: d2t must hold {dc.draft_vocab_size} integer offsets")
    draft_ids = d2t.long() + torch.arange(dc.draft_vocab_size)
    try:
        check_d2t(d2t.long(), cfg.vocab_size, f"--init {folder}")
    except ModelLoadError as e:
        raise UserError(str(e)) from None
    if draft_ids.unique().numel() != draft_ids.numel():
        raise UserError(f"--init {folder}: its d2t maps two draft tokens to the same target token")
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return _Init(folder, tensors, draft_ids, digest.hexdigest())
