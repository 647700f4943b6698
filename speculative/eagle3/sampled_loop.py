"""SampledIteration: one whole EAGLE-3 iteration with sampling (verify, speculative sampling,
draft-extend, the next k sampled drafts) over static device buffers, captured as one CUDA graph:
the sampled counterpart of GreedyIteration (greedy_loop.py).

It serves sampling with temperature, top-k, top-p and min-p (a repetition penalty keeps the
step-by-step loop in speculator.py). The parameters live in device tensors (SamplingTensors), so
one graph serves every value; there are two graphs, one for temperature alone and one with the
sorting pass the cuts need (engine/sampling.probabilities_t). A graph holds no random number
generator: before each replay the host fills
static buffers from the request's generator (uniforms for the acceptance tests, Exp(1) variates
for the residual draw and for the k draft draws), so with a seed the graph and the eager body
produce the same tokens. Each graph is captured on first use, with its warm-up runs writing
only at the end of the caches, and kept only if one replay equals the eager body (see capture());
otherwise speculator.py keeps its step-by-step loop for that kind of sampling.

State carried between replays, on the device:
    n      () the target cache length before this iteration's verify
    ids    (k+1,) [bonus, d_1..d_k]
    q      (k, V) the draft distributions d_1..d_k were drawn from (over the target vocabulary)
Each replay writes `result` = [accepted a, the next token, d_1..d_k as verified].
"""

from __future__ import annotations

import torch

from engine.graphs import capture
from engine.sampling import SamplingTensors, filtered, probabilities_t

from speculative.eagle3.draft_parts import DraftParts
from speculative.eagle3.greedy_loop import WholeIteration


def supports(params, state) -> bool:
    """Whether a request's sampling is what this iteration computes."""
    return not params.is_greedy and params.repetition_penalty == 1.0 and state.seen is None


def accept_with_draws(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, u: torch.Tensor,
                      e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """verify.rejection_accept with its random numbers given (u: (k,) uniforms, e: (V,) Exp(1))
    and no host sync (graph-safe indexing). drafts (k,), q (k, V) draft, p (k+1, V) target."""
    k = drafts.shape[0]
    rows = torch.arange(k, device=drafts.device)
    keep = (u * q[rows, drafts] < p[rows, drafts]).to(torch.int64)
    accepted = keep.cumprod(0).sum().view(1)
    padded_q = torch.cat([q, torch.zeros_like(q[:1])], dim=0)
    target = p.index_select(0, accepted)[0]
    residual = (target - padded_q.index_select(0, accepted)[0]).clamp_min(0)
    mass = residual.sum()
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), target)
    return accepted[0], (residual / e).argmax()


class SampledIteration(WholeIteration):
    def __init__(self, parts: DraftParts, runner):
        super().__init__(parts, runner)
        k, dev, V = parts.k, runner.device, runner.config.vocab_size
        self.q = torch.zeros(k, V, dtype=torch.float32, device=dev)
        self.params = SamplingTensors(dev)
        self.cut = False  # the request has top-k, top-p or min-p: the graph with the sorting pass
        self.u = torch.zeros(k, dtype=torch.float32, device=dev)
        self.e_residual = torch.ones(V, dtype=torch.float32, device=dev)
        self.e_drafts = torch.ones(k, V, dtype=torch.float32, device=dev)
        self.draft_rows = torch.arange(parts.draft.d2t.shape[0], device=dev)
        self.generator: torch.Generator | None = None
        self.graphs: dict[bool, torch.cuda.CUDAGraph | None] = {False: None, True: None}
        self._capture_failed = {False: False, True: False}

    @property
    def graph(self):
        """The captured graph for the selected request's kind of sampling, or None (eager)."""
        return self.graphs[self.cut]

    def select(self, params) -> None:
        """Takes a request's sampling parameters (before capture() and start())."""
        self.cut = filtered(params)
        self.params.set(params, self.runner.config.vocab_size)

    # --- the host side ------------------------------------------------------------------------
    def capture(self, kv_len: int) -> bool:
        """Captures the selected kind's graph (CUDA, once). Its warm-up runs execute the body for
        real, so they run at the end of the caches, past anything valid (kv_len: the live
        conversation's cache length). Returns whether a graph is ready."""
        cut = self.cut
        if self.graphs[cut] is not None:
            return True
        if self.runner.device.type != "cuda" or self._capture_failed[cut] or not self.fits_capture(kv_len):
            return False
        self.n.fill_(self.scratch())
        try:
            with torch.inference_mode():
                self.graphs[cut], _ = capture(self._body, torch.cuda.graph_pool_handle())
                ok = self._replay_equals_eager()
        except RuntimeError:  # out of memory, or an op that cannot be captured
            ok = False
        if not ok:  # the caller keeps the step-by-step loop for this kind of sampling
            self._capture_failed[cut] = True
            self.graphs[cut] = None
        return ok

    def _replay_equals_eager(self) -> bool:
        """One replay against one eager run of the body from the same state and draws (the
        warm-ups left a valid state at the caches' end): a graph that computes anything else
        is never used."""
        self.u.fill_(0.5)
        self.e_residual.fill_(1.0)
        self.e_drafts.fill_(1.0)
        state = [t.clone() for t in (self.n, self.ids, self.q)]
        self.graph.replay()
        replayed = [t.clone() for t in (self.result, self.n, self.ids, self.q)]
        for t, saved in zip((self.n, self.ids, self.q), state):
            t.copy_(saved)
        self._body(int(self.n))
        eager = (self.result, self.n, self.ids, self.q)
        return all(torch.equal(a, b) for a, b in zip(replayed, eager))

    def start(self, n: int, bonus: int, drafts: torch.Tensor, q: torch.Tensor, generator: torch.Generator) -> None:
        """The first iteration's inputs: the bonus token at n, the k drafts after it, the
        distributions they were drawn from, and the request's generator."""
        self.n.fill_(n)
        self.ids[0] = bonus
        self.ids[1:].copy_(drafts)
        self.q.copy_(q)
        self.generator = generator

    def _prepare(self) -> None:
        # Stream-ordered: these land after the previous replay has read the last draws.
        g = self.generator
        self.u.uniform_(generator=g)
        self.e_residual.exponential_(generator=g)
        self.e_drafts.exponential_(generator=g)

    # --- the device side --------------------------------------------------------------------
    def _body(self, n: int | None = None) -> None:
        out = self._verify(n)
        p = probabilities_t(self.runner.model.logits(out.hidden), self.params, self.cut)
        accepted, next_token = accept_with_draws(self.ids[1:], self.q, p, self.u, self.e_residual)
        d_logits, d_hidden, n_next = self._extend(out, accepted, next_token, n)
        targets = self.parts.draft.d2t + self.draft_rows  # draft id -> target id
        for s in range(self.k):
            qd = probabilities_t(d_logits[-1:], self.params, self.cut)[0]  # over the draft vocabulary
            q = self.q[s]
            q.zero_()
            q.index_add_(0, targets, qd)
            tok = (q / self.e_drafts[s]).argmax().view(1)  # a draw from q (exponential race)
            self.ids[s + 1].copy_(tok[0])
            if s < self.k - 1:
                d_logits, d_hidden = self._draft_step(tok, s, d_hidden, n_next)
