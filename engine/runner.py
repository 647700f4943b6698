"""ModelRunner: owns the target model, its KV cache and its captured graphs; runs forwards."""

from __future__ import annotations

import torch

from engine.forward_batch import ForwardBatch
from engine.graphs import CapturedStep
from engine.kv_cache import KVCache
from engine.model import CausalLM


class ModelRunner:
    def __init__(self, model: CausalLM, max_len: int):
        cfg = model.config
        self.model = model
        self.config = cfg
        self.device = model.model.norm.weight.device  # (embeddings and lm_head may be packed)
        self.dtype = model.model.norm.weight.dtype
        self.max_len = max_len
        self.kv = KVCache(cfg.num_layers, max_len, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device)
        self.aux_layer_ids: tuple[int, ...] = ()  # set by a speculative decoder that needs them
        self.graphs: dict[int, CapturedStep] = {}
        self._deferred: set[int] = set()  # token counts captured on first use

    @property
    def uses_graphs(self) -> bool:
        return bool(self.graphs or self._deferred)

    def defer(self, token_counts: list[int]) -> None:
        """Captures these graphs on first use instead of now (CUDA): a one-shot answer whose
        path never replays them (greedy speculation runs its own whole-iteration graph) does
        not wait for them before its first token."""
        if self.device.type == "cuda":
            self._deferred.update(n for n in token_counts if n not in self.graphs)

    def graph(self, num_tokens: int, start_pos: int) -> CapturedStep | None:
        """The graph for num_tokens new tokens at start_pos, capturing a deferred one now. A
        capture's warm-up runs write K/V near the end of the cache (CapturedStep), so it needs
        the live tokens to end before that; otherwise None (the caller runs eagerly)."""
        step = self.graphs.get(num_tokens)
        if step is None and num_tokens in self._deferred \
                and start_pos + num_tokens <= CapturedStep.scratch_start(self.max_len, num_tokens):
            self.capture([num_tokens])
            step = self.graphs.get(num_tokens)
        return step

    @torch.inference_mode()
    def capture(self, token_counts: list[int]) -> None:
        """Captures one graph per token count (1 for decode, k+1 for verify). CUDA only."""
        if self.device.type != "cuda":
            return
        pool = torch.cuda.graph_pool_handle()
        for n in token_counts:
            self._deferred.discard(n)
            if n not in self.graphs:
                aux = self.aux_layer_ids if n > 1 else ()
                self.graphs[n] = CapturedStep(self.model, self.kv, n, aux, pool)
        torch.cuda.synchronize()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, start_pos: int, want_aux: bool = False,
                all_logits: bool = True):
        """Runs T tokens at positions start_pos.. and writes their K/V.

        Returns (logits (T or 1, V) fp32, hidden (T, H), aux_hidden (T, A) or None).
        A captured graph is used when one exists for T; its outputs are overwritten by the
        next replay. Aux states from a decode graph (T == 1) are not captured.
        """
        T = input_ids.shape[0]
        step = self.graph(T, start_pos)
        if step is not None and (not want_aux or step.aux_hidden is not None):
            return step.replay(input_ids, start_pos)
        out = self.model(ForwardBatch.eager(input_ids, start_pos), self.kv,
                         self.aux_layer_ids if want_aux else ())
        hidden = out.hidden if all_logits else out.hidden[-1:]
        return self.model.logits(hidden), out.hidden, out.aux_hidden
