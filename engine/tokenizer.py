"""Tokenizer: chat template, incremental detokenization and stop strings.

The first load of a model's tokenizer goes through `transformers` (which knows every format).
If its tokenizer is a fast one, the pieces we use are then checked against a direct path (the
`tokenizers` library and our own Jinja environment for the chat template) on probe
conversations, and when they agree the tokenizer and its facts are kept in the cache. Later
loads read them from there without importing `transformers`, which costs seconds at start-up.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from engine.chat_template import ChatTemplate, render_limit
from engine.errors import ModelLoadError, UserError

# Files a tokenizer folder may hold: a change to any of them re-derives the cached facts.
_SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "chat_template.json", "tokenizer.model", "added_tokens.json", "vocab.json", "merges.txt")
_FACTS_VERSION = 1
_PROBES = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Write\n  two lines: naïve café, 東京, 🙂 and <b>tags</b> & \"quotes\"."}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4, of course."},
     {"role": "user", "content": "  And\t3 + 3 ?  "}],
]


class Tokenizer:
    """encode / decode / chat template over either backend (see the module docstring)."""

    def __init__(self, encode, decode, chat_template: str | None, bos_token_id: int | None,
                 eos_token_id: int | None, add_bos_token: bool, special_tokens: dict[str, str],
                 eos_token_ids: tuple[int, ...] = (), hf=None):
        self._encode, self._decode = encode, decode
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos_token = add_bos_token
        self.special_tokens = special_tokens  # bos_token, eos_token, ...: what templates read
        self.hf = hf  # the transformers tokenizer when that backend is in use, else None
        self._template = None
        eos = set(eos_token_ids)
        if eos_token_id is not None:
            eos.add(eos_token_id)
        self.eos_token_ids = frozenset(eos)

    # --- loading ----------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: Path, eos_token_ids: tuple[int, ...] = (), gguf_file: str | None = None,
                    cache: Path | None = None) -> "Tokenizer":
        """cache: where verified fast tokenizers are kept (default: the localchat cache)."""
        if cache is None:
            from engine.paths import cache_dir

            cache = cache_dir() / "tokenizers"
        key = None if gguf_file else _source_key(folder)
        entry = cache / key if key else None
        if entry is not None:
            fast = _load_fast(entry, eos_token_ids)
            if fast is not None:
                return fast
        tok = cls.from_transformers(folder, eos_token_ids, gguf_file)
        if entry is not None:
            _save_fast(tok, entry, eos_token_ids)
        return tok

    @classmethod
    def from_transformers(cls, folder: Path, eos_token_ids: tuple[int, ...] = (),
                          gguf_file: str | None = None) -> "Tokenizer":
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file, trust_remote_code=False)
        except Exception as e:  # transformers raises many types for a bad folder
            raise ModelLoadError(f"cannot load the tokenizer from {folder}: {str(e).splitlines()[0]}") from None
        template = hf.chat_template
        if isinstance(template, dict):
            template = template.get("default")
        tok = cls(lambda text: hf.encode(text, add_special_tokens=False),
                  lambda ids: hf.decode(ids, skip_special_tokens=True),
                  template or None, hf.bos_token_id, hf.eos_token_id, bool(getattr(hf, "add_bos_token", False)),
                  {k: str(v) for k, v in hf.special_tokens_map.items() if isinstance(v, str)}, eos_token_ids, hf)
        tok._render_hf = lambda messages, gen: hf.apply_chat_template(messages, tokenize=False,
                                                                      add_generation_prompt=gen)
        return tok

    # --- use ----------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._decode(ids)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, max_len: int | None = None) -> str:
        """The conversation as text through the chat template (a base model without one: the
        contents joined by blank lines). The render is bounded (engine/chat_template.py) by a limit
        derived from the messages and the context length `max_len`. With the transformers backend
        the bounded render runs first and any failure of it is final; transformers' own render,
        which has no bounds, then gives the text."""
        if not self.chat_template:
            return "\n\n".join(m["content"] for m in messages)
        if self._template is None:
            self._template = compile_template(self.chat_template)
        text = self._template.render(max_chars=render_limit(messages, max_len), messages=[dict(m) for m in messages],
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens)
        if self.hf is not None:
            return self._render_hf(list(messages), add_generation_prompt)
        return text

    def with_bos(self, ids: list[int]) -> list[int]:
        """Templates that do not write BOS themselves rely on the tokenizer adding it."""
        bos = self.bos_token_id
        if bos is not None and self.add_bos_token and (not ids or ids[0] != bos):
            return [bos] + ids
        return ids

    def apply_chat_template(self, messages: list[dict], max_len: int | None = None) -> list[int]:
        """`max_len`: the context length, which bounds the render (see `render`)."""
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
                raise UserError("each message needs a role (system, user or assistant) and text content")
        return self.with_bos(self.encode(self.render(messages, max_len=max_len)))


def compile_template(source: str) -> ChatTemplate:
    """A chat template in our sandboxed Jinja environment, which bounds its work (engine/chat_template.py)."""
    return ChatTemplate(source)


def _source_key(folder: Path) -> str | None:
    """Names the cache entry after the folder and its tokenizer files (size, mtime); None
    when the folder has no tokenizer.json (slow tokenizers stay with transformers)."""
    folder = Path(folder).resolve()
    if not (folder / "tokenizer.json").is_file():
        return None
    parts = [str(_FACTS_VERSION), str(folder)]
    for name in _SOURCE_FILES:
        p = folder / name
        if p.is_file():
            st = p.stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _load_fast(entry: Path, eos_token_ids: tuple[int, ...]) -> Tokenizer | None:
    facts_path = entry / "facts.json"
    if not facts_path.is_file():
        return None
    try:
        facts = json.loads(facts_path.read_text())
        if not facts.get("fast"):
            return None
        from tokenizers import Tokenizer as RustTokenizer

        rust = RustTokenizer.from_file(str(entry / "tokenizer.json"))
    except Exception:  # a damaged cache entry: rebuild it through transformers
        return None
    return _fast(rust, facts, eos_token_ids)


def _fast(rust, facts: dict, eos_token_ids: tuple[int, ...]) -> Tokenizer:
    return Tokenizer(lambda text: rust.encode(text, add_special_tokens=False).ids,
                     lambda ids: rust.decode(ids, skip_special_tokens=True),
                     facts["chat_template"], facts["bos_token_id"], facts["eos_token_id"], facts["add_bos_token"],
                     facts["special_tokens"], eos_token_ids)


def _save_fast(tok: Tokenizer, entry: Path, eos_token_ids: tuple[int, ...]) -> None:
    """Checks the direct path against `tok` (transformers) on the probes; writes the entry
    with fast: true when every rendering, encoding and decoding agrees, else fast: false (so
    the check is not repeated). A cache that cannot be written is not an error."""
    facts = {"fast": False, "chat_template": tok.chat_template, "bos_token_id": tok.bos_token_id,
             "eos_token_id": tok.eos_token_id,
             "add_bos_token": tok.add_bos_token, "special_tokens": tok.special_tokens}
    rust_json = None
    try:
        rust_json = tok.hf.backend_tokenizer.to_str()
        from tokenizers import Tokenizer as RustTokenizer

        fast = _fast(RustTokenizer.from_str(rust_json), facts, eos_token_ids)
        facts["fast"] = _agrees(tok, fast)
    except Exception:  # no fast backend, or a template our environment cannot render
        facts["fast"] = False
    try:
        entry.mkdir(parents=True, exist_ok=True)
        if facts["fast"]:
            tmp = entry / f"tokenizer.json.{os.getpid()}"
            tmp.write_text(rust_json, encoding="utf-8")
            tmp.replace(entry / "tokenizer.json")
        tmp = entry / f"facts.json.{os.getpid()}"
        tmp.write_text(json.dumps(facts))
        tmp.replace(entry / "facts.json")  # written last: an entry without it is ignored
    except OSError:
        pass


def _agrees(slow: Tokenizer, fast: Tokenizer) -> bool:
    for messages in _PROBES:
        for gen in (True, False):
            text = slow.render(messages, gen)
            if fast.render(messages, gen) != text:
                return False
            ids = slow.encode(text)
            if fast.encode(text) != ids or fast.decode(ids) != slow.decode(ids):
                return False
            if any(fast.decode(ids[:i]) != slow.decode(ids[:i]) for i in range(1, min(len(ids), 48))):
                return False
    return True


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decodes a short window of recent tokens and emits only the stable part: text that ends
    in U+FFFD is an incomplete multi-byte character and is held back until it completes.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens whose text has been emitted
        self.text = ""  # emitted so far
        self.pending = ""  # decoded but held back
        self.stop = tuple(s for s in stop if s)
        self.stopped = False

    def add(self, new_ids: list[int]) -> str:
        """Appends tokens; returns the newly stable text (trimmed at a stop string)."""
        if self.stopped:
            return ""
        self.ids.extend(new_ids)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tok.decode(self.ids[self.prefix_offset:])
        if full.endswith("\ufffd") or len(full) < len(prefix):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._emit(delta)

    def flush(self) -> str:
        """The text still held back: an incomplete character or a possible stop-string start."""
        if self.stopped:
            return ""
        out = ""
        if self.read_offset < len(self.ids):
            prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset])
            full = self.tok.decode(self.ids[self.prefix_offset:])
            self.read_offset = len(self.ids)
            out = self._emit(full[len(prefix):])
        out += self.pending
        self.text += self.pending
        self.pending = ""
        return out

    def _emit(self, delta: str) -> str:
        self.pending += delta
        cut = min((i for s in self.stop if (i := self.pending.find(s)) >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
        else:
            # Hold back a tail that could still grow into a stop string.
            hold = max((k for s in self.stop for k in range(1, len(s))
                        if self.pending.endswith(s[:k])), default=0)
            out = self.pending[:len(self.pending) - hold]
            self.pending = self.pending[len(out):]
        self.text += out
        return out
