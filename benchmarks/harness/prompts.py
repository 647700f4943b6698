"""The prompts benchmarks decode: held-out chat prompts (or built-in ones), or random token ids."""

from __future__ import annotations

import torch

from engine.errors import UserError

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

HELD_OUT = "held-out chitchat conversations"
HELD_OUT_INSTRUCT = "held-out built-in instruction prompts (speculative/train/instruct_prompts.py)"
BUILT_IN = "built-in prompts (the chitchat data set is not in the cache)"


def bench_prompts(engine, args, system: str | None = None,
                  file_prompts: list[str] | None = None) -> tuple[list[list[int]], str]:
    """(token-id prompts, where they came from): random ids of --prompt-tokens for random
    weights; otherwise chat prompts, file_prompts (--prompts-file) or those of chat_prompts_from,
    each a user turn under the system prompt `system` (none when empty)."""
    if args.random_weights:
        g = torch.Generator().manual_seed(1)
        vocab = engine.runner.config.vocab_size
        ids = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
        return ids, f"random token ids, {args.prompt_tokens} each"
    if file_prompts is not None:
        prompts = [[{"role": "user", "content": p}] for p in file_prompts[:args.prompts]]
        source = f"--prompts-file {args.prompts_file}"
    else:
        prompts, source = chat_prompts_from(args.prompts, getattr(args, "prompt_set", "chitchat"))
    head = [{"role": "system", "content": system}] if system else []
    return [engine.tokenizer.apply_chat_template(head + m) for m in prompts], source


def system_prompt(args) -> str:
    """--system, or the chat app's built-in default system prompt: answers are measured as a new
    chat in the app gets them (the demo model answers worse under its template's own default),
    and the same on every machine (not from this user's settings.toml)."""
    if args.system is not None:
        return args.system
    from app.settings import Settings

    return Settings().system_prompt


def read_prompts_file(path: str) -> list[str]:
    """--prompts-file: one prompt per line, blank lines skipped; a missing, unreadable or empty file
    is a one-line UserError."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise UserError(f"--prompts-file {path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"--prompts-file {path} is a folder; give a text file with one prompt per line") from None
    except UnicodeDecodeError:
        raise UserError(f"--prompts-file {path}: not UTF-8 text; give a text file with one prompt per line") from None
    except OSError as e:
        raise UserError(f"--prompts-file {path}: cannot read it ({e.strerror or type(e).__name__})") from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise UserError(f"--prompts-file {path} has no prompts (one per line; blank lines are skipped)")
    return prompts


def chat_prompts(n: int) -> list[list[dict]]:
    return chat_prompts_from(n)[0]


def chat_prompts_from(n: int, prompt_set: str = "chitchat") -> tuple[list[list[dict]], str]:
    """(prompts, HELD_OUT or BUILT_IN): the first user turns of held-out chitchat conversations
    (never used to train the shipped heads) when the data set is in the cache; otherwise the
    built-in prompts, on which the shipped head accepts less (H200: 2.3 against 3.0). Reports
    say which, so figures from the two sets are never compared by mistake. prompt_set
    "instruct": (the held-out instruction prompts of speculative/train/instruct_prompts.py, in a fixed
    shuffle that mixes their kinds, HELD_OUT_INSTRUCT); another request set of
    speculative/train/prompt_sets.py: its held-out requests, in a fixed shuffle."""
    if prompt_set == "instruct":
        from speculative.train.instruct_prompts import instruct_prompts, interleaved

        held = interleaved(instruct_prompts(heldout=True), 0)
        return [[{"role": "user", "content": p}] for p in (held * (1 + n // len(held)))[:n]], HELD_OUT_INSTRUCT
    if prompt_set != "chitchat":
        import random

        from speculative.train.prompt_sets import split_requests

        held = split_requests(prompt_set, True)
        random.Random(0).shuffle(held)
        return ([[{"role": "user", "content": p}] for p in (held * (1 + n // len(held)))[:n]],
                f"held-out requests of the {prompt_set} set (speculative/train/prompt_sets.py)")
    try:
        from speculative.train.data import heldout_prompts

        held = heldout_prompts(n)
        if len(held) == n:
            return held, HELD_OUT
    except Exception:  # no cached data set (offline): fall back
        pass
    return [[{"role": "user", "content": p}] for p in (PROMPTS * 4)[:n]], BUILT_IN
