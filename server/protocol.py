"""The OpenAI chat-completions wire format: requests checked into a ChatRequest, responses and errors built.

Fields the engine cannot honour (tools, logprobs, several choices) are refused with a 400 rather than
ignored, so that a client never mistakes an answer for one it did not get; fields that change nothing
here (user, metadata, store, ...) are ignored, as OpenAI-compatible servers do."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.types import MAX_SEED, GenerationStats

# Where our own figures go, in `usage`, in /v1/models and on stream chunks: one name, so that a client
# (the app's remote engine) tells a localchat server from any other by its presence.
EXTENSION = "localchat"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP_STRINGS = 4  # as OpenAI's API


class RequestError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]  # [{"role": system|user|assistant, "content": str}]
    max_tokens: int | None  # None: until EOS or the context is full
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    speculative: bool | None  # None: the server's default (on when a draft is loaded)
    return_token_ids: bool  # vLLM's extension: the answer's token ids beside its text


def parse_chat_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    _refuse_unsupported(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(400, "stream_options must be an object", "stream_options")
    max_tokens = _number(body, "max_completion_tokens", int, None, lambda v: v >= 1, "must be >= 1")
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, None, lambda v: v >= 1, "must be >= 1")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        max_tokens=max_tokens,
        # OpenAI's defaults: a client that leaves a field out gets what it would get there.
        temperature=_number(body, "temperature", float, 1.0, lambda v: 0 <= v <= 2, "must be between 0 and 2"),
        top_p=_number(body, "top_p", float, 1.0, lambda v: 0 < v <= 1, "must be in (0, 1]"),
        top_k=max(0, _number(body, "top_k", int, 0, lambda v: v >= -1, "must be >= 0 (0 or -1: off)")),
        min_p=_number(body, "min_p", float, 0.0, lambda v: 0 <= v < 1, "must be in [0, 1)"),
        repetition_penalty=_number(body, "repetition_penalty", float, 1.0, lambda v: v > 0, "must be > 0"),
        seed=_number(body, "seed", int, None, lambda v: 0 <= v <= MAX_SEED, "must be from 0 to 2**64 - 1"),
        stop=_stop(body.get("stop")),
        stream=_flag(body, "stream", False),
        include_usage=_flag(options or {}, "include_usage", False, "stream_options.include_usage"),
        speculative=_flag(body, "speculative", None),
        return_token_ids=_flag(body, "return_token_ids", False),
    )


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(400, "n must be 1: this server writes one answer per request", "n")
    if body.get("tools") or body.get("functions"):
        raise RequestError(400, "tools and function calling are not supported by this server", "tools")
    if body.get("logprobs"):
        raise RequestError(400, "logprobs are not supported by this server", "logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value not in (None, 0, 0.0):
            raise RequestError(400, f"{name} is not supported; repetition_penalty (> 1 discourages repeats) is",
                               name)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError(400, "response_format other than {\"type\": \"text\"} is not supported", "response_format")


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise RequestError(400, "messages must be a non-empty array of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(400, f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(400, f"{where}.role must be one of system, developer, user, assistant; got {role!r}"
                               [:200], f"{where}.role")
        out.append({"role": ROLES[role], "content": _content(m.get("content"), f"{where}.content")})
    return out


def _content(value: Any, where: str) -> str:
    """A string, or an array of text parts (joined); images and audio are refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(400, f"{where} may hold only text parts ({{\"type\": \"text\", \"text\": ...}})",
                                   where)
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(400, f"{where} must be a string or an array of text parts", where)


def _number(body: dict, name: str, kind: type, default, ok, rule: str):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        wanted = "an integer" if kind is int else "a number"
        raise RequestError(400, f"{name} must be {wanted}, got {_shown(value)}", name)
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise RequestError(400, f"{name} must be an integer, got {value}", name)
        value = int(value)
    elif not math.isfinite(value):
        raise RequestError(400, f"{name} must be a finite number", name)
    else:
        value = float(value)
    if not ok(value):
        raise RequestError(400, f"{name} {rule}, got {_shown(value)}", name)
    return value


def _flag(body: dict, name: str, default, param: str | None = None):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(400, f"{param or name} must be true or false, got {_shown(value)}", param or name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError(400, "stop must be a string or an array of strings", "stop")
    if len(value) > MAX_STOP_STRINGS:
        raise RequestError(400, f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(value)}", "stop")
    return tuple(s for s in value if s)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- responses ------------------------------------------------------------------------------------------

def figures(stats: GenerationStats | None, queue_s: float) -> dict:
    """Our extension: the engine's own figures for one answer. accept_len_mean counts the tokens each verify
    step produced (accepted drafts plus the bonus token, as the EAGLE papers count accepted length)."""
    s = stats or GenerationStats()
    out = {"speculative": s.speculative, "decode_tok_s": round(s.decode_tok_s, 2), "ttft_s": round(s.ttft_s, 4),
           "queue_s": round(queue_s, 4), "prefill_tokens": s.prefill_tokens}
    if s.speculative:
        out.update(draft_steps=s.draft_steps, verify_steps=s.verify_steps,
                   accept_len_mean=round(s.accept_len_mean, 3),
                   tokens_per_verify_step=round(s.accept_len_mean, 3),
                   accepted_drafts_mean=round(max(0.0, s.accept_len_mean - 1), 3), accept_hist=s.accept_hist,
                   verify_tokens=round(s.verify_tokens, 3))
    return out


def usage(prompt_tokens: int, completion_tokens: int, stats: GenerationStats | None, queue_s: float) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, EXTENSION: figures(stats, queue_s)}


def finish_reason(reason: str | None) -> str:
    """The engine's reasons in OpenAI's words ("cancelled" only reaches a client that is gone)."""
    return "length" if reason == "length" else "stop"


def completion(request_id: str, created: int, model: str, text: str, reason: str | None, usage_body: dict,
               token_ids: list[int] | None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish_reason(reason)}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": request_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [choice], "usage": usage_body}


def chunk(request_id: str, created: int, model: str, delta: dict, reason: str | None = None,
          extension: dict | None = None, token_ids: list[int] | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice]}
    if extension is not None:
        body[EXTENSION] = extension
    return body


def usage_chunk(request_id: str, created: int, model: str, usage_body: dict) -> dict:
    """The last chunk with stream_options.include_usage: no choices, the usage."""
    return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage_body}
