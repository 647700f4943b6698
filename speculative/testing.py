"""Heads for tests and benchmarks: forced acceptance, and a random EAGLE-3 head built as a real one is."""

from __future__ import annotations

import torch

from speculative.build import new_eagle3_draft
from speculative.eagle3.config import DraftConfig
from speculative.eagle3.model import Eagle3Draft
from speculative.eagle3.speculator import Eagle3Speculator


def forced_acceptance(accept_len: int):
    """A verify rule with verify.accept_drafts's signature that accepts the first accept_len - 1
    drafts whatever they are, then takes the target's greedy token after them. Not lossless: it
    fixes the tokens each verify step gives, so that a benchmark times the loop at an acceptance it
    chooses, on random weights that would accept nothing. Either speculator takes it (accept=)."""

    def accept(draft_tokens, draft_probs, logits, params, seen, generator):
        accepted = torch.tensor(accept_len - 1, device=draft_tokens.device)
        return accepted, logits.index_select(0, accepted.view(1))[0].argmax()

    return accept


def draft_acceptance_rate(mean: float, k: int) -> float:
    """The chance a that each draft is accepted, given the one before it was, for which a verify
    step of k drafts gives `mean` tokens on average: 1 + a + a^2 + ... + a^k = mean."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < mean else (lo, mid)
    return (lo + hi) / 2


def forced_profile(mean: float, k: int, device, seed: int = 0):
    """A verify rule like forced_acceptance whose steps give `mean` tokens on average with the
    spread of a real head: each draft is accepted with the chance draft_acceptance_rate(mean, k)
    if the one before it was (the leading run of a published EAGLE-3 head's acceptance), drawn on
    the device from a generator seeded once, so that a run repeats."""
    rate = draft_acceptance_rate(mean, k)
    gen = torch.Generator(device=device).manual_seed(seed)

    def accept(draft_tokens, draft_probs, logits, params, seen, generator):
        u = torch.rand(draft_tokens.shape[0], generator=gen, device=draft_tokens.device)
        accepted = (u < rate).to(torch.int64).cumprod(0).sum()
        return accepted, logits.index_select(0, accepted.view(1))[0].argmax()

    return accept


class ForcedDrafts:
    """Forced acceptance inside the greedy whole iteration (GreedyIteration.force), so that a
    benchmark times the graph a real head's greedy answers run, target kernels and all: after the
    verify forward, the verified drafts are rewritten so that the first `a` equal the target's
    choices and the next one does not (and no runner-up matches), and the iteration's own greedy
    acceptance then takes a drafts. a: accept_len - 1 for a whole accept_len; otherwise drawn per
    iteration as forced_profile draws it, from a table of uniform draws made once (seeded) and
    read by a counter on the device, so that the captured graph draws anew at every replay."""

    DRAWS = 4096

    def __init__(self, ids: torch.Tensor, k: int, accept_len: float, vocab_size: int, seed: int = 0):
        self.ids, self.k, self.vocab = ids, k, vocab_size
        if float(accept_len).is_integer():
            table = (torch.arange(k) >= int(accept_len) - 1).float().expand(self.DRAWS, k).contiguous()
            self.rate = 0.5
        else:
            table = torch.rand(self.DRAWS, k, generator=torch.Generator().manual_seed(seed))
            self.rate = draft_acceptance_rate(accept_len, k)
        self.table = table.to(ids.device)
        self.counter = torch.zeros(1, dtype=torch.long, device=ids.device)
        self.lane = torch.arange(k, device=ids.device)

    def __call__(self, logits: torch.Tensor) -> None:
        k = self.k
        u = self.table.index_select(0, self.counter)[0]
        self.counter.add_(1).remainder_(self.DRAWS)
        accepted = (u < self.rate).to(torch.int64).cumprod(0).sum()
        choice = logits[:k + 1].argmax(-1)
        self.ids[1:k + 1] = torch.where(self.lane < accepted, choice[:k], (choice[:k] + 1) % self.vocab)
        if self.ids.shape[0] > k + 1:  # runners-up: none equals the target's next token
            self.ids[k + 1:] = (choice.index_select(0, accepted.view(1)) + 1) % self.vocab


class ForcedEagle3Speculator(Eagle3Speculator):
    """An Eagle3Speculator whose verify steps give accept_len tokens: each of them when accept_len
    is a whole number (forced_acceptance), on average otherwise (forced_profile); and what its loop
    costs in parts. Greedy answers run the whole-iteration graph (ForcedDrafts), as a real head's
    do; sampled ones and those with a penalty the step-by-step loop with the forced rule."""

    def __init__(self, draft: Eagle3Draft, runner, draft_steps: int, accept_len: float):
        if not 1 <= accept_len <= draft_steps + 1:
            raise ValueError(f"accept_len must be between 1 and k + 1 = {draft_steps + 1}, got {accept_len}")
        rule = (forced_acceptance(int(accept_len)) if float(accept_len).is_integer()
                else forced_profile(accept_len, draft_steps, runner.device))
        self.accept_len = accept_len
        super().__init__(draft, runner, draft_steps, accept=rule)
        self.whole_iterations = True  # greedy: the graph, forced by ForcedDrafts; sampling stays in the loop

    def _new_greedy(self, alts):
        it = super()._new_greedy(alts)
        it.force = ForcedDrafts(it.ids, self.k, self.accept_len, self._runner.config.vocab_size)
        return it

    def measure_components(self, runner, iters: int = 50) -> dict:
        """CUDA: mean ms of one verify, one draft decode step and one draft-extend (graph replays
        where captured, timed with CUDA events), and the loop's ideal tokens/s at accept_len."""
        dev = runner.device
        n = min(600, runner.max_len - self.k - 2)
        tok = torch.zeros(1, dtype=torch.long, device=dev)
        window = torch.zeros(self.k + 1, dtype=torch.long, device=dev)
        states = torch.zeros(self.k + 1, self.config.extend_width, dtype=runner.dtype, device=dev)
        hidden = torch.zeros(1, self.config.decode_width, dtype=runner.dtype, device=dev)
        last = torch.tensor(0, device=dev)
        steps = {
            "verify_ms": lambda: runner.forward(window, n, want_aux=True),
            "draft_step_ms": lambda: self._draft_step(tok, n, hidden),
            "extend_ms": lambda: self._extend(window, n, states, last),
        }
        out = {}
        for name, fn in steps.items():
            for _ in range(5):
                fn()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            out[name] = start.elapsed_time(end) / iters
        per_iter = out["verify_ms"] + (self.k - 1) * out["draft_step_ms"] + out["extend_ms"]
        out["ideal_iteration_ms"] = per_iter
        out["ideal_tok_s"] = self.accept_len / per_iter * 1000
        return out


def random_eagle3_config(target_cfg) -> DraftConfig:
    """The usual EAGLE-3 head for a target (SpecForge's): one layer of the target's widths, a
    32000-token draft vocabulary, and EAGLE-3's aux layers (2, L/2, L - 3), kept within the
    target's layers for the shallow models of tests."""
    L = target_cfg.num_layers
    return DraftConfig(
        format="sglang", hidden_size=target_cfg.hidden_size, target_hidden_size=target_cfg.hidden_size,
        intermediate_size=target_cfg.intermediate_size, num_heads=target_cfg.num_heads,
        num_kv_heads=target_cfg.num_kv_heads, head_dim=target_cfg.head_dim, vocab_size=target_cfg.vocab_size,
        draft_vocab_size=min(32000, target_cfg.vocab_size),
        aux_layer_ids=tuple(min(max(i, 0), L) for i in (2, L // 2, L - 3)), rope_theta=target_cfg.rope_theta)


def random_eagle3(runner, draft_steps: int, accept_len: float, seed: int = 1) -> ForcedEagle3Speculator:
    """A random_eagle3_config head for the runner's target, built as build_eagle3 builds a loaded
    one (new_eagle3_draft: the draft's kernels, on a target built with batch_invariant), its
    weights drawn from N(0, 0.02) with `seed` (the same head in every engine of a run), its verify
    steps giving accept_len tokens (ForcedEagle3Speculator)."""
    dc = random_eagle3_config(runner.config)
    draft = new_eagle3_draft(dc, runner, runner.config)  # d2t zero: draft id i is target id i
    gen = torch.Generator(device=runner.device).manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.02, generator=gen)
    return ForcedEagle3Speculator(draft.eval().requires_grad_(False), runner, draft_steps, accept_len)
