"""`localchat train-draft --kind mtp`: self-distils S chain-MTP layers for a Llama-family target."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, replace

import torch

from engine.errors import UserError
from engine.ops import Ops

from speculative.mtp.model import MTPDraft
from speculative.mtp.config import MTPConfig
from speculative.train.mtp_unroll import TOP_K, chain_accept_len, mtp_loss, unroll, valid
from speculative.train.progress import ProgressBar
from speculative.train.teacher import Teacher
from speculative.train.loop import (Batcher, LoopResult, _autocast, features_batch, final_checks, lr_at, on_ctrl_c,
                                    on_out_of_memory, show_step, val_rows)
from speculative.train.ttt import TTTBatch


def init_layers(loaded, num_layers: int, seed: int) -> tuple[MTPDraft, MTPConfig]:
    """S layers shaped like the target's blocks (fp32 master weights, plain-torch ops so autograd
    runs on any device). Each block starts as a copy of the target's last layer, final_layernorm
    as the target's final norm, input_proj as [small noise | identity] on [embed | state]."""
    cfg = loaded.config
    if cfg.qk_norm or cfg.is_qwen2 or cfg.attention_bias or cfg.mlp_bias:
        raise UserError(f"--kind mtp trains Llama-family blocks; {cfg.architecture} is not one")
    mc = MTPConfig(format="localchat", num_layers=num_layers, chain=True, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                   head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps)
    dev = loaded.model.lm_head.weight.device
    draft = MTPDraft(mc, cfg, Ops.for_device(torch.device("cpu"))).to(dev)
    last = loaded.model.model.layers[-1].state_dict()
    g = torch.Generator(device="cpu").manual_seed(seed)
    H = cfg.hidden_size
    with torch.no_grad():
        for layer in draft.mtp_layers:
            for name, p in layer.state_dict(keep_vars=True).items():
                if name in last:
                    p.copy_(last[name].float())
            layer.final_layernorm.weight.copy_(loaded.model.model.norm.weight.float())
            noise = torch.randn(H, H, generator=g) * 0.02 / H ** 0.5
            layer.input_proj.weight.copy_(torch.cat([noise, torch.eye(H)], dim=1).to(dev))  # [embed | state]
    return draft.train(), mc


class _Target:
    """What the loss reads from the frozen target: embeddings, final norm, lm_head, RoPE table."""

    def __init__(self, loaded):
        m = loaded.model.requires_grad_(False)
        self.embed, self.norm, self.lm_head, self.cos_sin = m.model.embed_tokens, m.model.norm, m.lm_head, m.cos_sin

    def stats(self, draft, batch: TTTBatch, decay: float):
        with _autocast(batch.tokens.device):
            normed = unroll(draft, self.embed, self.norm, batch, self.cos_sin)
            return mtp_loss(normed, batch, self.lm_head, decay)


@torch.no_grad()
def validate(draft, target: _Target, teacher: Teacher, rows, opts) -> dict:
    draft.eval()
    S = opts.mtp_layers
    acc, loss, weight, chains, starts = [0.0] * S, 0.0, 0, 0.0, 0
    for row in rows:
        batch = TTTBatch.from_rows([teacher.features_many(row)], opts.seq_len)
        st = target.stats(draft, batch, opts.decay)
        n = int(valid(batch, 0).sum())
        acc = [a + x * n for a, x in zip(acc, st.step_acc)]
        loss += float(st.loss) * n
        weight += n
        est, k = chain_accept_len(batch, st.correct)
        chains += est * k
        starts += k
    draft.train()
    return {"step_acc": [round(a / max(weight, 1), 4) for a in acc], "loss": round(loss / max(weight, 1), 4),
            "accept_len_estimate": round(chains / max(starts, 1), 3), "k": S}


def train(draft, target: _Target, teacher: Teacher, pools, val, opts, deadline, log) -> LoopResult:
    dev = teacher.device
    bar = ProgressBar()
    log = functools.partial(bar.log, log)  # log lines print above the bar
    batcher = Batcher(pools, opts.gen_frac, opts.seq_len, max(1, opts.batch_tokens // opts.seq_len), opts.seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.01, fused=dev.type == "cuda")
    warmup = max(1, min(100, opts.steps // 20))
    log_every = max(1, min(50, opts.steps // 20))
    res = LoopResult()
    t0 = last_log = time.perf_counter()
    budget = None if deadline is None else max(30.0, deadline - t0)
    step = 0
    try:
        while step < opts.steps:
            progress = step / opts.steps if budget is None else max(step / opts.steps, (time.perf_counter() - t0) / budget)
            if progress >= 1.0:
                break
            lr = lr_at(step, progress, opts.lr, warmup)
            for grp in opt.param_groups:
                grp["lr"] = lr
            batch = features_batch(teacher, batcher.next_rows(), opts.seq_len)
            st = target.stats(draft, batch, opts.decay)
            opt.zero_grad(set_to_none=True)
            st.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            loss = float(st.loss.detach())  # syncs: the step time is measured honestly
            res.entries += int(valid(batch, 0).sum())
            res.first_loss = loss if step == 0 else res.first_loss
            res.last_loss = loss
            step += 1
            now = time.perf_counter()
            show_step(bar, step, opts.steps, budget, now - t0, loss, st.step_acc[0], res.entries / max(now - t0, 1e-9),
                      (now - t0) / step)
            if step % log_every == 0 or step == opts.steps or now - last_log > 15:
                acc = " ".join(f"{a:.2f}" for a in st.step_acc)
                log(f"step {step}/{opts.steps}  loss {loss:.3f}  acc[{acc}]  lr {lr:.2e}  "
                    f"{res.entries / (now - t0):,.0f} tok/s  {(now - t0) / step:.3f} s/step  {now - t0:.0f} s")
                last_log = now
            if val and opts.eval_every and step % opts.eval_every == 0 and step < opts.steps:
                v = {**validate(draft, target, teacher, val, opts), "step": step}
                res.history.append(v)
                log(f"held-out @ {step}: acc {v['step_acc']}  loss {v['loss']}  est. accept len "
                    f"{v['accept_len_estimate']} (k={v['k']})")
    except KeyboardInterrupt:
        bar.close()
        on_ctrl_c(res, step, log)
    except torch.OutOfMemoryError as e:
        bar.close()
        on_out_of_memory(res, step, e, log)
    finally:
        bar.close()
    res.steps_done = step
    res.train_s = time.perf_counter() - t0
    return res


def cmd_train_mtp(args) -> int:
    from speculative.train.mtp_export import layers_readme, save_layers
    from speculative.train.options import command_line
    from speculative.train.progress import log as _log
    from speculative.train.target import start_run
    from speculative.train.export import write_provenance
    from speculative.train.prepare import prepare_data, reply_cache

    run = start_run(args, lambda opts: replace(opts, ttt_steps=opts.mtp_layers))  # k of the final check
    t_start, dev, opts, deadline = run.t_start, run.device, run.opts, run.deadline
    loaded, target_name, target_path = run.loaded, run.target_name, run.target_path
    phases: dict[str, float] = {}
    cfg = loaded.config
    # aux = the final residual stream (the input of "layer L"); its final norm is h_p.
    teacher = Teacher(loaded, (cfg.num_layers,), opts.max_len, opts.cache_bytes)
    draft, mc = init_layers(loaded, opts.mtp_layers, opts.seed)
    target = _Target(loaded)
    phases["load_s"] = time.perf_counter() - t_start

    data = prepare_data(opts, loaded, teacher, t_start, deadline, phases, reply_cache(opts, target_path, loaded))
    text, gen = data.text, data.gen

    train_deadline = None if deadline is None else deadline - opts.reserve_s
    _log(f"training {opts.mtp_layers} chain-MTP layers: {opts.steps} steps of {opts.batch_tokens} tokens")
    val_seqs = data.val_gen + data.val_text
    val = val_rows(val_seqs, opts)
    res = train(draft, target, teacher, {"text": text, "gen": gen}, val, opts, train_deadline, _log)
    phases["train_s"], phases["target_features_s"] = res.train_s, teacher.forward_s
    _log(f"trained {res.steps_done} steps in {res.train_s:.1f} s; loss {res.first_loss:.3f} -> {res.last_loss:.3f}")

    t = time.perf_counter()
    save_layers(opts.out, mc, draft)  # first: a failing check below loses nothing
    final, failed = final_checks(
        res, lambda: validate(draft, target, teacher, val, opts) if val else {},
        (lambda: teacher.check_speculator(opts.out, data.eval_msgs[:opts.eval_prompts], opts.mtp_layers,
                                          opts.gen_tokens)) if opts.eval_prompts else None, _log)
    phases["final_eval_s"] = time.perf_counter() - t
    wall = time.perf_counter() - t_start
    skip = ("out", "model", "data", "draft_vocab", "ttt_steps")
    prov = {
        "target": target_name, "kind": "mtp", "command": command_line(args),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
        "wall_s": round(wall, 1), "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None,
        "data": data.provenance(),
        "train": {**{k: v for k, v in asdict(opts).items() if k not in skip}, "top_k": TOP_K,
                  "steps_done": res.steps_done, "entries": res.entries, "first_loss": round(res.first_loss, 4),
                  "last_loss": round(res.last_loss, 4), "tokens_per_s": round(res.entries / max(res.train_s, 1e-9))},
        "interrupted": res.interrupted, "out_of_memory": res.out_of_memory, "validation_history": res.history,
        "final_eval": final,
    }
    write_provenance(opts.out, prov, layers_readme(prov), _log)
    if res.out_of_memory:
        _log(f"the GPU ran out of memory; the layers trained so far are in {opts.out}: a new run with a smaller "
             "--batch-tokens fits")
        return 1
    return 130 if res.interrupted else 1 if failed else 0
