"""Engine: the facade the app and the CLI use: load a model (and draft), stream answers, report stats."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Callable, Iterator

import torch

from engine import read_ahead
from engine.errors import UserError
from engine.options import KernelOptions, cpu_spec_setting
from engine.runner import ModelRunner
from engine.decode import DecodeState, choose_next, choose_token, plain_steps
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.types import ACCEPT_SPAN, GenerationResult, GenerationStats, SamplingParams, StreamEvent

Progress = Callable[[str, "float | None"], None]


class Engine:
    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, model_name: str, speculator=None,
                 draft_name: str | None = None):
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.draft_name = draft_name
        self.speculator = speculator  # a speculative.protocol.Speculator (EAGLE-3 or MTP), or None
        self.device = str(runner.device)
        self._kv_tokens: list[int] = []  # tokens whose K/V the target cache holds, in order
        self._no_draft: Engine | None = None  # without_draft(), once built
        self._pays: dict[bool, tuple[bool, str]] = {}  # speculation_pays() by sampled, once measured or read
        self._cpu_spec = cpu_spec_setting()  # read at load: a bad LOCALCHAT_CPU_SPEC stops the load in one line

    @property
    def has_draft(self) -> bool:
        return self.speculator is not None

    # Why speculation is not the default on a CPU where LOCALCHAT_CPU_SPEC=off asks not to measure
    # (engine/spec_pays.py): a verify step there costs the arithmetic of each of its rows, where a
    # GPU reads the weights once for all of them, so a draft pays on a CPU only if it accepts a lot.
    CPU_SPEC_REASON = "LOCALCHAT_CPU_SPEC=off"

    def speculation_pays(self, log: Callable[[str], None] | None = None, sampled: bool = False) -> tuple[bool, str]:
        """(whether speculation is the faster default here, and if not, why in a few words), for
        greedy answers or (sampled) answers drawn at a temperature. The caller may still ask for
        it: stream(speculative=True) always speculates with a draft. Measured against plain
        decoding without the draft the first time a model and draft meet this GPU or CPU, then
        read from the cache (engine/spec_pays.py; log tells of the measurement, a few seconds on a
        GPU, some more on a CPU); on a CPU with LOCALCHAT_CPU_SPEC=off, off without measuring."""
        if self.speculator is None:
            return False, "no draft"
        if self.runner.device.type == "cpu" and self._cpu_spec == "off":
            return False, self.CPU_SPEC_REASON
        if sampled not in self._pays:
            from engine import spec_pays

            self._pays[sampled] = spec_pays.verdict(self, spec_pays.draft_settings(self), log=log, sampled=sampled)
        return self._pays[sampled]

    @property
    def has_twin(self) -> bool:
        """Whether without_draft() has built its twin (and holds it)."""
        return self._no_draft is not None

    def drop_twin(self) -> None:
        """Lets go of without_draft()'s twin (its KV cache and graphs), built again if asked for."""
        if self._no_draft is not None:
            self._no_draft = None
            if self.runner.device.type == "cuda":
                torch.cuda.empty_cache()

    @classmethod
    def load(cls, model: str, draft: str | None = None, device: str | None = None,
             max_seq_len: int | None = None, draft_steps: int = 5, use_graphs: bool = True,
             on_progress: Progress | None = None, defer_capture: bool = False,
             threads: int | None = None, options: KernelOptions | None = None, tree=None) -> "Engine":
        """defer_capture: with a draft, no graph is captured at load. The target's own decode and
        verify graphs are captured on first use (a one-shot answer with greedy speculation never
        uses them), and an EAGLE-3 draft's graphs after the first request's first token (MTP
        layers' graphs are captured at load either way). threads: torch's CPU threads (default:
        on the CPU, the cores free now; engine/threads.py). options: the kernel switches
        (engine/options.py; None: from the environment).

        on_progress(text, fraction) is called between load phases and while a download runs, never
        inside a torch call: an exception it raises abandons the load at that point (the app stops a
        load this way when it quits). tree: a draft tree's shape (speculative/tree/shape.py:
        TreeShape), None for chains, "auto" for the calibrated one (set_tree)."""
        from engine.build import build_engine

        engine = build_engine(cls, model, draft, device, max_seq_len, draft_steps, use_graphs, on_progress,
                              defer_capture, threads, options)
        if tree is not None:
            engine.set_tree(tree, log=(lambda text: on_progress(text, None)) if on_progress else None)
        return engine

    def set_tree(self, shape, log=None) -> None:
        """Draft trees of `shape` (a TreeShape) from the next answer, or chains (None). Trees need an
        EAGLE-3 draft: anything else is a UserError. "auto": the shape that decodes fastest here,
        calibrated once per model, draft and GPU (speculative/tree/calibrate.py), for greedy
        answers (sampled ones keep the chain); chains where there is no EAGLE-3 head or on a CPU."""
        self._pays = {}  # measured again for the new shape when next asked
        sampled = True
        if shape == "auto":
            if self.speculator is None or not hasattr(self.speculator, "auto_tree"):
                return self.set_tree(None)
            # timed greedily: sampled answers keep the chain (Eagle3Speculator.set_tree)
            shape, sampled = self.speculator.auto_tree(self, log), False
        if shape is None:
            if hasattr(self.speculator, "set_tree"):
                self.speculator.set_tree(None)
            return
        if self.speculator is None or not hasattr(self.speculator, "set_tree"):
            what = "no draft is loaded" if self.speculator is None else "MTP layers draft chains only"
            raise UserError(f"--tree {shape} needs an EAGLE-3 draft head: {what}")
        self.speculator.set_tree(shape, sampled=sampled)

    def without_draft(self, if_fits: bool = False) -> "Engine | None":
        """This engine as a user gets it by unloading the draft, the baseline speculation is measured
        against: the same weight tensors (shared, not copied) under the kernels a target without a
        draft runs (no batch invariance: engine/build.py), with a KV cache and a decode graph of its
        own. Built on the first call and kept; self when no draft is loaded. if_fits: None instead
        when, on a GPU, its KV cache would leave too little memory free (twin_fits).

        Sharing is sound because no kernel choice touches a weight: every kernel set (routing.py,
        layer_kernels.py, ops.py) reads each nn.Linear's (N, K) weight as loaded, and the kernels
        keep nothing of a model's: only per-device scratch (split-K counters, the greedy pick's
        partials) that every model on the device already shares, one launch at a time."""
        if self.speculator is None:
            return self
        if self._no_draft is None:
            runner = self.runner
            if if_fits and not twin_fits(runner.kv.nbytes, *device_memory(runner.device)):
                return None
            options = dataclasses.replace(runner.model.ops.options, batch_invariant=False)
            twin = ModelRunner(runner.model.with_options(options), runner.max_len)
            if runner.uses_graphs:
                twin.defer([1])  # captured on its first answer, not while the caller waits here
            self._no_draft = Engine(twin, self.tokenizer, self.model_name)
        return self._no_draft

    def generate(self, messages: list[dict], params: SamplingParams = SamplingParams(), **kw) -> GenerationResult:
        text, ids, last = [], [], None
        for ev in self.stream(messages, params, **kw):
            text.append(ev.text)
            ids.extend(ev.token_ids)
            last = ev
        return GenerationResult("".join(text), ids, last.stats, last.finish_reason)

    def stream(self, messages: list[dict], params: SamplingParams = SamplingParams(),
               speculative: bool | None = None, stop_event: threading.Event | None = None,
               t0: float | None = None) -> Iterator[StreamEvent]:
        """`t0`: the `time.perf_counter()` at which the answer was asked for (time to first token counts from
        it); now by default."""
        t0 = time.perf_counter() if t0 is None else t0
        ids = self.tokenizer.apply_chat_template(messages, max_len=self.runner.max_len)
        return self.stream_ids(ids, params, speculative, stop_event, t0)

    def stream_ids(self, prompt_ids: list[int], params: SamplingParams = SamplingParams(),
                   speculative: bool | None = None, stop_event: threading.Event | None = None,
                   t0: float | None = None) -> Iterator[StreamEvent]:
        """Validates at once, then returns the event generator."""
        t0 = time.perf_counter() if t0 is None else t0
        max_len = self.runner.max_len
        if not prompt_ids:
            raise UserError("the prompt is empty")
        if len(prompt_ids) >= max_len:
            raise UserError(f"the prompt is {len(prompt_ids)} tokens but the context holds {max_len}; "
                            "shorten it or start a new chat")
        use_spec = self.speculator is not None and speculative is not False
        return self._run(list(prompt_ids), params, use_spec, stop_event, t0)

    def _run(self, prompt: list[int], params, use_spec, stop_event, t0) -> Iterator[StreamEvent]:
        dev = self.runner.device
        gen = None
        if not params.is_greedy:
            gen = torch.Generator(device=dev)
            seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(7), "little")
            gen.manual_seed(seed)
        cached = self._kv_tokens
        self._kv_tokens = []  # invalid until this run ends cleanly
        if use_spec:
            reuse = self.speculator.reusable_prefix(cached, prompt)
        else:
            reuse = _common_prefix(cached, prompt)
        state = DecodeState(tokens=list(prompt), kv_len=min(reuse, len(prompt) - 1), params=params, generator=gen)
        if params.repetition_penalty != 1.0:
            state.seen = torch.zeros(self.runner.config.vocab_size, dtype=torch.bool, device=dev)
            state.seen[torch.tensor(prompt, device=dev)] = True
        stats = GenerationStats(prompt_tokens=len(prompt), prefill_tokens=len(prompt) - state.kv_len,
                                speculative=use_spec, draft_steps=self.speculator.k if use_spec else 0,
                                draft_loaded=self.speculator is not None)
        tokens = self.speculator.tokens(self.runner, state) if use_spec else self._plain_tokens(state)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop)
        eos = frozenset() if params.ignore_eos else self.tokenizer.eos_token_ids
        out: list[int] = []
        t_first = None
        reason = "length"
        try:
            for new in tokens:
                keep = []
                for t in new:
                    if t in eos:
                        reason = "stop"
                        break
                    keep.append(t)
                    if len(out) + len(keep) >= params.max_tokens:
                        break
                out.extend(keep)
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                    stats.ttft_s = now - t0
                text = detok.add(keep) if keep else ""
                _update(stats, out, t_first, now, state)
                done = reason == "stop" or detok.stopped or len(out) >= params.max_tokens
                if detok.stopped:
                    reason = "stop"
                if stop_event is not None and stop_event.is_set() and not done:
                    done, reason = True, "cancelled"
                if done:
                    break
                yield StreamEvent(text, keep, stats)
            else:
                text, keep = "", []  # context full
            tail = detok.flush()
            yield StreamEvent(text + tail, keep, stats, finished=True, finish_reason=reason)
        finally:
            tokens.close()
            self._kv_tokens = state.tokens[:state.kv_len]

    def _plain_tokens(self, state: DecodeState) -> Iterator[list[int]]:
        runner, p = self.runner, state.params
        new = torch.tensor(state.tokens[state.kv_len:], dtype=torch.long, device=runner.device)
        logits, _, _ = runner.forward(new, state.kv_len, all_logits=False)
        state.kv_len = len(state.tokens)
        step = runner.graph(1, state.kv_len)
        if step is not None and p.is_greedy and state.seen is None:
            yield from self._greedy_graph_tokens(step, logits[-1].argmax().view(1), state)
            return
        yield [choose_next(logits[-1], state)]
        if step is not None:
            yield from self._chosen_on_device(step, state)
            return
        yield from plain_steps(runner, state)

    def _greedy_graph_tokens(self, step, first: torch.Tensor, state: DecodeState) -> Iterator[list[int]]:
        """Greedy decoding with the argmax inside the decode graph. The replay after the next is
        queued before the host reads a token (ReadAhead), so the GPU does not wait for the host."""
        t = int(first)
        state.tokens.append(t)
        yield [t]
        max_len = self.runner.max_len
        if state.kv_len >= max_len:
            return
        with torch.inference_mode():  # the graph's buffers are inference tensors
            step.input_ids.copy_(first)
            step.positions.fill_(state.kv_len)
        reader = step.read_ahead()
        reader.drain()
        yield from self._queued_tokens(reader, step.graph.replay, state)

    def _queued_tokens(self, reader, replay, state: DecodeState) -> Iterator[list[int]]:
        """One token a replay of `replay` (each writing the next replay's input on the device), the
        replay after the next queued before the host reads a token through `reader`, until the
        cache is full (the caller stops earlier on EOS or max_tokens)."""
        max_len = self.runner.max_len
        pos = state.kv_len  # where the next queued replay writes
        try:
            while True:
                while reader.in_flight < read_ahead.DEPTH and pos < max_len:
                    reader.queue(replay)
                    pos += 1
                t = reader.take()[0]
                state.kv_len += 1
                state.tokens.append(t)
                yield [t]
                if state.kv_len >= max_len:
                    return
        finally:
            reader.drain()  # a replay queued past the answer's end wrote only past kv_len

    def _chosen_on_device(self, step, state: DecodeState) -> Iterator[list[int]]:
        """Sampling, or a repetition penalty (greedy or not), after each replay of the decode graph:
        the token chosen on the device and written into the next replay's input, so that replays
        are queued ahead of the host as in greedy decoding (ReadAhead) instead of the host waiting
        for each token. The choice is choose_next's own (decode.choose_token: the penalty over the
        tokens seen, the draw from the request's generator in the same order, the token marked
        seen), so a seed gives the tokens the step-by-step loop gives. The last chosen token is not
        in the cache yet."""
        if state.kv_len >= self.runner.max_len:
            return
        with torch.inference_mode():
            step.input_ids.fill_(state.tokens[state.kv_len])
            step.positions.fill_(state.kv_len)
            token = torch.zeros(1, dtype=torch.long, device=step.input_ids.device)

        def replay() -> None:  # the decode graph advances positions itself (its greedy pick)
            with torch.inference_mode():
                step.graph.replay()
                token.copy_(choose_token(step.logits[-1], state))
                step.input_ids.copy_(token)

        yield from self._queued_tokens(read_ahead.ReadAhead(token), replay, state)

    def reset(self) -> None:
        """Forgets the cached conversation (the next prompt is prefilled in full)."""
        self._kv_tokens = []


# What building the no-draft twin must leave free on a GPU: the draft's deferred graphs are still
# to be captured, and running out of memory in the middle of a chat costs more than comparing
# against the draft-loaded engine instead.
TWIN_SPARE_FRACTION = 0.05
TWIN_SPARE_MIN_BYTES = 1 << 30


def twin_fits(kv_bytes: int, free_bytes: int | None, total_bytes: int | None) -> bool:
    """Whether a twin's KV cache of kv_bytes fits with the spare above left free (None: memory
    not counted, as on the CPU)."""
    if free_bytes is None or total_bytes is None:
        return True
    return free_bytes - kv_bytes >= max(TWIN_SPARE_MIN_BYTES, TWIN_SPARE_FRACTION * total_bytes)


def device_memory(device: torch.device) -> tuple[int | None, int | None]:
    """(bytes a new allocation can take, the device's total) on CUDA: the driver's free memory plus
    what torch's allocator holds unused; (None, None) elsewhere."""
    if device.type != "cuda":
        return None, None
    free, total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device), total


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def add_verify_steps(hist: list[int], spans: list[list[int]], accept_lens: list[int]) -> None:
    """Adds verify steps (the tokens each gave, in answer order) to a histogram (hist[n]: steps that
    gave n) and to the answer's spans ([steps, tokens] of the steps that began in each ACCEPT_SPAN
    tokens; the answer's first token comes from the prefill, the verify steps follow from the
    second), both in place: an answer's later events add only their own steps."""
    pos = 1 + sum(t for _, t in spans)
    for n in accept_lens:
        if n >= len(hist):
            hist.extend([0] * (n + 1 - len(hist)))
        hist[n] += 1
        j = pos // ACCEPT_SPAN
        while len(spans) <= j:
            spans.append([0, 0])
        spans[j][0] += 1
        spans[j][1] += n
        pos += n


def accept_spans(accept_lens: list[int]) -> list[list[int]]:
    """The answer spans of these verify steps alone (add_verify_steps)."""
    spans: list[list[int]] = []
    add_verify_steps([], spans, accept_lens)
    return spans


def _update(stats: GenerationStats, out: list[int], t_first: float, now: float, state: DecodeState) -> None:
    stats.generated_tokens = len(out)
    stats.decode_s = now - t_first
    stats.decode_tok_s = (len(out) - 1) / stats.decode_s if stats.decode_s > 0 and len(out) > 1 else 0.0
    n = state.accept_lens
    if len(n) > stats.verify_steps:  # only the steps since the last event: this runs at every one
        hist = stats.accept_hist
        add_verify_steps(hist, stats.accept_by_span, n[stats.verify_steps:])
        stats.verify_steps = len(n)
        stats.accept_len_mean = sum(i * c for i, c in enumerate(hist)) / len(n)
        stats.accept_by_position = [sum(hist[i + 2:]) / len(n) for i in range(len(hist) - 2)]
    if state.verify_rows:
        stats.verify_tokens = sum(state.verify_rows) / len(state.verify_rows)
    stats.tree = state.tree
