"""Tokenizer: chat template, incremental detokenization and stop strings, over `transformers`."""

from __future__ import annotations

from pathlib import Path

from .errors import ModelLoadError, UserError


class Tokenizer:
    def __init__(self, hf_tokenizer, eos_token_ids: tuple[int, ...] = ()):
        self.hf = hf_tokenizer
        eos = set(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None:
            eos.add(hf_tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)

    @classmethod
    def from_folder(cls, folder: Path, eos_token_ids: tuple[int, ...] = (), gguf_file: str | None = None) -> "Tokenizer":
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file, trust_remote_code=False)
        except Exception as e:  # transformers raises many types for a bad folder
            raise ModelLoadError(f"cannot load the tokenizer from {folder}: {str(e).splitlines()[0]}") from None
        return cls(hf, eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
                raise UserError("each message needs a role (system, user or assistant) and text content")
        if self.hf.chat_template:
            text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # a base model: plain concatenation, the last user turn as the prompt
            text = "\n\n".join(m["content"] for m in messages)
        ids = self.encode(text)
        bos = self.hf.bos_token_id
        # Templates that do not write BOS themselves rely on the tokenizer adding it.
        if bos is not None and getattr(self.hf, "add_bos_token", False) and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)


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
