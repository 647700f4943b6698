"""cmd_train: `localchat train-draft`: self-distils an EAGLE-3 head (or, with --kind mtp, chain-MTP
layers: speculative/train/mtp.py) from a target on chat data."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from engine.errors import UserError

from speculative.train.progress import log as _log
from speculative.train.prepare import choose_draft_vocab, prepare_data, reply_cache


@dataclass(frozen=True)
class TrainOptions:
    model: str
    out: Path
    data: str | None
    draft_vocab: int
    steps: int
    seq_len: int  # tokens per packed row; longer conversations are cut
    batch_tokens: int  # tokens per step (rows = batch_tokens // seq_len)
    ttt_steps: int  # draft steps unrolled in training-time test; also k of the final check
    lr: float
    gen_prompts: int  # training prompts the target answers itself (greedy); 0: none
    gen_tokens: int  # longest reply generated
    time_budget: float | None  # seconds for the whole command; training stops in time, annealed
    eval_every: int
    eval_prompts: int  # held-out prompts decoded with the saved head at the end
    seed: int = 0
    decay: float = 0.8  # loss weight of draft step t is decay ** t (EAGLE-3)
    # Share of a step's sequences drawn from the target's own replies: they are what gets drafted;
    # the conversations' human turns keep the head from memorising a few thousand replies.
    gen_frac: float = 0.85
    # Weight of an extra hard cross-entropy on the target's greedy token, which is what greedy
    # verification accepts (0: the target's distribution only). 0.85 and 0.5 against 0.7 and 0
    # on an H200, demo target, same budget: held-out accepted length 2.52 vs 2.40 at step 750,
    # 2.74 vs 2.66 at step 1250, and 2.50 vs 2.25 measured by `bench`. A full-length run ended
    # level with 0.7 and 0 at equal steps (held-out 3.20 at step 3,994; docs/performance.md).
    greedy_weight: float = 0.5
    gen_share: float = 0.45  # share of the time budget after which no new reply is started
    reserve_s: float = 25.0  # budget kept for validation, saving and the speculator check
    val_conversations: int = 48
    val_rows: int = 4
    cache_bytes: int = 2 << 30  # target features kept on the device (feature_cache_bytes sets it)
    mtp_layers: int = 3  # --kind mtp: chained MTP layers S, also k of the final check
    draft_intermediate: int = 0  # the head's MLP width (0: the target's intermediate size)
    # Share of the generation prompts taken from speculative/train/instruct_prompts.py (requests for
    # lists, how-tos, explanations, code and short writing) instead of the conversations; at
    # most the ~4,200 training prompts there. 0.1 (default): the shipped EAGLE-3 head's recipe.
    # Against 0, on an H200, demo target, same budget, one bench run: accepted length 3.26 vs
    # 3.22 on held-out chitchat and 2.57 vs 1.77 on held-out instruction requests
    # (docs/performance.md).
    instruct_frac: float = 0.1

    def __post_init__(self) -> None:
        for name in ("draft_vocab", "steps", "seq_len", "batch_tokens", "ttt_steps", "mtp_layers"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for flag, value in (("gen", self.gen_prompts), ("eval-every", self.eval_every),
                            ("eval-prompts", self.eval_prompts)):
            if value < 0:
                raise UserError(f"--{flag} must be at least 0 (0: none), got {value}")
        if self.gen_tokens < 1:
            raise UserError(f"--gen-tokens must be at least 1, got {self.gen_tokens}")
        if self.seq_len < self.gen_tokens + 16 and self.gen_prompts:
            raise UserError(f"--seq-len {self.seq_len} leaves no room for prompts before --gen-tokens "
                            f"{self.gen_tokens} of reply")
        if not 0 <= self.gen_frac <= 1:
            raise UserError(f"--gen-frac must be in [0, 1], got {self.gen_frac}")
        if not 0 <= self.instruct_frac <= 1:
            raise UserError(f"--instruct-frac must be in [0, 1], got {self.instruct_frac}")
        if not 0 <= self.greedy_weight <= 100:
            raise UserError(f"--greedy-weight must be in [0, 100], got {self.greedy_weight}")
        if not 0 < self.lr < 1:
            raise UserError(f"--lr must be in (0, 1), got {self.lr}")
        if self.time_budget is not None and self.time_budget < 2 * self.reserve_s:
            raise UserError(f"--time-budget must be at least {2 * self.reserve_s:.0f} s, got {self.time_budget}")

    @property
    def max_len(self) -> int:
        return self.seq_len + self.gen_tokens + 32

    @classmethod
    def from_args(cls, args, device: torch.device) -> "TrainOptions":
        gpu = device.type == "cuda"

        def opt(name, gpu_default, cpu_default):
            v = getattr(args, name, None)
            return v if v is not None else (gpu_default if gpu else cpu_default)

        width = getattr(args, "draft_intermediate", None)
        if width is not None and width < 1:
            raise UserError(f"--draft-intermediate must be positive, got {width}")
        return cls(model=args.model, out=Path(args.out).expanduser(), data=getattr(args, "data", None),
                   draft_vocab=int(opt("draft_vocab", 8192, 8192)), steps=int(opt("steps", 20000, 200)),
                   seq_len=int(opt("seq_len", 1024, 512)), batch_tokens=int(opt("batch_tokens", 16384, 2048)),
                   ttt_steps=int(opt("ttt_steps", 5, 5)), lr=float(opt("lr", 1.2e-3, 6e-4)),
                   gen_prompts=int(opt("gen", 40000, 0)), gen_tokens=int(opt("gen_tokens", 256, 128)),
                   time_budget=opt("time_budget", 840.0, None), eval_every=int(opt("eval_every", 250, 100)),
                   eval_prompts=int(opt("eval_prompts", 8, 2)), seed=int(opt("seed", 0, 0)),
                   val_conversations=48 if gpu else 8, val_rows=8 if gpu else 2,
                   mtp_layers=int(opt("mtp_layers", 3, 3)), draft_intermediate=int(width or 0),
                   gen_frac=float(opt("gen_frac", 0.85, 0.85)), greedy_weight=float(opt("greedy_weight", 0.5, 0.5)),
                   instruct_frac=float(opt("instruct_frac", 0.1, 0.1)))


def feature_cache_bytes(opts: TrainOptions, device: torch.device) -> TrainOptions:
    """opts with the bytes of target features to keep on the device, set once the target is
    loaded: on CUDA the free memory less what a training step needs (about 12 GiB at 16,384
    tokens a step, so 16 GiB per 16,384 are kept back); 2 GiB elsewhere. The features of the
    default demo run (16.5 M tokens of prompts and the target's replies, 2.2 M of conversations,
    4.6 KB each) take about 86 GB; a cache that cannot hold them recomputes the rest at every
    step, at about half the speed. Generation runs before the cache fills and frees its K/V."""
    if device.type != "cuda":
        return replace(opts, cache_bytes=2 << 30)
    keep = (16 << 30) * max(1.0, opts.batch_tokens / 16384)
    return replace(opts, cache_bytes=int(max(1 << 30, torch.cuda.mem_get_info(device)[0] - keep)))


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
    from engine.engine import pick_device

    t_start = time.perf_counter()
    dev = pick_device(getattr(args, "device", None))
    opts = TrainOptions.from_args(args, dev)
    deadline = None if opts.time_budget is None else t_start + opts.time_budget
    torch.manual_seed(opts.seed)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    phases: dict[str, float] = {}

    loaded, target_name, target_path = _load_target(opts, dev)
    opts = feature_cache_bytes(opts, dev)
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
    teacher = Teacher(loaded, aux_ids, opts.max_len, opts.cache_bytes)
    phases["load_s"] = time.perf_counter() - t_start

    data = prepare_data(opts, loaded, teacher, t_start, deadline, phases, reply_cache(opts, target_path, loaded),
                        generate=resume is None)  # a resumed run trains on the replies it had
    text, gen, val_gen, val_text = data.text, data.gen, data.val_gen, data.val_text

    if resume:
        draft_ids, coverage = resume["draft_ids"].to(dev), resume["coverage"]
    else:
        draft_ids, coverage = choose_draft_vocab(text, gen, cfg.vocab_size, opts.draft_vocab, dev)
    _log(f"draft vocabulary: {opts.draft_vocab} tokens cover {coverage['text']:.1%} of the conversation tokens"
         + (f" and {coverage['replies']:.1%} of the target's replies" if "replies" in coverage else ""))
    draft, config = _init_draft(loaded, aux_ids, draft_ids, opts)
    if resume:
        draft.load_state_dict(resume["draft"])

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

    if attention._VARLEN_FAILED:
        _log(f"(the target's packed forwards fell back to padded attention: {attention._VARLEN_FAILED})")

    t = time.perf_counter()
    from speculative.train.export import head_readme, save_head, write_provenance

    save_head(opts.out, config, draft, cfg.vocab_size)  # first: a failing check below loses nothing
    if res.interrupted:
        train_checkpoint.save(opts.out, draft, res, draft_ids, coverage, run_settings)
        _log(f"to train on along the same schedule: {_command(args, resume=True)}")
    else:
        train_checkpoint.discard(opts.out)
    final, failed = final_checks(
        res, lambda: validate(draft, teacher, val_rows(val_seqs, opts), opts, draft_ids) if val_seqs else {},
        (lambda: teacher.check_speculator(opts.out, data.eval_msgs[:opts.eval_prompts], opts.ttt_steps,
                                          opts.gen_tokens)) if opts.eval_prompts else None, _log)
    phases["final_eval_s"] = time.perf_counter() - t
    wall = time.perf_counter() - t_start
    prov = {
        "target": target_name, "command": _command(args),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "wall_s": round(wall, 1),
        "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None, "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "draft_vocab_size": opts.draft_vocab, "aux_layer_ids_input": list(aux_ids),
        "draft_vocab_coverage": coverage,
        "data": data.provenance(),
        "train": {**{k: v for k, v in asdict(opts).items() if k not in ("out", "model", "data")},
                  "steps_done": res.steps_done, "entries": res.entries, "first_loss": round(res.first_loss, 4),
                  "last_loss": round(res.last_loss, 4), "tokens_per_s": round(res.entries / max(res.train_s, 1e-9))},
        "interrupted": res.interrupted, "resumed_at_step": resume["step"] if resume else None,
        "validation_history": res.history,
        "final_eval": final,
    }
    write_provenance(opts.out, prov, head_readme(prov), _log)
    return 130 if res.interrupted else 1 if failed else 0


def _load_target(opts: TrainOptions, dev: torch.device):
    from engine.loader import load_folder, load_gguf
    from engine.options import KernelOptions
    from engine.hub.resolve import resolve

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    src = resolve(opts.model, log=_log)
    _log(f"loading {src.name} on {dev}")
    options = KernelOptions.from_env()  # no draft: the fast kernels (Teacher.check_speculator makes its own)
    if src.is_gguf:
        from engine.weights.prepared import prepared_dir

        loaded = load_gguf(src.path, dev, dtype, opts.max_len, prepared_dir=prepared_dir(src.path, src.is_demo),
                           log=_log, options=options)
        return loaded, src.name, src.path
    return load_folder(src.path, dev, dtype, opts.max_len, options), src.name, src.path


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


def _command(args, resume: bool | None = None) -> str:
    """The command line that reproduces this run, from the parsed flags (resume: with or
    without --resume instead of as given)."""
    parts = ["localchat", "train-draft"]
    for name in ("model", "out", "kind", "mtp_layers", "data", "draft_vocab", "draft_intermediate", "steps", "device",
                 "time_budget", "seq_len", "batch_tokens", "ttt_steps", "lr", "gen", "gen_frac", "greedy_weight",
                 "gen_tokens", "instruct_frac", "eval_every", "eval_prompts", "seed"):
        value = getattr(args, name, None)
        if name in (("draft_vocab", "draft_intermediate", "ttt_steps") if getattr(args, "kind", None) == "mtp"
                    else ("mtp_layers",)):
            continue  # flags the other kind ignores
        if value is not None:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    if (getattr(args, "resume", False) if resume is None else resume):
        parts.append("--resume")
    return " ".join(parts)
