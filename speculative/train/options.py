"""TrainOptions: a train-draft run's settings, from its flags and the device; the command line that
reproduces a run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.errors import UserError
from speculative.train.prompt_sets import DEFAULT_SETS, parse_sets


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
    gen_prompts: int  # training prompts the target answers itself; 0: none
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
    # Temperature of the soft loss: the head's distribution at T against the target's at T (1: the
    # distributions as they are). Sampled verification keeps a draft with probability
    # sum(min(p_T, q_T)) at the request's temperature T, so a head meant for sampled answers may fit
    # them there; the greedy token's loss does not depend on it.
    soft_temperature: float = 1.0
    # Share of the training prompts (chosen by each prompt's own hash) whose replies are drawn at
    # reply_temperature instead of greedy. A sampled answer walks through contexts no greedy reply
    # shows; on those the shipped demo head's distribution was further from the target's (KL at
    # 0.7 per position: benchmarks/context_shift.py, docs/performance.md).
    sampled_replies: float = 0.0
    reply_temperature: float = 0.7
    gen_share: float = 0.45  # share of the time budget after which no new reply is started
    reserve_s: float = 25.0  # budget kept for validation, saving and the speculator check
    val_conversations: int = 48
    val_rows: int = 4
    cache_bytes: int = 2 << 30  # target features kept on the device (feature_cache_bytes sets it)
    mtp_layers: int = 3  # --kind mtp: chained MTP layers S, also k of the final check
    draft_intermediate: int = 0  # the head's MLP width (0: the target's intermediate size)
    # Share of the generation prompts taken from the request sets of prompt_sets (requests for
    # lists, how-tos, explanations, code and short writing) instead of the conversations; at
    # most every training request the sets hold. 0.4 (default) with every set: the shipped demo
    # head's recipe (12 unseen requests on an H200: accepted length 3.42 against 3.06 for the
    # earlier head, 0.1 of the built-in requests alone). 0.1 against 0, built-in requests alone,
    # same budget: 3.26 vs 3.22 on held-out chitchat, 2.57 vs 1.77 on held-out instruction
    # requests (docs/performance.md).
    instruct_frac: float = 0.4
    prompt_sets: tuple[str, ...] = DEFAULT_SETS  # --prompt-sets, parsed (prompt_sets.parse_sets)
    # --init: the EAGLE-3 head training starts from (its weights, draft vocabulary and MLP width)
    # instead of a fresh one: as given, then its folder (command._shape_of_init); a string so that
    # the provenance and a checkpoint's settings keep it.
    init: str | None = None
    # --int8-lm-head: the saved head's lm_head as int8 rows with a scale each (engine/weights/int8_rows.py),
    # half the bytes of bf16, for a draft vocabulary too large to fit a bounded size otherwise
    int8_lm_head: bool = False

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
        if not 0.05 <= self.soft_temperature <= 10:
            raise UserError(f"--soft-temperature must be in [0.05, 10], got {self.soft_temperature}")
        if not 0 <= self.sampled_replies <= 1:
            raise UserError(f"--sampled-replies must be in [0, 1], got {self.sampled_replies}")
        if not 0.05 <= self.reply_temperature <= 2:
            raise UserError(f"--reply-temperature must be in [0.05, 2], got {self.reply_temperature}")
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
                   ttt_steps=int(opt("ttt_steps", 5, 5)), lr=float(opt("lr", *((4e-4, 2e-4) if getattr(args, "init", None) else (1.2e-3, 6e-4)))),
                   gen_prompts=int(opt("gen", 40000, 0)), gen_tokens=int(opt("gen_tokens", 256, 128)),
                   time_budget=opt("time_budget", 840.0, None), eval_every=int(opt("eval_every", 250, 100)),
                   eval_prompts=int(opt("eval_prompts", 8, 2)), seed=int(opt("seed", 0, 0)),
                   val_conversations=48 if gpu else 8, val_rows=8 if gpu else 2,
                   mtp_layers=int(opt("mtp_layers", 3, 3)), draft_intermediate=int(width or 0),
                   gen_frac=float(opt("gen_frac", 0.85, 0.85)), greedy_weight=float(opt("greedy_weight", 0.5, 0.5)),
                   soft_temperature=float(opt("soft_temperature", 1.0, 1.0)),
                   sampled_replies=float(opt("sampled_replies", 0.0, 0.0)),
                   reply_temperature=float(opt("reply_temperature", 0.7, 0.7)),
                   instruct_frac=float(opt("instruct_frac", 0.4, 0.4)),
                   prompt_sets=parse_sets(getattr(args, "prompt_sets", None)),
                   init=str(args.init).strip() or None if getattr(args, "init", None) else None,
                   int8_lm_head=bool(getattr(args, "int8_lm_head", False)))


def feature_cache_bytes(opts: TrainOptions, device: torch.device) -> TrainOptions:
    """opts with the bytes of target features to keep on the device, set once the target is
    loaded: on CUDA the free memory less what a training step needs (about 12 GiB at 16,384
    tokens a step with 8,192 draft tokens and 5 unrolled steps, so 16 GiB per 16,384 are kept
    back, more in proportion to a larger draft vocabulary times unrolled steps: each step's
    logits and their log-softmax are tokens x draft vocabulary); 2 GiB elsewhere. The features
    of the default demo run (16.5 M tokens of prompts and the target's replies, 2.2 M of
    conversations, 4.6 KB each) take about 86 GB; a cache that cannot hold them recomputes the
    rest at every step, at about half the speed. Generation runs before the cache fills and
    frees its K/V. (The cache fills as training reaches new sequences: a step that needs more
    than was kept back runs out of memory only then, hundreds of steps in.)"""
    if device.type != "cuda":
        return replace(opts, cache_bytes=2 << 30)
    logits = max(1.0, opts.draft_vocab * opts.ttt_steps / (8192 * 5))
    keep = (16 << 30) * max(1.0, opts.batch_tokens / 16384) * logits
    return replace(opts, cache_bytes=int(max(1 << 30, torch.cuda.mem_get_info(device)[0] - keep)))


def command_line(args, resume: bool | None = None) -> str:
    """The command line that reproduces this run, from the parsed flags (resume: with or
    without --resume instead of as given)."""
    parts = ["localchat", "train-draft"]
    for name in ("model", "out", "kind", "mtp_layers", "data", "draft_vocab", "draft_intermediate", "steps", "device",
                 "time_budget", "seq_len", "batch_tokens", "ttt_steps", "lr", "gen", "gen_frac", "greedy_weight",
                 "soft_temperature", "init", "sampled_replies", "reply_temperature",
                 "gen_tokens", "instruct_frac", "prompt_sets", "eval_every", "eval_prompts", "seed"):
        value = getattr(args, name, None)
        if name in (("draft_vocab", "draft_intermediate", "ttt_steps", "soft_temperature", "init")
                    if getattr(args, "kind", None) == "mtp"
                    else ("mtp_layers",)):
            continue  # flags the other kind ignores
        if value is not None:
            parts += [f"--{name.replace('_', '-')}", str(value)]
    if getattr(args, "int8_lm_head", False) and getattr(args, "kind", None) != "mtp":
        parts.append("--int8-lm-head")
    if (getattr(args, "resume", False) if resume is None else resume):
        parts.append("--resume")
    return " ".join(parts)
