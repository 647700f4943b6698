"""SampledIteration: one whole EAGLE-3 iteration with temperature sampling (verify, speculative
sampling, draft-extend, the next k sampled drafts) over static device buffers, captured as one
CUDA graph: the sampled counterpart of GreedyIteration (greedy_loop.py).

It serves temperature-only sampling (no top-k, top-p, min-p or repetition penalty; those keep the
step-by-step loop in speculator.py). The temperature lives in a device tensor, so one graph serves
every temperature. A graph holds no random number generator: before each replay the host fills
static buffers from the request's generator (uniforms for the acceptance tests, Exp(1) variates
for the residual draw and for the k draft draws), so with a seed the graph and the eager body
produce the same tokens. The graph is captured on first use, with its warm-up runs writing only
at the end of the caches (see capture()).

State carried between replays, on the device:
    n      () the target cache length before this iteration's verify
    ids    (k+1,) [bonus, d_1..d_k]
    q      (k, V) the draft distributions d_1..d_k were drawn from (over the target vocabulary)
Each replay writes `result` = [accepted a, the next token, d_1..d_k as verified].
"""

from __future__ import annotations

import torch

from engine.batch import ForwardBatch
from engine.graphs import capture


def supports(params, state) -> bool:
    """Whether a request's sampling is what this iteration computes."""
    return (not params.is_greedy and params.top_k == 0 and params.top_p == 1.0 and params.min_p == 0.0
            and params.repetition_penalty == 1.0 and state.seen is None)


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


class SampledIteration:
    def __init__(self, spec, runner):
        self.spec, self.runner = spec, runner
        k, dev, V = spec.k, runner.device, runner.config.vocab_size
        self.k = k
        self.n = torch.zeros((), dtype=torch.long, device=dev)
        self.ids = torch.zeros(k + 1, dtype=torch.long, device=dev)
        self.q = torch.zeros(k, V, dtype=torch.float32, device=dev)
        self.temperature = torch.ones((), dtype=torch.float32, device=dev)
        self.u = torch.zeros(k, dtype=torch.float32, device=dev)
        self.e_residual = torch.ones(V, dtype=torch.float32, device=dev)
        self.e_drafts = torch.ones(k, V, dtype=torch.float32, device=dev)
        self.result = torch.zeros(k + 2, dtype=torch.long, device=dev)
        self.offsets = torch.arange(k + 1, dtype=torch.long, device=dev)
        self.positions = self.offsets.clone()
        self.last_pos = runner.max_len - 1
        self.draft_rows = torch.arange(spec.draft.d2t.shape[0], device=dev)
        self.generator: torch.Generator | None = None
        self.graph = None
        self.reader = None
        self._capture_failed = False

    # --- the host side ------------------------------------------------------------------------
    def capture(self, kv_len: int) -> bool:
        """Captures the graph (CUDA, once). Its warm-up runs execute the body for real, so they
        run at the end of the caches, past anything valid (kv_len: the live conversation's cache
        length). Returns whether a graph is ready."""
        if self.graph is not None:
            return True
        scratch = self.runner.max_len - 3 * (self.k + 1)
        if self.runner.device.type != "cuda" or self._capture_failed or kv_len + self.k + 1 >= scratch:
            return False
        self.n.fill_(scratch)
        try:
            with torch.inference_mode():
                self.graph, _ = capture(self._body, torch.cuda.graph_pool_handle())
        except RuntimeError:  # out of memory, or an op that cannot be captured: stay eager
            self._capture_failed = True
            self.graph = None
        return self.graph is not None

    def start(self, n: int, bonus: int, drafts: torch.Tensor, q: torch.Tensor, temperature: float,
              generator: torch.Generator | None) -> None:
        self.n.fill_(n)
        self.ids[0] = bonus
        self.ids[1:].copy_(drafts)
        self.q.copy_(q)
        self.temperature.fill_(temperature)
        self.generator = generator

    def _draw(self) -> None:
        g = self.generator
        self.u.uniform_(generator=g)
        self.e_residual.exponential_(generator=g)
        self.e_drafts.exponential_(generator=g)

    def queue(self) -> None:
        if self.reader is None:
            from engine.read_ahead import ReadAhead

            self.reader = ReadAhead(self.result)
        self.reader.queue(self._replay)

    def _replay(self) -> None:
        self._draw()  # stream-ordered: the draws land after the replay before this one has read them
        self.graph.replay()

    def take(self) -> list[int]:
        return self.reader.take()

    def drain(self) -> None:
        if self.reader is not None:
            self.reader.drain()

    @torch.inference_mode()
    def run(self) -> list[int]:
        """One iteration; returns [a, next_token, d_1..d_k] (syncs once)."""
        if self.graph is not None:
            self._replay()
        else:
            self._draw()
            self._body(int(self.n))
        return self.result.tolist()

    # --- the device side --------------------------------------------------------------------
    def _body(self, n: int | None = None) -> None:
        spec, runner, model, k = self.spec, self.runner, self.runner.model, self.k
        torch.add(self.offsets, self.n, out=self.positions)
        out = model(ForwardBatch(self.ids, self.positions, start_pos=n), runner.kv, runner.aux_layer_ids)
        p = torch.softmax(model.logits(out.hidden) / self.temperature, dim=-1)
        drafts = self.ids[1:]
        accepted, next_token = accept_with_draws(drafts, self.q, p, self.u, self.e_residual)
        self.result[0].copy_(accepted)
        self.result[1].copy_(next_token)
        self.result[2:].copy_(drafts)
        rows = self.offsets
        window = torch.where(rows < accepted, torch.cat([drafts, drafts[-1:]]), next_token)
        states = spec._target_states(out.aux_hidden, out.hidden)
        logits, hidden = spec.draft(window, self.positions, states, True, spec.embed, spec.kv, start_pos=n)
        d_logits, d_hidden = logits.index_select(0, accepted.view(1)), hidden.index_select(0, accepted.view(1))
        self.n.add_(accepted + 1)
        n_next = None if n is None else n + int(accepted) + 1
        self.ids[0].copy_(next_token)
        targets = spec.draft.d2t + self.draft_rows  # draft id -> target id
        for s in range(k):
            qd = torch.softmax(d_logits[-1] / self.temperature, dim=-1)
            q = self.q[s]
            q.zero_()
            q.index_add_(0, targets, qd)
            tok = (q / self.e_drafts[s]).argmax().view(1)  # a draw from q (exponential race)
            self.ids[s + 1].copy_(tok[0])
            if s < k - 1:
                pos = (self.n + s).clamp_max(self.last_pos).view(1)
                start = None if n_next is None else min(n_next + s, self.last_pos)
                d_logits, d_hidden = spec.draft(tok, pos, d_hidden, False, spec.embed, spec.kv, start_pos=start)
