"""The target's replies to training prompts (greedy, or drawn at a temperature), kept between runs
of train-draft.

Generating replies is the slow first phase of a run (minutes on an H200). A later run for the
same target on the same kind of device (new hyper-parameters, a longer budget, a run cut short)
reuses every reply it finds and generates only the prompts it lacks, so its time budget goes to
training. Entries are keyed by the prompt's token ids (and, for a drawn reply, its temperature:
a greedy reply never stands in for a drawn one); the folder by what shapes a reply: the
target's weight files (path, size, modification time), its end-of-turn tokens, device type and
dtype, and the reply and context limits. A damaged file counts as empty.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

FORMAT = 1


def _prompt_key(ids: list[int], temperature: float = 0.0) -> str:
    key = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:24]
    return f"{key}@{temperature:g}" if temperature > 0 else key


def drawn_share(ids: list[int]) -> float:
    """A number in [0, 1) fixed by the prompt alone: a prompt is answered by a draw when it is
    below the run's --sampled-replies, so the same prompts are drawn in every run (and their
    cached replies found again) whatever order or count of prompts a run takes."""
    return int(_prompt_key(ids)[:8], 16) / 2 ** 32


def target_identity(path: Path) -> list:
    """(name, size, mtime_ns) of the weight files that make the target: the .gguf file, or a
    folder's safetensors / bin shards and config.json."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf") or p.name == "config.json")
    out = []
    for p in files:
        st = p.stat()
        out.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    return out


class ReplyCache:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.file = self.folder / "replies.jsonl"

    @classmethod
    def for_run(cls, root: Path, identity: dict) -> ReplyCache:
        key = hashlib.sha256(json.dumps({**identity, "format": FORMAT}, sort_keys=True).encode()).hexdigest()
        return cls(Path(root) / key[:24])

    def load(self) -> dict[str, list[int]]:
        """prompt key -> reply ids; {} when there is no cache or it cannot be read."""
        out: dict[str, list[int]] = {}
        try:
            with open(self.file, encoding="utf-8") as f:
                for line in f:
                    entry = json.loads(line)
                    reply = entry["r"]
                    if not isinstance(entry["p"], str) or not all(isinstance(t, int) for t in reply):
                        raise ValueError("bad entry")
                    out[entry["p"]] = reply
        except (OSError, ValueError, KeyError, TypeError):
            return {}
        return out

    def save(self, replies: dict[str, list[int]]) -> None:
        """Writes every entry (replacing the file in one rename, so a crash leaves the old one)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for key, reply in replies.items():
                f.write(json.dumps({"p": key, "r": reply}, separators=(",", ":")) + "\n")
        os.replace(tmp, self.file)


class GenerationStopped(KeyboardInterrupt):
    """Ctrl+C during generation, carrying the replies finished by then (`made`: Sequences in
    prompt order; after replies_for, `new`: their cache entries) so that they are kept."""

    def __init__(self, made: list):
        super().__init__()
        self.made = made
        self.new: dict[str, list[int]] = {}


def replies_for(prompts: list[list[int]], known: dict[str, list[int]], generate,
                temperatures: list[float] | None = None) -> tuple[list, int, dict]:
    """Sequences (prompt + reply, in prompt order) for the prompts that have a reply: cached
    ones, then `generate(missing prompts, their temperatures)` -> Sequences for those it managed
    (a deadline may cut it short). temperatures: each prompt's (0: greedy; None: all greedy).
    Returns (sequences, how many came from the cache, the new entries). A GenerationStopped from
    `generate` goes on with its entries in `new`."""
    from speculative.train.data import Sequence

    temps = temperatures or [0.0] * len(prompts)
    keys = [_prompt_key(p, t) for p, t in zip(prompts, temps)]
    missing = [i for i, k in enumerate(keys) if k not in known]
    try:
        made = generate([prompts[i] for i in missing], [temps[i] for i in missing]) if missing else []
    except GenerationStopped as stop:
        stop.new = {keys[i]: reply for i, reply in _match(prompts, missing, stop.made).items()}
        raise
    by_index = _match(prompts, missing, made)
    new = {keys[i]: reply for i, reply in by_index.items()}
    out, cached = [], 0
    for i, p in enumerate(prompts):
        reply = known.get(keys[i])
        if reply is not None:
            cached += 1
        else:
            reply = by_index.get(i)
        if reply is not None:
            out.append(Sequence(list(p) + list(reply), response_start=len(p)))
    return out, cached, new


def _match(prompts: list[list[int]], missing: list[int], made: list) -> dict[int, list[int]]:
    """prompt index -> reply, for the sequences `generate` returned for prompts[missing] (in
    order, possibly fewer of them)."""
    todo = list(missing)
    out: dict[int, list[int]] = {}
    for seq in made:
        prompt = seq.ids[:seq.response_start]
        while todo and prompts[todo[0]] != prompt:
            todo.pop(0)  # not reached
        if not todo:
            break
        out[todo.pop(0)] = seq.ids[seq.response_start:]
    return out
