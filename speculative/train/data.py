"""Conversations for head training: the chitchat data set or a JSONL file, its held-out split,
chat-template tokenization, and packing of token sequences into fixed-length rows."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError
from engine.paths import cache_dir
from engine.hub.pypi import download_wheel, sha256_file

CHITCHAT_WHEEL = "chitchat-dataset==0.9.0"
CHITCHAT_FILE = "chitchat_dataset-0.9.0-py3-none-any.whl"
CHITCHAT_SHA256 = "7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e"
CHITCHAT_MEMBER = "chitchat_dataset/dataset.json"
HELDOUT_PERCENT = 5
SPLIT_RULE = (f"a conversation is held out when int(sha256(id).hexdigest()[:8], 16) % 100 < {HELDOUT_PERCENT}; "
              "id is the chitchat conversation key (a UUID), or for JSONL files the line's 'id' field, else "
              "the sha256 of the line's 'messages' as canonical JSON (sort_keys, no spaces). Training never "
              "reads a held-out conversation.")


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple  # ({"role", "content"}, ...)


@dataclass
class Sequence:
    """One training sequence: token ids, and where the target's own greedy reply starts (-1: none)."""

    ids: list[int]
    response_start: int = -1


def is_heldout(conv_id: str) -> bool:
    return int(hashlib.sha256(conv_id.encode()).hexdigest()[:8], 16) % 100 < HELDOUT_PERCENT


def split(convs: list[Conversation]) -> tuple[list[Conversation], list[Conversation]]:
    """(train, heldout), each in source order."""
    train = [c for c in convs if not is_heldout(c.id)]
    held = [c for c in convs if is_heldout(c.id)]
    return train, held


# --- sources ------------------------------------------------------------------------------
def chitchat_wheel(log=None) -> Path:
    """The chitchat wheel in the localchat cache, fetched with pip once and hash-checked."""
    folder = cache_dir() / "datasets"
    path = folder / CHITCHAT_FILE
    if path.exists() and sha256_file(path) == CHITCHAT_SHA256:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    if log:
        log(f"fetching the training conversations ({CHITCHAT_WHEEL}, 8 MB) from PyPI, once")
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        wheel = download_wheel(CHITCHAT_WHEEL, Path(tmp), "check the network or pass --data FILE.jsonl")
        digest = sha256_file(wheel)
        if digest != CHITCHAT_SHA256:
            raise UserError(f"{wheel.name} has sha256 {digest}, expected {CHITCHAT_SHA256}; not using it")
        os.replace(wheel, path)
    return path


def load_chitchat(log=None, wheel: Path | None = None) -> list[Conversation]:
    """7,168 conversations; each turn is one sender's run of messages (joined by newlines).
    The first sender plays the user, the other the assistant; senders always alternate.
    `wheel`: a local copy of the wheel (machines without network), hash-checked."""
    if wheel is not None:
        if not wheel.is_file() or sha256_file(wheel) != CHITCHAT_SHA256:
            raise UserError(f"--data {wheel}: not the {CHITCHAT_WHEEL} wheel (sha256 {CHITCHAT_SHA256})")
    with zipfile.ZipFile(wheel or chitchat_wheel(log)) as zf:
        data = json.loads(zf.read(CHITCHAT_MEMBER))
    convs = []
    for conv_id, conv in data.items():
        messages = []
        for i, turn in enumerate(conv["messages"]):
            text = "\n".join(u["text"].strip() for u in turn if u["text"].strip())
            if text:
                messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
        if messages:
            convs.append(Conversation(conv_id, tuple(messages)))
    return convs


def load_jsonl(path: Path) -> list[Conversation]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--data {path}: no such file (give a JSONL file of {{\"messages\": [...]}} lines)")
    convs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            messages = obj["messages"]
            ok = isinstance(messages, list) and messages and all(
                m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"), str)
                for m in messages)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise UserError(f"--data {path}, line {n}: expected {{\"messages\": [{{\"role\": \"user\", "
                            "\"content\": \"...\"}, ...]}")
        messages = tuple({"role": m["role"], "content": m["content"]} for m in messages)
        conv_id = str(obj.get("id") or hashlib.sha256(
            json.dumps(messages, sort_keys=True, separators=(",", ":")).encode()).hexdigest())
        convs.append(Conversation(conv_id, messages))
    if not convs:
        raise UserError(f"--data {path} holds no conversations")
    return convs


def load_conversations(data: str | None, log=None) -> tuple[list[Conversation], dict]:
    """(conversations, provenance of the source)."""
    if data is None or data.endswith(".whl"):
        convs = load_chitchat(log, None if data is None else Path(data).expanduser())
        return convs, {"source": f"PyPI {CHITCHAT_WHEEL} (MIT; 7,168 English conversations), {CHITCHAT_MEMBER} "
                                 f"inside {CHITCHAT_FILE}", "sha256": CHITCHAT_SHA256}
    convs = load_jsonl(Path(data))
    return convs, {"source": str(Path(data).resolve()), "sha256": sha256_file(Path(data))}


def heldout_prompts(n: int, turns: int = 1, data: str | None = None) -> list[list[dict]]:
    """Chat prompts from held-out conversations (never trained on), in source order: the first
    `turns` user turns with the replies between them, ending on a user turn. Conversations with
    fewer user turns are skipped."""
    convs, _ = load_conversations(data)
    _, held = split(convs)
    out = []
    for conv in held:
        prefix = prompt_prefix(conv.messages, turns)
        if prefix is not None:
            out.append(prefix)
        if len(out) == n:
            break
    return out


def prompt_prefix(messages, turns: int) -> list[dict] | None:
    """Messages up to and including the `turns`-th user message; None if there are fewer."""
    seen = 0
    for i, m in enumerate(messages):
        if m["role"] == "user":
            seen += 1
            if seen == turns:
                return [dict(x) for x in messages[:i + 1]]
    return None


def user_turns(messages) -> int:
    return sum(m["role"] == "user" for m in messages)


# --- tokens -------------------------------------------------------------------------------
def format_conversation(tokenizer, messages) -> list[int]:
    """A whole conversation through the model's chat template, BOS handled like the engine's prompts."""
    return tokenizer.with_bos(tokenizer.encode(tokenizer.render(list(messages), add_generation_prompt=False)))


def tokenize(tokenizer, convs: list[Conversation], seq_len: int) -> list[Sequence]:
    """One sequence per conversation, truncated to seq_len tokens; very short ones dropped."""
    out = []
    for conv in convs:
        ids = format_conversation(tokenizer, conv.messages)[:seq_len]
        if len(ids) >= 4:
            out.append(Sequence(ids))
    return out


def pack(seqs: list[Sequence], seq_len: int) -> list[list[int]]:
    """Greedy first-fit of sequence indices into rows of at most seq_len tokens, in order."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i, s in enumerate(seqs):
        n = len(s.ids)
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(seq_len - n)
    return rows
