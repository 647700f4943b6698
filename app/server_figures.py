"""Speculation figures of OpenAI-compatible servers other than ours, read where they publish them.

Neither vLLM nor SGLang puts its acceptance figures into a chat-completions response by default:
- vLLM counts for the whole server in Prometheus counters at `GET /metrics`
  (`vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_accepted_tokens_total`). Their change
  over one answer gives its verify steps and accepted length (1 + accepted / drafts, the EAGLE
  papers' count): exact when no other client used the server meanwhile.
- SGLang keeps a running average for the whole server, `internal_states[0].avg_spec_accept_length`
  of `GET /server_info` (`/get_server_info` in older versions): the server's figure, not the answer's.

RemoteEngine.connect probes for either once (short timeouts; a server that has neither, or refuses,
simply shows no figures) and asks again after each answer."""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request
from typing import Callable

from engine.types import GenerationStats

TIMEOUT_S = 2.0
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SGLANG_PATHS = ("/server_info", "/get_server_info")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def prometheus_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each named metric's samples summed over their labels (vLLM labels them per model and engine);
    a name with no sample is left out."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m is None or m.group(1) not in names:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + value
    return sums


def http_getter(root: str, api_key: str | None) -> Callable[[str], str | None]:
    """GET root + path -> the body as text, None on any failure (figures are never worth an error)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get(path: str) -> str | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(root + path, headers=headers), timeout=TIMEOUT_S) as r:
                if r.status != 200:
                    return None
                return r.read(4 << 20).decode("utf-8", "replace")
        except (OSError, urllib.error.URLError, ValueError):
            return None

    return get


class VllmCounters:
    """vLLM: the change of its server-wide counters over each answer."""

    kind = "vLLM /metrics"

    def __init__(self, get: Callable[[str], str | None], first: tuple[float, float]):
        self.get, self.last = get, first

    @classmethod
    def probe(cls, get) -> "VllmCounters | None":
        counts = cls._read(get)
        return cls(get, counts) if counts is not None else None

    @staticmethod
    def _read(get) -> tuple[float, float] | None:
        text = get("/metrics")
        if not text:
            return None
        sums = prometheus_sums(text, (VLLM_DRAFTS, VLLM_ACCEPTED))
        if VLLM_DRAFTS not in sums:
            return None  # no speculation configured, or not vLLM
        return sums[VLLM_DRAFTS], sums.get(VLLM_ACCEPTED, 0.0)

    def after_answer(self, stats: GenerationStats) -> None:
        now = self._read(self.get)
        if now is None:
            return
        drafts, accepted = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        if drafts > 0 and accepted >= 0:  # a restarted server's counters go back: no figure then
            stats.speculative = True
            stats.verify_steps = int(round(drafts))
            stats.accept_len_mean = 1.0 + accepted / drafts


class SglangAverage:
    """SGLang: its server-wide average accepted length, after each answer."""

    kind = "SGLang /server_info"

    def __init__(self, get: Callable[[str], str | None], path: str):
        self.get, self.path = get, path

    @classmethod
    def probe(cls, get) -> "SglangAverage | None":
        for path in SGLANG_PATHS:
            if cls._read(get, path, probing=True) is not None:
                return cls(get, path)
        return None

    @staticmethod
    def _read(get, path: str, probing: bool = False) -> float | None:
        text = get(path)
        if not text:
            return None
        try:
            states = json.loads(text).get("internal_states")
            value = states[0].get("avg_spec_accept_length") if states else None
        except (ValueError, AttributeError, TypeError, IndexError, KeyError):
            return None
        if probing and value is None and isinstance(states, list) and states and isinstance(states[0], dict) \
                and "avg_spec_accept_length" in states[0]:
            return 0.0  # SGLang without speculation so far: the field is there, empty
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    def after_answer(self, stats: GenerationStats) -> None:
        value = self._read(self.get, self.path)
        if value is not None and value > 0:
            stats.speculative = True
            stats.accept_len_mean = value


def probe(root: str, api_key: str | None) -> "VllmCounters | SglangAverage | None":
    """The figures a server publishes, if it is a vLLM or SGLang that speculates (root: http://host:port)."""
    get = http_getter(root, api_key)
    return VllmCounters.probe(get) or SglangAverage.probe(get)
