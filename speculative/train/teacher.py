"""Teacher: the target's side of self-distillation: aux features and next-token labels for each
sequence (cached on the device), replies to prompts (greedy or drawn), and the final speculator check."""

from __future__ import annotations

import dataclasses
import time

import torch

from engine.forward_batch import ForwardBatch
from speculative.train.batched_generate import reply_batch, kv_bytes_per_token
from engine.kv_cache import KVCache
from engine.runner import ModelRunner

from speculative.train.data import Sequence
from speculative.train.ttt import DocFeatures


class Teacher:
    def __init__(self, loaded, aux_layer_ids: tuple[int, ...], max_len: int, cache_bytes: int,
                 gen_batch: int | None = None, gen_kv_bytes: int | None = None):
        cfg = loaded.config
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.eos_ids = frozenset(loaded.tokenizer.eos_token_ids)  # replies stop after one of these
        self.config = cfg
        self.aux_layer_ids = aux_layer_ids
        self.device = self.model.lm_head.weight.device
        self.dtype = self.model.lm_head.weight.dtype
        self.max_len = max_len
        self.kv = KVCache(cfg.num_layers, max_len, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device)
        self._cache: dict = {}
        self._cache_left = cache_bytes
        self.forward_s = 0.0  # time spent computing features (for the throughput report)
        # Generation batches: at most gen_batch prompts, and their K/V (prompt + reply tokens,
        # all layers) within gen_kv_bytes. On CUDA a third of the free memory, at most 40 GiB
        # (generation runs before the feature cache fills): a 135M target then decodes about
        # 2,048 rows a step, and a step's host work is shared by that many tokens. On the CPU 64
        # rows within 1 GiB: the demo target on 2 cores made 236 tokens/s at 64 rows a step
        # against 89 at 8 (docs/performance.md).
        cuda = self.device.type == "cuda"
        self.gen_batch = gen_batch or (2048 if cuda else 64)
        if gen_kv_bytes is None:
            gen_kv_bytes = min(40 << 30, torch.cuda.mem_get_info(self.device)[0] // 3) if cuda else 1 << 30
        self.gen_kv_bytes = gen_kv_bytes

    @property
    def embed(self) -> torch.nn.Embedding:
        return self.model.model.embed_tokens

    def features(self, key, seq: Sequence) -> DocFeatures:
        return self.features_many([(key, seq)])[0]

    @torch.no_grad()
    def features_many(self, items: list[tuple]) -> list[DocFeatures]:
        """Entries of each (key, sequence): f_p, x_{p+1}, and the target's state and argmax at
        p+1. Sequences not cached yet run packed, several to a forward (attention kept inside
        each), so a small target is not held back by one short forward per conversation."""
        missing = [(key, seq) for key, seq in dict(items).items() if key not in self._cache]
        pending: dict = {}
        chunk: list[tuple] = []
        for key, seq in missing:
            if chunk and sum(len(s.ids) for _, s in chunk) + len(seq.ids) > self.PACK_TOKENS:
                pending.update(self._run_packed(chunk))
                chunk = []
            chunk.append((key, seq))
        if chunk:
            pending.update(self._run_packed(chunk))
        return [self._cache.get(key) or pending[key] for key, _ in items]

    PACK_TOKENS = 8192  # tokens per packed forward

    def _run_packed(self, chunk: list[tuple]) -> dict:
        t0 = time.perf_counter()
        lengths = [len(seq.ids) for _, seq in chunk]
        ids = torch.tensor([t for _, seq in chunk for t in seq.ids], dtype=torch.long, device=self.device)
        out = self.model(ForwardBatch.packed(ids, lengths), self.kv, self.aux_layer_ids)
        # argmax of the logits in the model's dtype: the same index as over their fp32 copy
        # (the conversion is exact and keeps the order), without writing T x V floats
        greedy_all = self.model.ops.linear(out.hidden, self.model.lm_head).argmax(-1)
        made, start = {}, 0
        for (key, seq), n in zip(chunk, lengths):
            sl = slice(start, start + n)
            start += n
            doc_ids, aux, hidden, greedy = ids[sl], out.aux_hidden[sl], out.hidden[sl], greedy_all[sl]
            j = torch.arange(n - 1, device=self.device)
            rs = seq.response_start
            is_resp = (j + 2 >= rs) & (j + 2 <= n - 1) if rs >= 0 else torch.zeros_like(j, dtype=torch.bool)
            f = DocFeatures(tokens=doc_ids[1:], aux=aux[:-1].clone(), label_hidden=hidden[1:].clone(),
                            greedy=greedy[1:], is_response=is_resp)
            size = (f.aux.numel() + f.label_hidden.numel()) * f.aux.element_size() + 17 * (n - 1)
            if size <= self._cache_left:
                self._cache[key] = f
                self._cache_left -= size
            made[key] = f
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.forward_s += time.perf_counter() - t0
        return made

    @torch.no_grad()
    def label_logits(self, label_hidden: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
        """(B, L, Ht) -> (B, L, Vd) fp32: the target's logits restricted to the draft vocabulary."""
        w = self.model.lm_head.weight.index_select(0, draft_ids)
        return torch.nn.functional.linear(label_hidden.to(w.dtype), w).float()

    GEN_WINDOW = 8  # batches' worth of prompts sorted by length together

    def generate(self, prompts: list[list[int]], max_tokens: int, deadline: float | None,
                 log=None, temperatures: list[float] | None = None, seed: int = 0) -> list[Sequence]:
        """The target's replies (until EOS, included, or max_tokens, or the context is full),
        prompt first, in the order of `prompts`: greedy, or for prompt i drawn at temperatures[i]
        where that is above 0 (each batch's draws seeded by `seed` and the batch's number, so a
        run repeats). Runs batches of prompts of similar length, greedy and drawn ones apart
        (sorted inside windows of GEN_WINDOW batches taken in order, so a deadline cuts off the
        tail of the list, not its longest prompts); starts no batch after `deadline`
        (perf_counter seconds). Each sequence records where its reply starts."""
        per_token = kv_bytes_per_token(self.model)
        room = min(self.max_len, self.model.cos_sin.shape[0])
        limits = [min(max_tokens, room - len(p)) for p in prompts]
        replies: dict[int, list[int]] = {}
        t0 = last_log = time.perf_counter()
        made = 0

        from speculative.train.progress import ProgressBar, remaining

        bar = ProgressBar() if log else None

        def progress(n: int) -> None:
            nonlocal made, last_log
            made += n
            now = time.perf_counter()
            if bar is not None:  # a terminal: the replies done so far, and the time the deadline leaves
                left = f"  {remaining(deadline - now)} at most" if deadline is not None else ""
                bar.update(len(replies) / max(len(prompts), 1),
                           f"replies {len(replies):,}/{len(prompts):,}  {made / max(now - t0, 1e-9):,.0f} tokens/s{left}")
            if log and now - last_log > 10:
                last_log = now
                bar.log(log, f"  generated {len(replies)}/{len(prompts)} replies, {made / (now - t0):.0f} tokens/s")

        todo = [i for i in range(len(prompts)) if limits[i] > 0 and prompts[i]]
        for i in range(len(prompts)):
            if not (limits[i] > 0 and prompts[i]):
                replies[i] = []  # no room for a reply (an empty prompt has nothing to answer)
        window = self.GEN_WINDOW * self.gen_batch
        order: list[int] = []
        batches = 0
        try:
            while todo or order:
                if deadline is not None and time.perf_counter() > deadline:
                    break
                if not order:
                    # drawn replies apart from greedy ones: a batch of greedy rows draws no noise
                    order = sorted(todo[:window], key=lambda i: (bool(temperatures and temperatures[i] > 0),
                                                                 len(prompts[i])))
                    del todo[:window]
                batch = self._take_batch(order, prompts, limits, per_token)
                got = reply_batch(self.model, [prompts[i] for i in batch], [limits[i] for i in batch],
                                  self.eos_ids, progress, [temperatures[i] for i in batch] if temperatures else None,
                                  seed=seed * 100003 + batches)
                batches += 1
                replies.update(zip(batch, got))
        except KeyboardInterrupt:  # Ctrl+C: the finished replies go with it, to be kept
            from speculative.train.reply_cache import GenerationStopped

            raise GenerationStopped(self._sequences(prompts, replies)) from None
        finally:
            if bar is not None:
                bar.close()
        return self._sequences(prompts, replies)

    @staticmethod
    def _sequences(prompts: list[list[int]], replies: dict[int, list[int]]) -> list[Sequence]:
        return [Sequence(list(prompts[i]) + replies[i], response_start=len(prompts[i]))
                for i in range(len(prompts)) if i in replies]

    def _take_batch(self, order: list[int], prompts, limits, per_token: int) -> list[int]:
        """Pops the next batch off `order` (ascending length): as many prompts as fit gen_batch
        and, K/V for longest prompt + longest reply per row, gen_kv_bytes (always at least one)."""
        n, longest, most = 0, 0, 0
        while n < min(len(order), self.gen_batch):
            i = order[n]
            cols = max(longest, len(prompts[i])) + max(most, limits[i])
            if n and (n + 1) * cols * per_token > self.gen_kv_bytes:
                break
            longest, most = max(longest, len(prompts[i])), max(most, limits[i])
            n += 1
        batch = order[:n]
        del order[:n]
        return batch

    def check_speculator(self, folder, prompts: list[list[dict]], k: int, max_tokens: int) -> dict:
        """Loads the saved head as the engine would and decodes held-out prompts greedily with and
        without it: mean accepted length (tokens per verify step) and whether outputs agree."""
        from engine.engine import Engine
        from engine.types import SamplingParams

        from speculative.build import build_speculator

        # The same weights with the batch-invariant kernels a draft's verify steps need (features and
        # generation keep the fast ones).
        options = dataclasses.replace(self.model.ops.options, batch_invariant=True)
        runner = ModelRunner(self.model.with_options(options), self.max_len)
        spec = build_speculator(folder, runner, self.config, k, "the target")
        runner.capture([1, spec.k + 1])  # no-op on CPU
        if self.device.type == "cuda":
            spec.capture()
        engine = Engine(runner, self.tokenizer, "target", spec, "trained head")
        params = SamplingParams(max_tokens=max_tokens)
        try:
            identical, steps, tokens, plain_s, spec_s = 0, 0, 0, 0.0, 0.0
            for msgs in prompts:
                engine.reset()
                plain = engine.generate(msgs, params, speculative=False)
                engine.reset()
                fast = engine.generate(msgs, params, speculative=True)
                identical += plain.token_ids == fast.token_ids
                steps += fast.stats.verify_steps
                tokens += fast.stats.accept_len_mean * fast.stats.verify_steps
                plain_s += plain.stats.decode_s
                spec_s += fast.stats.decode_s
        finally:
            engine.reset()
        return {"prompts": len(prompts), "k": k, "max_tokens": max_tokens,
                "accept_len_mean": tokens / max(steps, 1), "identical": identical,
                "plain_decode_s": round(plain_s, 3), "spec_decode_s": round(spec_s, 3)}
