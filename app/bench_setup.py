"""Engines and prompts for `localchat bench`: real models, or random bf16 weights of a given shape."""

from __future__ import annotations


PROMPTS = [
    "Explain how a refrigerator keeps food cold, step by step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between cats and dogs as pets?",
    "Give me a recipe for a simple tomato soup and explain each step.",
    "Describe the water cycle to a ten-year-old.",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Summarize the history of the bicycle in a few paragraphs.",
    "How do I start learning to play the guitar? Give practical advice.",
]


class IdTokenizer:
    """Stands in for a tokenizer when the model has random weights: ids only, no text."""

    eos_token_ids = frozenset()

    def decode(self, ids):
        return ""

    def apply_chat_template(self, messages):
        raise NotImplementedError("random-weight models take token ids")


def build_bench_engine(args, options=None):
    """options: a random-weight model's kernel switches (engine/options.py; None: from the
    environment, as for a real model)."""
    if not args.random_weights:
        from app.commands import load_engine

        return load_engine(args, quiet=args.json)
    import dataclasses

    import torch

    from engine.config import ModelConfig
    from engine.engine import Engine, pick_device
    from engine.loader import build_model
    from engine.options import KernelOptions
    from engine.runner import ModelRunner
    from engine.threads import apply_threads

    from app.bench import LLAMA_8B

    from engine.config_checks import read_json

    raw = LLAMA_8B if args.random_weights == "llama-8b" else read_json(args.random_weights)
    cfg = ModelConfig.from_hf(raw, str(args.random_weights))
    dev = pick_device(args.device)
    apply_threads(dev.type, getattr(args, "threads", None))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    max_len = args.max_seq_len or 4096
    gen = torch.Generator(device=dev).manual_seed(0)

    def random_tensors():
        with torch.device("meta"):
            from engine.model import CausalLM
            from engine.ops import Ops

            shapes = CausalLM(cfg, 16, Ops.for_device(torch.device("cpu")))
        for name, p in shapes.named_parameters():
            if name.endswith("norm.weight"):
                yield name, torch.ones(p.shape, dtype=dtype, device=dev)
            else:
                yield name, torch.randn(p.shape, dtype=dtype, device=dev, generator=gen) * 0.02

    # With the random head, the target's kernels are the batch-invariant ones a real draft gets
    # (options may ask for them without a head: profiling the target's side).
    options = options or KernelOptions.from_env()
    options = dataclasses.replace(options, batch_invariant=options.batch_invariant or args.force_accept is not None)
    model = build_model(cfg, random_tensors(), "random weights", dev, dtype, max_len, options)
    runner = ModelRunner(model, max_len)
    speculator = None
    if args.force_accept is not None:
        from engine.errors import UserError
        from speculative.testing import random_eagle3

        if not 1 <= args.force_accept <= args.draft_steps + 1:
            raise UserError(f"--force-accept must be between 1 and k + 1 = {args.draft_steps + 1}")
        speculator = random_eagle3(runner, args.draft_steps, args.force_accept)
    if not args.no_graphs and dev.type == "cuda":
        runner.capture([1] + ([args.draft_steps + 1] if speculator else []))
        if speculator:
            speculator.capture()
    name = "random " + (args.random_weights if args.random_weights == "llama-8b" else cfg.architecture)
    return Engine(runner, IdTokenizer(), name, speculator, "random EAGLE-3 head (forced acceptance)" if speculator else None)


def bench_prompts(engine, args) -> tuple[list[list[int]], str]:
    """(token-id prompts, where they came from): random ids of --prompt-tokens for random
    weights, chat prompts otherwise (see chat_prompts_from)."""
    import torch

    if args.random_weights:
        g = torch.Generator().manual_seed(1)
        vocab = engine.runner.config.vocab_size
        ids = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
        return ids, f"random token ids, {args.prompt_tokens} each"
    prompts, source = chat_prompts_from(args.prompts, getattr(args, "prompt_set", "chitchat"))
    return [engine.tokenizer.apply_chat_template(m) for m in prompts], source


HELD_OUT = "held-out chitchat conversations"
HELD_OUT_INSTRUCT = "held-out built-in instruction prompts (speculative/train/instruct_prompts.py)"
BUILT_IN = "built-in prompts (the chitchat data set is not in the cache)"


def chat_prompts(n: int) -> list[list[dict]]:
    return chat_prompts_from(n)[0]


def chat_prompts_from(n: int, prompt_set: str = "chitchat") -> tuple[list[list[dict]], str]:
    """(prompts, HELD_OUT or BUILT_IN): the first user turns of held-out chitchat conversations
    (never used to train the shipped heads) when the data set is in the cache; otherwise the
    built-in prompts, on which the shipped head accepts less (H200: 2.3 against 3.0). Reports
    say which, so figures from the two sets are never compared by mistake. prompt_set
    "instruct": (the held-out instruction prompts of speculative/train/instruct_prompts.py, in a fixed
    shuffle that mixes their kinds, HELD_OUT_INSTRUCT)."""
    if prompt_set == "instruct":
        from speculative.train.instruct_prompts import instruct_prompts, interleaved

        held = interleaved(instruct_prompts(heldout=True), 0)
        return [[{"role": "user", "content": p}] for p in (held * (1 + n // len(held)))[:n]], HELD_OUT_INSTRUCT
    try:
        from speculative.train.data import heldout_prompts

        held = heldout_prompts(n)
        if len(held) == n:
            return held, HELD_OUT
    except Exception:  # no cached data set (offline): fall back
        pass
    return [[{"role": "user", "content": p}] for p in (PROMPTS * 4)[:n]], BUILT_IN
