"""What a train-draft run trains on: the conversations and their held-out split, tokenized; the
target's own replies to training prompts (greedy, or some drawn at a temperature; kept between
runs in the reply cache); and the reduced draft vocabulary chosen from token frequencies."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.errors import UserError

from speculative.train.progress import log as _log
from speculative.train.prompt_sets import SPLIT_RULE as REQUESTS_SPLIT
from speculative.train.data import (
    SPLIT_RULE,
    Conversation,
    Sequence,
    load_conversations,
    prompt_prefix,
    split,
    tokenize,
    user_turns,
)

if TYPE_CHECKING:
    from speculative.train.options import TrainOptions


@dataclass
class TrainData:
    """The conversations, their split, and the target's own replies, as both trainers use them."""

    source: dict
    convs: list[Conversation]
    train_convs: list[Conversation]
    held: list[Conversation]
    text: list[Sequence]  # training conversations, tokenized
    val_text: list[Sequence]  # the first held-out conversations, tokenized
    eval_msgs: list[list[dict]]  # first user turns of held-out conversations
    gen: list[Sequence]  # the target's replies to training prompts (greedy, some drawn: --sampled-replies)
    val_gen: list[Sequence]  # its greedy replies to held-out first turns
    cached_replies: int = 0  # of gen + val_gen, taken from the reply cache
    drawn_replies: int = 0  # of gen, replies drawn at --reply-temperature (--sampled-replies)
    requests: dict[str, int] | None = None  # of the prompts behind gen, from each of --prompt-sets

    def provenance(self) -> dict:
        return {**self.source, "split": SPLIT_RULE, "conversations": len(self.convs),
                "train_conversations": len(self.train_convs), "heldout_conversations": len(self.held),
                "train_tokens": sum(len(s.ids) for s in self.text), "generated_responses": len(self.gen),
                "responses_from_cache": self.cached_replies, "drawn_responses": self.drawn_replies,
                "requests": dict(self.requests or {}),
                **({"requests_split": REQUESTS_SPLIT} if self.requests else {}),
                "generated_tokens": sum(len(s.ids) - s.response_start for s in self.gen),
                "validation": f"the first {len(self.val_text)} held-out conversations and the target's replies to "
                              f"the first user turns of {len(self.val_gen)} held-out conversations"}


def reply_cache(opts: TrainOptions, target_path: Path, loaded):
    """The reply cache for this target, device and reply limits (speculative/train/reply_cache.py)."""
    from engine.paths import cache_dir

    from speculative.train.reply_cache import ReplyCache, target_identity

    w = loaded.model.lm_head.weight
    identity = {"target": target_identity(target_path), "eos": sorted(loaded.tokenizer.eos_token_ids),
                "device": w.device.type, "dtype": str(w.dtype), "gen_tokens": opts.gen_tokens,
                "max_len": opts.max_len}
    return ReplyCache.for_run(cache_dir() / "train-draft" / "replies", identity)


def prepare_data(opts: TrainOptions, loaded, teacher, t_start: float, deadline: float | None,
                 phases: dict, cache=None, generate: bool = True) -> TrainData:
    """Loads and splits the conversations, tokenizes them and has the target answer training
    prompts (until gen_share of the time budget), taking the replies it already has from
    `cache` (a ReplyCache) and adding the new ones to it; records data_s and generate_s."""
    t = time.perf_counter()
    convs, source = load_conversations(opts.data, _log)
    train_convs, held = split(convs)
    if not train_convs or not held:
        raise UserError(f"the data has {len(convs)} conversations; the 5% held-out split needs more "
                        "(a few hundred at least)")
    tok = loaded.tokenizer
    text = tokenize(tok, train_convs, opts.seq_len)
    val_text = tokenize(tok, held[:opts.val_conversations], opts.seq_len)
    eval_msgs = [p for p in (prompt_prefix(c.messages, 1) for c in held) if p is not None]
    phases["data_s"] = time.perf_counter() - t
    _log(f"{len(convs)} conversations: {len(train_convs)} for training ({sum(len(s.ids) for s in text):,} "
         f"tokens), {len(held)} held out; {phases['data_s']:.1f} s")

    t = time.perf_counter()
    gen: list[Sequence] = []
    val_gen: list[Sequence] = []
    cached = drawn = 0
    if opts.gen_prompts:
        from speculative.train.reply_cache import GenerationStopped, replies_for

        def answer(prompts, temperatures, gen_deadline=None, log=None):
            if not generate:
                return []
            return teacher.generate(prompts, opts.gen_tokens, gen_deadline, log, temperatures, opts.seed)

        def keep(entries: dict) -> None:
            if cache is not None and entries:
                try:
                    cache.save({**known, **entries})
                except OSError as e:  # a full or read-only disk costs the next run time, not this one
                    _log(f"could not keep the replies for later runs: {e}")

        known = cache.load() if cache is not None else {}
        added: dict = {}
        try:
            val_prompts = [tok.apply_chat_template(m) for m in eval_msgs[:opts.val_conversations // 2]]
            val_gen, n_val, new = replies_for(val_prompts, known, answer)
            added.update(new)
            gen_deadline = None if deadline is None else t_start + opts.gen_share * opts.time_budget
            prompts, n_requests = _train_prompts(train_convs, tok, opts)
            temps = reply_temperatures(prompts, opts)
            gen, n_gen, new = replies_for(prompts, known, lambda ps, ts: answer(ps, ts, gen_deadline, _log), temps)
            drawn_prompts = {tuple(p) for p, t in zip(prompts, temps) if t > 0}
            drawn = sum(tuple(s.ids[:s.response_start]) in drawn_prompts for s in gen)
            added.update(new)
        except GenerationStopped as stop:  # Ctrl+C: the replies made so far serve the next run
            keep({**added, **stop.new})
            _log(f"interrupted while generating: {len(added) + len(stop.new)} new replies kept for the next run")
            raise KeyboardInterrupt from None
        cached = n_val + n_gen
        keep(added)
        made = sum(len(s.ids) - s.response_start for s in gen + val_gen)
        phases["generate_s"] = time.perf_counter() - t
        _log(f"the target answered {len(gen)} training and {len(val_gen)} held-out prompts: {made:,} tokens in "
             f"{phases['generate_s']:.1f} s" + (f", {cached} of the replies from earlier runs" if cached else
                                                f" ({made / max(phases['generate_s'], 1e-9):,.0f} tokens/s)")
             + (f"; {drawn} of the training replies drawn at temperature {opts.reply_temperature:g}" if drawn else ""))
    return TrainData(source, convs, train_convs, held, text, val_text, eval_msgs, gen, val_gen,
                     cached_replies=cached, drawn_replies=drawn, requests=n_requests if opts.gen_prompts else None)


def reply_temperatures(prompts: list[list[int]], opts: TrainOptions) -> list[float]:
    """Each training prompt's reply temperature: --reply-temperature for the --sampled-replies
    share of them (chosen by the prompt itself: reply_cache.drawn_share), 0 (greedy) for the
    rest. The held-out replies stay greedy: the accepted-length estimate reads them as greedy
    text."""
    from speculative.train.reply_cache import drawn_share

    if opts.sampled_replies <= 0:
        return [0.0] * len(prompts)
    return [opts.reply_temperature if drawn_share(p) < opts.sampled_replies else 0.0 for p in prompts]


def _train_prompts(convs: list[Conversation], tok, opts: TrainOptions) -> tuple[list[list[int]], dict[str, int]]:
    """The prompts the target answers: --instruct-frac of them requests from --prompt-sets (their
    training splits, shared by size: prompt_sets.draw), every other one under the app's default
    system prompt and the rest under the template's own, the others from the conversations
    (_conversation_prompts), interleaved evenly so that a generation cut short by the time budget
    keeps the mix. Returns (prompts, requests taken from each set)."""
    from engine.spec_pays import SYSTEM
    from speculative.train import prompt_sets

    room = opts.seq_len - opts.gen_tokens - 1
    per_set: list[list[list[int]]] = []
    counts: dict[str, int] = {}
    if opts.instruct_frac > 0:
        want = round(opts.instruct_frac * opts.gen_prompts)
        for name, texts in prompt_sets.draw(opts.prompt_sets, want, opts.seed + 2, _log).items():
            kept = []
            for i, text in enumerate(texts):
                system = [{"role": "system", "content": SYSTEM}] if i % 2 == 0 else []
                ids = tok.apply_chat_template(system + [{"role": "user", "content": text}])
                if 0 < len(ids) <= room:
                    kept.append(ids)
            per_set.append(kept)
            counts[name] = len(kept)
    requests = prompt_sets.interleave([lst for lst in per_set if lst])
    chats = _conversation_prompts(convs, tok, opts, opts.gen_prompts - len(requests))
    return prompt_sets.interleave([lst for lst in (chats, requests) if lst]), counts


def _conversation_prompts(convs: list[Conversation], tok, opts: TrainOptions, count: int) -> list[list[int]]:
    """Prefixes of training conversations ending on a user turn, each short enough to leave
    room for a full reply. Taken in rounds over the shuffled conversations, one unused turn of
    each per round (in the first round the first turn for half of them), so --gen may ask for
    more replies than there are conversations and every conversation is used before any twice."""
    rng = random.Random(opts.seed + 1)
    order = list(range(len(convs)))
    rng.shuffle(order)
    room = opts.seq_len - opts.gen_tokens - 1
    free = {i: list(range(1, user_turns(convs[i].messages) + 1)) for i in order}
    out: list[list[int]] = []
    first_round = True
    while len(out) < count and any(free.values()):
        for i in order:
            if len(out) == count:
                break
            turns = free[i]
            if not turns:
                continue
            t = 1 if first_round and turns[0] == 1 and rng.random() < 0.5 else rng.choice(turns)
            turns.remove(t)
            prefix = prompt_prefix(convs[i].messages, t)
            ids = tok.apply_chat_template(prefix) if prefix else []
            if 0 < len(ids) <= room:
                out.append(ids)
            elif len(ids) > room:  # later turns are longer still
                free[i] = [u for u in turns if u < t]
        first_round = False
    return out


def choose_draft_vocab(text: list[Sequence], gen: list[Sequence], vocab: int, size: int, dev):
    """The `size` most frequent tokens (replies of the target count 4x: they are what gets
    drafted), sorted by id. Returns (ids on dev, coverage figures)."""
    c_text, c_gen = _counts(text, False, vocab), _counts(gen, True, vocab)
    chosen = torch.topk(c_text + 4 * c_gen, size).indices.sort().values
    return chosen.to(dev), _coverage(c_text, c_gen if gen else None, chosen)


def grow_draft_vocab(text: list[Sequence], gen: list[Sequence], vocab: int, kept: torch.Tensor, size: int):
    """An --init head's draft vocabulary `kept` grown to `size`: its tokens, and the most frequent
    others as choose_draft_vocab counts them, sorted by id. Returns (ids on kept's device, coverage
    figures)."""
    c_text, c_gen = _counts(text, False, vocab), _counts(gen, True, vocab)
    count = c_text + 4 * c_gen
    count[kept.cpu()] = -1.0  # below any token's count: never chosen again
    extra = torch.topk(count, size - kept.numel()).indices
    chosen = torch.cat([kept.cpu(), extra]).sort().values
    return chosen.to(kept.device), _coverage(c_text, c_gen if gen else None, chosen)


def vocab_coverage(text: list[Sequence], gen: list[Sequence], vocab: int, chosen: torch.Tensor) -> dict:
    """The coverage figures of a draft vocabulary chosen before (an --init head's)."""
    return _coverage(_counts(text, False, vocab), _counts(gen, True, vocab) if gen else None, chosen.cpu())


def _counts(seqs: list[Sequence], from_reply: bool, vocab: int) -> torch.Tensor:
    ids = [t for s in seqs for t in (s.ids[s.response_start:] if from_reply else s.ids[1:])]
    return torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab).double() if ids else \
        torch.zeros(vocab, dtype=torch.double)


def _coverage(c_text: torch.Tensor, c_gen: torch.Tensor | None, chosen: torch.Tensor) -> dict:
    cov = {"text": float(c_text[chosen].sum() / c_text.sum().clamp(min=1))}
    if c_gen is not None:
        cov["replies"] = float(c_gen[chosen].sum() / c_gen.sum().clamp(min=1))
    return {k: round(v, 4) for k, v in cov.items()}
