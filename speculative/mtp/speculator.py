"""MTPSpeculator: S chained MTP steps draft S tokens, one target forward verifies them.

Alignment (j: a position, t_j: the token there, h_j: the target's post-norm state there):
layer s at position j reads t_{j+s+1} and x^s_j, where x^0_j = h_j and x^{s+1}_j is layer s's
output at j (chain) or h_j (non-chain), and predicts t_{j+s+2}.

One iteration, with the target holding K/V for 0..n-1 and t_n the bonus token:
  verify  [t_n, d_1..d_S] at n..n+S in one target forward -> accept a drafts, next token t_{n+a+1}
  window  every layer s runs over the same W = 2S rows, positions n-S+1 .. n+S:
          row r (position j) reads t_{j+s+1}: the ids are [kept t_{n-S+2}..t_n, d_1..d_a,
          next token, ...] for s = 0 and are rotated up one row per step, with step s's draft
          put at row a+S-1 (position n+a, the last accepted one). That row of step s predicts
          t_{n+a+s+2}: step s drafts d'_{s+1}. Rows after it are scratch.
Why 2S rows and not S+1: layer s's entries at positions n+a-s+1 .. n+a read draft tokens, so
they are provisional; the next window starts S-1 rows before its bonus position and rewrites
them with the tokens the target accepted. Layer s's K/V thus always matches the accepted text.
"""

from __future__ import annotations

from typing import Iterator

import torch

from engine.forward_batch import ForwardBatch
from engine.kv_cache import KVCache
from engine.rope import rope_cos_sin
from engine.decode import choose_next, plain_steps
from engine.sampling import probabilities, sample_from

from speculative.commit import commit
from speculative.iterations import run_iterations
from speculative.mtp.graphs import MTPWindow
from speculative.mtp.greedy_loop import MTPGreedyIteration
from speculative.mtp.model import MTPDraft
from speculative.verify import accept_drafts


class MTPSpeculator:
    """The MTP Speculator (protocol.py): one step-by-step loop for every kind of sampling."""

    def __init__(self, draft: MTPDraft, runner, draft_steps: int, accept=None):
        """accept: the verify rule, with verify.accept_drafts's signature; None: accept_drafts,
        the lossless rule (speculative/testing.py has one that fixes the accepted length)."""
        mc = draft.config
        self.draft = draft
        self.config = mc
        self.k = min(draft_steps, mc.num_layers)  # S: step s runs physical layer s
        self.runner = runner
        target = runner.model
        self.embed, self.lm_head = target.model.embed_tokens, target.lm_head
        # The target's RoPE; its table is shared unless the layers' head_dim differs.
        same = mc.head_dim == runner.config.head_dim
        self.cos_sin = target.cos_sin if same else rope_cos_sin(
            mc.layer_config(runner.config), runner.max_len).to(runner.device)
        self.kvs = [KVCache(1, runner.max_len, mc.num_kv_heads, mc.head_dim, runner.dtype, runner.device)
                    for _ in range(self.k)]  # one cache per physical layer
        self.window = MTPWindow(draft, self.k, self.embed, self.lm_head, self.cos_sin, self.kvs,
                                runner.dtype, runner.device)
        self._seq: list[int] = []  # tokens the draft caches were built from (bonus included)
        self.vocab_size = runner.config.vocab_size
        self.accept = accept or accept_drafts
        # Greedy answers with the lossless rule run whole iterations (greedy_loop.py): on a GPU
        # one graph an iteration where it captures (KernelOptions.mtp_graph), else this loop; on
        # a CPU the same body eagerly.
        self.whole_iterations = accept is None
        self.greedy = MTPGreedyIteration(self.window, runner)

    # --- the facade's hooks -------------------------------------------------------------
    def reusable_prefix(self, target_cached: list[int], prompt: list[int]) -> int:
        """Positions whose target K/V and every layer's entries stay valid for this prompt.
        Layer S-1's entry at j reads tokens up to j + S, so it survives if those all match."""
        m, limit = 0, min(len(target_cached), len(self._seq), len(prompt))
        while m < limit and target_cached[m] == prompt[m] == self._seq[m]:
            m += 1
        self._seq = []
        return max(0, m - self.k)

    def capture(self, defer: bool = False) -> None:
        """Captures the verify and window graphs and the greedy whole-iteration graph now;
        `defer` is for the EAGLE-3 speculator's graphs alone (these are captured at load either
        way, before any conversation, so the iteration's warm-ups write over nothing live)."""
        self.runner.capture([self.k + 1])
        self.window.capture()
        if self.whole_iterations and self.runner.model.ops.options.mtp_graph:
            self.greedy.capture()

    def tokens(self, runner, state) -> Iterator[list[int]]:
        S, dev = self.k, runner.device
        start = state.kv_len
        new = torch.tensor(state.tokens[start:], dtype=torch.long, device=dev)
        logits, hidden, _ = runner.forward(new, start, all_logits=False)
        states = [hidden.clone()]  # target states of positions start .. kv_len - 1
        state.kv_len = len(state.tokens)
        yield [choose_next(logits[-1], state)]
        while state.kv_len < S:  # the first window needs S positions before the bonus token
            n = state.kv_len
            logits, hidden, _ = runner.forward(torch.tensor([state.tokens[n]], device=dev), n)
            states.append(hidden.clone())
            state.kv_len = n + 1
            yield [choose_next(logits[-1], state)]
        P = state.kv_len
        if P + S + 1 > runner.max_len:
            yield from plain_steps(runner, state)
            return
        drafts, q = self._prefill(state, start, torch.cat(states))
        if self._whole(state):
            self.greedy.begin(P, state.tokens[P], drafts)
            yield from run_iterations(runner, state, self.greedy, S, self._commit)
            return
        while True:
            n = state.kv_len
            if n + S + 1 > runner.max_len:
                yield from plain_steps(runner, state)
                return
            bonus = torch.tensor([state.tokens[n]], dtype=torch.long, device=dev)
            logits, hidden, _ = runner.forward(torch.cat([bonus, drafts]), n)
            accepted, next_token = self.accept(drafts, q, logits, state.params, state.seen, state.generator)
            rows = torch.arange(S + 1, device=dev)
            cur_ids = torch.where(rows < accepted, torch.cat([drafts, drafts[-1:]]), next_token)
            self.window.begin(n - S + 1, cur_ids, hidden, accepted)
            new_drafts, new_q = self._draft(state)
            a = int(accepted)  # the one host sync of the iteration
            out = commit(state, n, [a, int(next_token)] + drafts[:a].tolist())
            self._seq = state.tokens[:state.kv_len + 1]
            drafts, q = new_drafts, new_q
            yield out

    def _whole(self, state) -> bool:
        """Whether this answer runs whole iterations: greedy, no repetition penalty, the lossless
        rule, and on a GPU with graphs only through the captured graph (where none was captured,
        the step-by-step loop replays its graphs, faster than the iteration's eager body)."""
        if not (self.whole_iterations and state.params.is_greedy and state.seen is None):
            return False
        return self.greedy.graph is not None or self.window.graphs is None

    def _commit(self, result: list[int], n: int, state) -> tuple[list[int], int]:
        """commit() for the verify step at n, and the record of the tokens the layers' caches
        hold. Returns (the new tokens, the cache length after them)."""
        out = commit(state, n, result)
        self._seq = state.tokens[:state.kv_len + 1]
        return out, state.kv_len

    # --- pieces ---------------------------------------------------------------------------
    def _prefill(self, state, start: int, states: torch.Tensor):
        """Fills every layer's cache for positions start .. P-S-1 (all their tokens are known),
        then runs the first window as if a verify at P-1 had accepted no drafts. states: target
        states of positions start .. P-1. Returns the first drafts."""
        S, dev, tok = self.k, self.runner.device, state.tokens
        P = state.kv_len
        T = P - S - start
        if T > 0:
            x = states[:T]
            for s in range(S):
                ids = torch.tensor(tok[start + s + 1:start + s + 1 + T], dtype=torch.long, device=dev)
                batch = ForwardBatch.eager(ids, start)
                passed, _ = self.draft.step(s, ids, x, batch, self.embed, self.kvs[s], self.cos_sin)
                if self.config.chain:
                    x = passed
        w = self.window
        w.tail_ids.copy_(torch.tensor(tok[P - S + 1:P], dtype=torch.long, device=dev))
        w.tail_hidden.copy_(states[P - S - start:P - 1 - start])
        cur_ids = torch.full((S + 1,), tok[P], dtype=torch.long, device=dev)
        cur_states = torch.cat([states[P - 1 - start:P - start], states.new_zeros(S, states.shape[1])])
        w.begin(P - S, cur_ids, cur_states, torch.zeros((), dtype=torch.long, device=dev))
        self._seq = tok[:P + 1]
        return self._draft(state)

    def _draft(self, state):
        """Runs the S steps over the written window. Returns (drafts (S,) target ids,
        draft probabilities (S, V) when sampling, else None). No host sync."""
        p = state.params
        tokens, probs = [], []
        for s in range(self.k):
            logits = self.window.run(s)[0]
            if p.is_greedy:
                tok = logits.argmax().view(1)
            else:
                q = probabilities(logits, p)
                tok = sample_from(q, state.generator).view(1)
                probs.append(q)
            tokens.append(tok)
            if s < self.k - 1:
                self.window.push_draft(tok)
        return torch.cat(tokens), (torch.stack(probs) if probs else None)
