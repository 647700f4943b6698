"""Instruction-style prompts built from fixed templates and fillers (written for this project).

The chitchat data set is casual small talk; people also ask a chat model for lists, how-tos,
explanations, code and short writing, where the target answers in markdown lists, headings and
code blocks. A head trained on small talk alone drafts those answers badly (the demo head,
greedy, on the CPU: accepted length about 1.3 on "Give me two tips for sleeping well."). These
prompts let train-draft have the target answer such requests too (the `instruct` request set of
prompt_sets.py, --instruct-frac), and let
`bench --prompt-set instruct` measure acceptance on them.

Every prompt is one template filled with one item of its list, and maybe a modifier asking for
another shape of answer: about 4,400, deterministic and in a fixed order. The held-out split
follows the chitchat rule on the prompt text: a prompt is held out when
int(sha256(text).hexdigest()[:8], 16) % 100 < 5 (train_data.is_heldout).
"""

from __future__ import annotations

import functools

SPLIT_RULE = ("a built-in instruction prompt is held out when int(sha256(text).hexdigest()[:8], 16) % 100 < 5 "
              "(text: the prompt as sent); training never asks a held-out one")

TOPICS = [
    "sleeping well", "learning a new language", "saving money", "staying focused while studying", "public speaking",
    "running a first marathon", "growing tomatoes", "keeping houseplants alive", "cooking rice", "baking bread",
    "making coffee at home", "travelling on a budget", "packing a suitcase", "writing a cover letter",
    "preparing for a job interview", "working from home", "managing stress", "starting a podcast",
    "taking better photos with a phone", "learning to play the guitar", "training a puppy", "caring for a cat",
    "cleaning a kitchen", "organizing a closet", "planning a birthday party", "reading more books",
    "drinking more water", "reducing screen time", "starting to exercise", "stretching after a workout",
    "riding a bike in a city", "camping for the first time", "hiking safely", "choosing a laptop",
    "backing up files", "creating a strong password", "avoiding phishing emails", "writing clear emails",
    "taking notes in class", "remembering names", "making friends in a new city", "being a good listener",
    "giving feedback", "running a meeting", "negotiating a salary", "learning to code", "debugging a program",
    "reviewing code", "writing documentation", "making a budget", "paying off debt", "investing for beginners",
    "buying a used car", "renting a first apartment", "moving to a new house", "painting a room",
    "fixing a leaky faucet", "composting at home", "reducing food waste", "eating more vegetables",
    "meal prepping", "making a smoothie", "brewing tea", "hosting a dinner", "writing a short story",
    "keeping a journal", "meditating", "waking up early", "staying warm in winter", "staying cool in summer",
    "preparing for an exam", "learning math", "teaching a child to read", "volunteering", "recycling",
]

SUBJECTS = [
    "photosynthesis", "the water cycle", "black holes", "how vaccines work", "inflation", "the stock market",
    "machine learning", "the internet", "how airplanes fly", "climate change", "the Roman Empire",
    "the French Revolution", "plate tectonics", "DNA", "electricity", "magnets", "the moon's phases", "rainbows",
    "volcanoes", "earthquakes", "the human heart", "sleep cycles", "compound interest", "supply and demand",
    "recursion", "databases", "encryption", "how search engines work", "solar panels", "batteries",
    "the immune system", "gravity", "the speed of light", "tides", "the seasons", "coral reefs", "bees",
    "the printing press", "the Renaissance", "jazz", "impressionist painting", "chess openings", "the Olympics",
    "democracy", "the scientific method", "probability", "prime numbers", "the Pythagorean theorem",
    "how a bill becomes a law", "blockchains", "operating systems", "compilers", "version control",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "counts the words in a text",
    "returns the largest item in a list", "removes duplicates from a list while keeping order",
    "computes the factorial of a number", "returns the n-th Fibonacci number", "checks whether a word is a palindrome",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "reads a CSV file and sums a column",
    "finds the most common letter in a string", "flattens a nested list", "validates an email address",
    "sorts a list of dictionaries by a key", "counts the vowels in a string", "computes the average of a list",
    "returns the second largest number in a list", "checks whether two strings are anagrams",
    "groups words by their first letter", "converts a number to binary", "computes the greatest common divisor",
    "splits a list into chunks of a given size", "capitalizes the first letter of every word",
    "finds all even numbers in a list", "builds a histogram of word lengths", "checks balanced parentheses",
]

THINGS = [
    "the ocean", "autumn", "a rainy day", "a city at night", "friendship", "a lighthouse", "the first snow",
    "a cup of coffee", "an old library", "a mountain lake", "a summer festival", "a train journey", "the stars",
    "a garden in spring", "a lost key", "a quiet morning", "a busy market", "the desert", "a thunderstorm",
    "a robot learning to paint", "a cat on a windowsill", "a letter from the future", "a small bakery",
]

LANGUAGES = ["Python", "JavaScript"]
# Appended to a request: the same question asked for another shape of answer.
MODIFIERS = ["", " Keep it short.", " Use a numbered list.", " Be specific and practical."]

_TOPIC_TEMPLATES = [
    "Give me {n} tips for {x}.", "What are the most common mistakes people make when {x}?",
    "How do I get better at {x}?", "Make a step-by-step plan for {x}.", "What should a beginner know about {x}?",
    "List {n} things to keep in mind when {x}.", "Write a short checklist for {x}.",
    "What are the pros and cons of {x}?",
]
_SUBJECT_TEMPLATES = [
    "Explain {x} in simple terms.", "Explain {x} to a ten-year-old.", "What is {x}, and why does it matter?",
    "Give me {n} interesting facts about {x}.", "Summarize {x} in one paragraph.",
    "What are the main ideas behind {x}?", "Write a short quiz with {n} questions about {x}.",
]
_CODE_TEMPLATES = [
    "Write a {lang} function that {x}.", "Show me how to write a {lang} function that {x}, and explain it.",
    "Write a {lang} function that {x}, with a short docstring and an example.",
]
_WRITING_TEMPLATES = [
    "Write a short poem about {x}.", "Write a haiku about {x}.", "Write a four-sentence story about {x}.",
    "Describe {x} in three sentences.", "Write a short, friendly social media post about {x}.",
]


@functools.cache
def all_prompts() -> tuple[str, ...]:
    """Every prompt, in a fixed order (template by template, fillers in list order)."""
    out = []
    for m in MODIFIERS:
        for i, t in enumerate(_TOPIC_TEMPLATES):
            out += [t.format(x=x, n=3 + (i + j) % 5) + m for j, x in enumerate(TOPICS)]
        for i, t in enumerate(_SUBJECT_TEMPLATES):
            out += [t.format(x=x, n=3 + (i + j) % 5) + m for j, x in enumerate(SUBJECTS)]
    for m in MODIFIERS[:2]:
        for t in _CODE_TEMPLATES:
            out += [t.format(x=x, lang=lang) + m for lang in LANGUAGES for x in CODE_TASKS]
        for t in _WRITING_TEMPLATES:
            out += [t.format(x=x) + m for x in THINGS]
    return tuple(dict.fromkeys(out))  # no duplicates, order kept


def instruct_prompts(heldout: bool) -> list[str]:
    """The training prompts (heldout False) or the held-out ones (True), in the fixed order."""
    from speculative.train.data import is_heldout

    return [p for p in all_prompts() if is_heldout(p) == heldout]


def interleaved(prompts: list[str], seed: int) -> list[str]:
    """A fixed shuffle of `prompts` (so that a prefix mixes every template)."""
    import random

    out = list(prompts)
    random.Random(seed).shuffle(out)
    return out
