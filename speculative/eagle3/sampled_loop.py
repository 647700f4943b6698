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

On a GPU, sampling with temperature alone draws each draft and runs the acceptance in a few
launches (speculative/kernels/sampled_pick.py); the cuts, and the CPU, take the same rule in
torch ops (its *_ref functions), over the draft's vocabulary either way.

State carried between replays, on the device:
    n      () the target cache length before this iteration's verify
    ids    (k+1,) [bonus, d_1..d_k]; with runners-up (2k+1,), then each draft's runner-up
    q      (k, Dv) the draft distributions d_1..d_k were drawn from, over the draft's vocabulary
Each replay writes `result` = [accepted a, the next token, d_1..d_k as verified].
"""

from __future__ import annotations

from functools import partial

import torch

from engine.graphs import capture
from engine.sampling import SamplingTensors, filtered, probabilities_t
from speculative.kernels.alternative import take_alternative, take_alternative_ref
from speculative.kernels.sampled_pick import draft_sample, draw_from, sampled_accept, sampled_accept_ref

from speculative.eagle3.draft_parts import DraftParts
from speculative.eagle3.greedy_loop import WholeIteration


def supports(params, state) -> bool:
    """Whether a request's sampling is what this iteration computes."""
    return not params.is_greedy and params.repetition_penalty == 1.0 and state.seen is None


class SampledIteration(WholeIteration):
    def __init__(self, parts: DraftParts, runner, runners_up: bool = False):
        """runners_up: each draft's verify step checks the draft's runner-up too (the race's second
        place, a draw from q without the draft), kept by a second rejection-sampling round where
        the draft is refused (sampled_accept_ref); k more verify rows."""
        super().__init__(parts, runner, (1 if runners_up else 0,) * parts.k)
        self.runners_up = runners_up
        k, dev, V = parts.k, runner.device, runner.config.vocab_size
        d2t = parts.draft.d2t
        Dv = d2t.shape[0]
        self.q = torch.zeros(k, Dv, dtype=torch.float32, device=dev)
        self.params = SamplingTensors(dev)
        self.cut = False  # the request has top-k, top-p or min-p: the graph with the sorting pass
        self.u = torch.zeros(k, dtype=torch.float32, device=dev)
        self.e_residual = torch.ones(V, dtype=torch.float32, device=dev)
        self.e_drafts = torch.ones(k, Dv, dtype=torch.float32, device=dev)
        self.d2t = d2t
        self.targets = d2t + torch.arange(Dv, device=dev)  # draft id -> target id
        self.to_draft = torch.full((V,), -1, dtype=torch.int32, device=dev)  # target id -> draft id
        self.to_draft[self.targets] = torch.arange(Dv, dtype=torch.int32, device=dev)
        self.u_alt = torch.zeros(k, dtype=torch.float32, device=dev)
        # [accepted, next token] and, with runners-up, whether the last accepted is one
        self.verdict = torch.zeros(3 if runners_up else 2, dtype=torch.int64, device=dev)
        # The fused launches (a GPU's, with the lean draft's kernels); torch ops otherwise.
        self.fused = dev.type == "cuda" and parts.draft.lean
        self.pdl = self.fused and parts.draft.ops.options.pdl
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
        self.u_alt.fill_(0.5)
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
        distributions they were drawn from ((k, V), over the target's vocabulary), and the
        request's generator."""
        self.n.fill_(n)
        self.ids[0] = bonus
        self.ids[1:self.k + 1].copy_(drafts)
        self.q.copy_(q.index_select(1, self.targets))
        self.generator = generator
        if self.runners_up:  # each draft's runner-up: a race over q without the draft
            score = q / torch.empty_like(q).exponential_(generator=generator)
            score.scatter_(1, drafts.view(-1, 1), -1.0)
            self.ids[self.k + 1:].copy_(score.argmax(1))

    def _prepare(self) -> None:
        # Stream-ordered: these land after the previous replay has read the last draws.
        g = self.generator
        self.u.uniform_(generator=g)
        self.e_residual.exponential_(generator=g)
        self.e_drafts.exponential_(generator=g)
        if self.runners_up:
            self.u_alt.uniform_(generator=g)

    # --- the device side --------------------------------------------------------------------
    def _body(self, n: int | None = None) -> None:
        out = self._verify(n)
        k, fused = self.k, self.fused and not self.cut
        drafts = self.ids[1:k + 1]
        alts, u_alt = (self.ids[k + 1:], self.u_alt) if self.runners_up else (None, None)
        logits = self.runner.model.logits(out.hidden, fp32=not fused)  # the kernels read bf16 as it is
        # The fused acceptance also moves the chain on (one launch for ChainState.advance's dozen
        # torch ops), except with runners-up, whose move depends on which was kept.
        moved = fused and not self.runners_up
        if fused:
            sampled_accept(logits, self.params.temperature, drafts, self.q, self.to_draft, self.u, self.e_residual,
                           self.verdict, alts, u_alt, pdl=self.pdl, chain=self.chain if moved else None)
        else:
            sampled_accept_ref(probabilities_t(logits, self.params, self.cut), drafts, self.q, self.to_draft,
                               self.targets, self.u, self.e_residual, self.verdict, alts, u_alt)
        # The fused draws read the lean draft's logits in its weights' dtype, as they are (an fp32
        # copy would hold the same values and cost a launch a draft step); the cuts' torch ops
        # and the CPU take them in fp32.
        if self.runners_up:
            d_logits, d_hidden, n_next = self._extend_runner_up(out, n, fp32_logits=not fused)
        else:
            d_logits, d_hidden, n_next = self._extend(out, self.verdict[0], self.verdict[1], n, fp32_logits=not fused,
                                                      moved=moved)
        for s in range(k):
            tok = self.ids[s + 1:s + 2]  # the draw goes straight into the chain's ids
            alt = self.chain.alt_slots(s) if self.runners_up else None
            if fused:
                draft_sample(d_logits[-1], self.params.temperature, self.e_drafts[s], self.d2t, self.q[s], tok, alt,
                             pdl=self.pdl)
            else:
                self.q[s].copy_(probabilities_t(d_logits[-1:], self.params, self.cut)[0])
                draw_from(self.q[s], self.e_drafts[s], self.d2t, tok, alt)
            if s < k - 1:
                d_logits, d_hidden = self._draft_step(tok, s, d_hidden, n_next, fp32_logits=not fused)

    def _extend_runner_up(self, out, n: int | None, fp32_logits: bool = True):
        """_extend where the last accepted token may be a runner-up (verdict[2]): it takes its
        draft's place in the accepted drafts, its K/V moves from its own cache row to its
        position, and its verify row's state goes into the draft-extend's window."""
        parts, chain, k = self.parts, self.chain, self.k
        took = self.verdict[2].bool()
        before = self.verdict[0] - self.verdict[2]  # the chain's drafts kept before a runner-up
        # draft i + 1's runner-up is verify row k + 1 + i
        a = chain.advance_alternative(before, self.verdict[1], took, k + 1 + before.clamp(max=k - 1))
        states = parts.target_states(out.aux_hidden, out.hidden)
        kv = self.runner.kv
        window_states = states.new_empty(k + 1, states.shape[1])
        move = partial(take_alternative, pdl=self.pdl) if self.fused else take_alternative_ref
        states = move(kv.k_all, kv.v_all, chain.kv_move, states, chain.state_rows, window_states)
        logits, hidden = parts.draft(chain.window, self.positions[:k + 1], states, True, parts.embed, parts.kv,
                                     start_pos=n, last=a, fp32_logits=fp32_logits)
        return logits, hidden, None if n is None else n + int(a) + 1
