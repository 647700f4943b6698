"""ChainState: the device state of a greedy draft chain, which greedy_verify reads and moves on."""

from __future__ import annotations

import torch

from speculative.kernels.draft_pick import MAX_ALTS


class ChainState:
    """The device state of a greedy draft chain that greedy_verify reads and moves on.

    ids (k+1+sum(alts),): [bonus, d_1..d_k, then alts[i] alternatives for d_(i+1), for each i]: the
    token at position n, the k drafts after it, and the draft's next-best tokens in place of drafts
    (verify rows of their own, at the draft's position, with their K/V in the rows after the
    chain's: cache row n + row index). n (): the cache length before the verify. greedy_verify
    writes result (k+2,) [accepted a, next token, the a accepted drafts, then the rest of
    d_1..d_k], window (k+1,) (the draft-extend's tokens: the accepted ones, then the next token),
    accepted (), n += a + 1, ids[0] = the next token, and draft_pos (k+1,): min(n + i, last_pos),
    where the next chain's draft steps write. With alternatives also state_rows (k+1,), the
    verify row whose target state each extend row takes, and kv_move (2,): [from, to], the cache
    row the accepted alternative's K/V must move to its position from (from == to: none)."""

    def __init__(self, k: int, last_pos: int, device, alts: int | tuple[int, ...] = 0):
        long = dict(dtype=torch.long, device=device)
        alts = (alts,) * k if isinstance(alts, int) else tuple(alts)
        assert len(alts) == k and all(0 <= m <= MAX_ALTS for m in alts), alts
        self.k, self.last_pos, self.alts = k, last_pos, alts
        self.num_alts = sum(alts)
        self.rows = k + 1 + self.num_alts  # verify rows
        self.ids = torch.zeros(self.rows, **long)
        self.n = torch.zeros((), **long)
        self.result = torch.zeros(k + 2, **long)
        self.window = torch.zeros(k + 1, **long)
        self.accepted = torch.zeros((), **long)
        self.draft_pos = torch.zeros(k + 1, **long)
        self.offsets = torch.arange(k + 1, **long)
        # verify row i sits at position n + row_pos[i] and writes cache row n + i
        self.alt_draft = torch.tensor([i for i, m in enumerate(alts) for _ in range(m)], **long)  # draft index - 1
        self.row_pos = torch.cat([self.offsets, self.alt_draft + 1])
        self.row_slots = torch.arange(self.rows, **long)
        self.state_rows = torch.arange(k + 1, **long)
        self.kv_move = torch.zeros(2, **long)
        self._choice = torch.zeros(self.rows, **long)
        self._counter = torch.zeros(1, dtype=torch.int32, device=device)

    def alt_slots(self, s: int) -> torch.Tensor:
        """The ids where draft s + 1's alternatives go (empty: it has none)."""
        start = self.k + 1 + sum(self.alts[:s])
        return self.ids[start:start + self.alts[s]]

    def advance(self, a: torch.Tensor, nxt: torch.Tensor, drafts: torch.Tensor | None = None) -> None:
        """greedy_verify's writes in torch ops, for an accepted count a () and next token nxt ()
        decided elsewhere (the reference, and the sampled loop's rejection sampling); all but
        `accepted`, which only greedy_verify's callers read. drafts: the k proposed tokens as
        accepted (d_1..d_k, with an accepted alternative in its draft's place)."""
        drafts = self.ids[1:self.k + 1] if drafts is None else drafts
        self.result[0].copy_(a)
        self.result[1].copy_(nxt)
        self.result[2:].copy_(drafts)
        self.window.copy_(torch.where(self.offsets < a, torch.cat([drafts, drafts[-1:]]), nxt))
        self.n.add_(a + 1)
        self.ids[0].copy_(nxt)
        self.place_drafts()

    def advance_alternative(self, a: torch.Tensor, nxt: torch.Tensor, has: torch.Tensor,
                            row: torch.Tensor) -> torch.Tensor:
        """advance() after the first a drafts, where verify row `row` (an alternative for draft
        a + 1) was accepted too if `has` (bool ()): it takes that draft's place, its K/V moves from
        its own cache row to its position (kv_move) and its state goes to extend row a + 1
        (state_rows). Also sets `accepted`; returns the accepted count (a, or a + 1)."""
        k = self.k
        alt_tok = self.ids.index_select(0, row.view(1))[0]
        self.state_rows.copy_(torch.where(has & (self.offsets == a + 1), row, self.offsets))
        self.kv_move.copy_(self.n + torch.stack([torch.where(has, row, a + 1), a + 1]))
        drafts = torch.where(has & (self.offsets[:k] == a), alt_tok, self.ids[1:k + 1])
        a = a + has.to(a.dtype)
        self.accepted.copy_(a)
        self.advance(a, nxt, drafts)
        return a

    def place_drafts(self) -> None:
        """draft_pos = min(n + i, last_pos): where the draft steps of the chain after the bonus
        token at n write."""
        torch.add(self.offsets, self.n, out=self.draft_pos)
        self.draft_pos.clamp_(max=self.last_pos)

