"""The optimisation loop: packed batches from two pools (conversations, the target's own replies),
AdamW with warm-up and cosine decay over steps or wall time, periodic held-out validation."""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from dataclasses import dataclass, field

import torch

from speculative.train.progress import ProgressBar, remaining
from speculative.train.teacher import Teacher
from speculative.train.data import Sequence, pack
from speculative.train.ttt import StepStats, TTTBatch, chain_accept_len, greedy_in_draft, ttt_loss, unroll


@dataclass
class LoopResult:
    steps_done: int = 0
    train_s: float = 0.0
    entries: int = 0  # draft entries trained on (per unrolled step)
    first_loss: float = float("nan")
    last_loss: float = float("nan")
    history: list[dict] = field(default_factory=list)  # validation points
    interrupted: bool = False  # stopped by Ctrl+C (or out of memory): the steps done are kept and saved
    out_of_memory: bool = False  # stopped because the GPU's memory ran out
    # The schedule, for a checkpoint: training seconds it spans (None: by steps) and has used,
    # counting a resumed run's earlier part; the optimizer's state.
    schedule_s: float | None = None
    schedule_used_s: float = 0.0
    opt_state: dict | None = None


def on_ctrl_c(res: LoopResult, step: int, log) -> None:
    """A Ctrl+C during training keeps what the finished steps learned (the caller saves it);
    before the first step there is nothing to keep, and the interrupt goes on."""
    if step == 0:
        raise KeyboardInterrupt
    res.interrupted = True
    log(f"interrupted after {step} steps: saving the head trained so far (a second Ctrl+C, 2 s or more later, aborts)")


def on_out_of_memory(res: LoopResult, step: int, error: BaseException, log) -> None:
    """Running out of GPU memory during training keeps what the finished steps learned, as Ctrl+C
    does (the caller saves it and a checkpoint); before the first step there is nothing to keep,
    and the error goes on."""
    if step == 0:
        raise error
    res.interrupted = res.out_of_memory = True
    log(f"out of GPU memory after {step} steps: saving the head trained so far")


def final_checks(res: LoopResult, validation, speculator, log) -> tuple[dict, str | None]:
    """After training: the held-out figures (validation()) and the real speculator's check
    (speculator(), or None to skip it), or a note that Ctrl+C skipped both. Returns (figures,
    failure message or None); a failure is recorded, not raised, since the weights are saved."""
    if res.interrupted:
        why = "out of GPU memory" if res.out_of_memory else "interrupted"
        return {"skipped": f"{why} after {res.steps_done} steps"}, None
    final: dict = {}
    try:
        final = validation()
        if speculator is not None:
            final["speculator"] = speculator()
    except Exception as e:
        failed = f"{type(e).__name__}: {e}"
        final["error"] = failed
        log(f"final check failed: {failed}")
        return final, failed
    return final, None


def show_step(bar: ProgressBar, step: int, steps: int, budget: float | None, elapsed: float, loss: float,
              first_acc: float, tokens_per_s: float, per_step_s: float) -> None:
    """The progress bar after a training step: the schedule's fraction done (steps or seconds,
    whichever ends it first) and the time left."""
    if not bar.enabled:
        return
    fraction = step / steps if budget is None else max(step / steps, elapsed / budget)
    left = (steps - step) * per_step_s if budget is None else min(budget - elapsed, (steps - step) * per_step_s)
    bar.update(fraction, f"step {step:,}  loss {loss:.3f}  acc {first_acc:.2f}  {tokens_per_s:,.0f} tok/s  "
                         f"{remaining(left)}")


class Batcher:
    """Rows of whole sequences, drawn from the reply pool with probability `gen_frac`."""

    def __init__(self, pools: dict[str, list[Sequence]], gen_frac: float, seq_len: int, rows: int, seed: int):
        self.pools = {k: v for k, v in pools.items() if v}
        self.gen_frac = gen_frac if "gen" in self.pools and "text" in self.pools else float("gen" in self.pools)
        self.seq_len, self.rows = seq_len, rows
        self.rng = random.Random(seed)
        self.order = {k: [] for k in self.pools}
        self.carry = None

    def _next(self):
        name = "gen" if self.rng.random() < self.gen_frac else "text"
        if not self.order[name]:
            self.order[name] = list(range(len(self.pools[name])))
            self.rng.shuffle(self.order[name])
        i = self.order[name].pop()
        return (name, i), self.pools[name][i]

    def next_rows(self) -> list[list[tuple]]:
        rows = []
        for _ in range(self.rows):
            row, used = [], 0
            while True:
                item = self.carry if self.carry is not None else self._next()
                self.carry = None
                n = len(item[1].ids) - 1
                if n > self.seq_len:
                    continue  # cannot happen for sequences cut to seq_len tokens; never loop on one
                if used + n > self.seq_len:
                    self.carry = item
                    break
                row.append(item)
                used += n
            rows.append(row)
        return rows


def lr_at(step: int, progress: float, base: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def val_rows(seqs: list[Sequence], opts) -> list[list[tuple]]:
    """The validation rows: held-out sequences packed in order, the first opts.val_rows rows."""
    return [[(("val", i), seqs[i]) for i in row] for row in pack(seqs, opts.seq_len)][:opts.val_rows]


@torch.no_grad()
def validate(draft, teacher: Teacher, rows: list[list[tuple]], opts, draft_ids) -> dict:
    """Held-out figures: per-step top-1 agreement with the target's greedy token, loss, and the
    chain estimate of tokens per verify step with k = ttt_steps drafts."""
    draft.eval()
    accs, losses, weights, chains, starts = [], [], 0, 0.0, 0
    for row in rows:
        batch = TTTBatch.from_rows([teacher.features_many(row)], opts.seq_len)
        with _autocast(teacher.device):
            logits = unroll(draft, teacher.embed, batch, opts.ttt_steps)
        stats = ttt_loss(logits, batch, teacher.label_logits(batch.label_hidden, draft_ids), draft.d2t, opts.decay)
        n = int(batch.valid(0).sum())
        accs.append([a * n for a in stats.step_acc])
        losses.append(float(stats.loss) * n)
        weights += n
        est, k = chain_accept_len(batch, stats.correct)
        chains += est * k
        starts += k
    draft.train()
    return {"step_acc": [round(sum(a[t] for a in accs) / max(weights, 1), 4) for t in range(opts.ttt_steps)],
            "loss": round(sum(losses) / max(weights, 1), 4),
            "accept_len_estimate": round(chains / max(starts, 1), 3), "k": opts.ttt_steps}


def features_batch(teacher: Teacher, rows: list[list[tuple]], seq_len: int) -> TTTBatch:
    """The teacher's features of rows of (key, sequence) items (computed once, cached after
    their first use), packed into a TTTBatch."""
    flat = teacher.features_many([item for row in rows for item in row])
    packed, i = [], 0
    for row in rows:
        packed.append(flat[i:i + len(row)])
        i += len(row)
    return TTTBatch.from_rows(packed, seq_len)


def _step_loss(draft, teacher: Teacher, rows: list[list[tuple]], opts,
               draft_ids: torch.Tensor) -> tuple[StepStats, TTTBatch]:
    batch = features_batch(teacher, rows, opts.seq_len)
    target_logits = teacher.label_logits(batch.label_hidden, draft_ids)
    with _autocast(teacher.device):
        logits = unroll(draft, teacher.embed, batch, opts.ttt_steps)
    weight = getattr(opts, "greedy_weight", 0.0)
    greedy = greedy_in_draft(batch.greedy, draft_ids, teacher.embed.num_embeddings) if weight > 0 else None
    return ttt_loss(logits, batch, target_logits, draft.d2t, opts.decay, greedy, weight,
                    getattr(opts, "soft_temperature", 1.0)), batch


def train_step(draft, teacher: Teacher, rows: list[list[tuple]], opts, draft_ids: torch.Tensor, opt,
               params: list) -> tuple[StepStats, TTTBatch]:
    """One optimizer step on packed rows of (key, sequence) items: the teacher's features
    (cached after their first use), the unrolled draft steps, the loss, the update."""
    stats, batch = _step_loss(draft, teacher, rows, opts, draft_ids)
    opt.zero_grad(set_to_none=True)
    stats.loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return stats, batch


def train(draft, teacher: Teacher, pools: dict[str, list[Sequence]], val_seqs: list[Sequence], opts,
          draft_ids: torch.Tensor, train_deadline: float | None, log, resume: dict | None = None) -> LoopResult:
    """resume: a checkpoint of a stopped run (speculative/train/checkpoint.py): its optimizer
    state, step and schedule continue; the run ends with that schedule or at train_deadline."""
    dev = teacher.device
    bar = ProgressBar()
    log = functools.partial(bar.log, log)  # log lines print above the bar
    rows_per_step = max(1, opts.batch_tokens // opts.seq_len)
    step = resume["step"] if resume else 0
    batcher = Batcher(pools, opts.gen_frac, opts.seq_len, rows_per_step, opts.seed + step)
    val = val_rows(val_seqs, opts)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=dev.type == "cuda")
    if resume:
        opt.load_state_dict(resume["opt"])
    warmup = max(1, min(100, opts.steps // 20))
    res = LoopResult()
    if resume:
        res.history = list(resume.get("history", []))
        res.first_loss = resume.get("first_loss", float("nan"))
    draft.train()
    t0 = last_log = time.perf_counter()
    budget = None
    used = 0.0  # training seconds of the schedule spent before this run
    if resume:
        budget, used = resume["schedule_s"], resume["schedule_used_s"]
    elif train_deadline is not None:
        budget = train_deadline - t0
        if budget < 30:
            log(f"only {budget:.0f} s of the time budget are left for training; training 30 s anyway")
            budget = 30.0
    stop_at = train_deadline if resume else None  # a resumed run also keeps its own budget
    log_every = max(1, min(50, opts.steps // 20))
    window_entries, window_t = 0, t0
    first = step
    try:
        while step < opts.steps:
            now = time.perf_counter()
            progress = step / opts.steps if budget is None else max(step / opts.steps, (used + now - t0) / budget)
            if progress >= 1.0 or (stop_at is not None and now >= stop_at):
                break
            lr = lr_at(step, progress, opts.lr, warmup)
            for g in opt.param_groups:
                g["lr"] = lr
            stats, batch = train_step(draft, teacher, batcher.next_rows(), opts, draft_ids, opt, params)
            loss = float(stats.loss.detach())  # syncs: the step time is measured honestly
            n = int(batch.valid(0).sum())
            res.entries += n
            window_entries += n
            if step == 0 or (step == first and res.first_loss != res.first_loss):  # NaN: not set yet
                res.first_loss = loss
            res.last_loss = loss
            step += 1
            now = time.perf_counter()
            show_step(bar, step, opts.steps, budget, used + now - t0, loss, stats.step_acc[0],
                      res.entries / max(now - t0, 1e-9), (now - t0) / (step - first))
            if step % log_every == 0 or step == opts.steps or now - last_log > 15:
                rate = window_entries / max(now - window_t, 1e-9)
                acc = " ".join(f"{a:.2f}" for a in stats.step_acc)
                log(f"step {step}/{opts.steps}  loss {loss:.3f}  acc[{acc}]  lr {lr:.2e}  "
                    f"{rate:,.0f} tok/s  {(now - t0) / (step - first):.3f} s/step  {now - t0:.0f} s")
                last_log, window_entries, window_t = now, 0, now
            if val and opts.eval_every and step % opts.eval_every == 0 and step < opts.steps:
                v = validate(draft, teacher, val, opts, draft_ids)
                v["step"] = step
                res.history.append(v)
                log(f"held-out @ {step}: acc {v['step_acc']}  loss {v['loss']}  est. accept len "
                    f"{v['accept_len_estimate']} (k={v['k']})")
    except KeyboardInterrupt:
        on_ctrl_c(res, step - first, log)
    except torch.OutOfMemoryError as e:
        on_out_of_memory(res, step - first, e, log)
    finally:
        bar.close()
    res.steps_done = step
    res.train_s = time.perf_counter() - t0
    res.schedule_s, res.schedule_used_s = budget, used + res.train_s
    res.opt_state = opt.state_dict()
    return res
