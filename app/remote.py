"""RemoteEngine: the app as the client of an OpenAI-compatible server (`localchat --remote URL`).

It has the shape of `engine.Engine` that the engine thread uses (app/engine_worker.py: ChatEngine), so the
chat, its history and the status bar work unchanged. Speed and time to first token are measured here, on
the client; the speculation figures come from the server when it is a `localchat serve` (its
"localchat" extension), which also takes speculation on or off per request, or from where vLLM and
SGLang publish theirs (app/server_figures.py)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

from engine.errors import UserError
from engine.types import GenerationStats, SamplingParams, StreamEvent

EXTENSION = "localchat"  # server/protocol.py: where a localchat server puts its own figures
CONNECT_TIMEOUT_S = 10.0
STOP_POLL_S = 0.05  # how soon Esc closes a stream that is waiting for the server's next chunk
_FIGURES = ("speculative", "draft_steps", "verify_steps", "accept_len_mean", "accept_hist")


class RemoteError(UserError):
    """The server cannot be reached, refused the request, or broke off: one line for the user."""


@dataclass(frozen=True)
class RemoteChoice:
    """Which server to use: from --remote, or the wizard's "Connect to a server"."""

    url: str
    api_key: str | None = None
    model: str | None = None  # None: the first model the server lists

    @property
    def base_url(self) -> str:
        """The API root the client calls: scheme added, ending in /v1 (what every such server serves)."""
        url = self.url.strip().rstrip("/")
        if "://" not in url:
            url = "http://" + url
        return url if url.endswith("/v1") else url + "/v1"

    @property
    def label(self) -> str:
        """The server as the status bar names it: http://host:port, without the /v1."""
        return self.base_url[: -len("/v1")]


class RemoteEngine:
    device = "remote"

    def __init__(self, client, choice: RemoteChoice, model_name: str, card: dict, figures=None):
        self.client = client
        # Another server's own speculation figures (vLLM's counters, SGLang's average), read after
        # each answer: app/server_figures.py. None: ours, or a server that publishes none.
        self.figures = figures
        self.url = choice.label
        self.model_name = model_name
        ours = card.get(EXTENSION)
        self.is_localchat = isinstance(ours, dict)  # our server: per-request speculation and its figures
        self.draft_name = ours.get("draft") if self.is_localchat else None
        self.has_draft = bool(self.is_localchat and ours.get("has_draft"))
        self.draft_steps = ours.get("draft_steps", 0) if self.has_draft else 0
        # our server's default for requests that do not say (off where speculation is slower there)
        self.spec_default = bool(ours.get("speculation_default", True)) if self.is_localchat else True
        self.spec_note = str(ours.get("speculation_note") or "") if self.is_localchat else ""
        # and for sampled requests (a server before this field: the same)
        self.spec_sampled = (bool(ours.get("speculation_default_sampled", self.spec_default)),
                             str(ours.get("speculation_note_sampled") or self.spec_note)) \
            if self.is_localchat else (True, "")

    def speculation_pays(self, log=None, sampled: bool = False) -> tuple[bool, str]:
        """The server knows its hardware: what a localchat server says it defaults to there (and
        why), for greedy or sampled answers, else the switch stays as the user set it."""
        default, note = self.spec_sampled if sampled else (self.spec_default, self.spec_note)
        if self.has_draft and not default:
            return False, note or "slower on the server"
        return True, ""

    @classmethod
    def connect(cls, choice: RemoteChoice, on_progress=None) -> "RemoteEngine":
        """Asks the server for its models; the chosen one (or its first) answers from then on."""
        import openai

        scheme = urlsplit(choice.base_url).scheme
        if scheme not in ("http", "https"):
            raise RemoteError(f"{choice.url} is not an http:// or https:// address")
        if on_progress is not None:
            on_progress(f"Connecting to {choice.label}", None)
        # An explicit key (even a placeholder): the client would otherwise read OPENAI_API_KEY and send
        # the user's OpenAI key to whatever server this is.
        client = openai.OpenAI(base_url=choice.base_url, api_key=choice.api_key or "none", max_retries=1,
                               timeout=openai.Timeout(None, connect=CONNECT_TIMEOUT_S))
        try:
            cards = [m.model_dump() for m in client.models.list().data]
        except openai.APIError as e:
            raise RemoteError(describe(e, choice.label)) from None
        names = [c.get("id") for c in cards]
        if choice.model is not None:
            if names and choice.model not in names:
                raise RemoteError(f"{choice.label} has no model {choice.model!r}; it serves: "
                                  + ", ".join(map(str, names)))
            name = choice.model
        elif names:
            name = names[0]
        else:
            raise RemoteError(f"{choice.label} lists no models; name one with --remote-model")
        card = next((c for c in cards if c.get("id") == name), {})
        figures = None
        if not isinstance(card.get(EXTENSION), dict):
            from app import server_figures

            if on_progress is not None:
                on_progress(f"Asking {choice.label} for its speculation figures", None)
            figures = server_figures.probe(choice.label, choice.api_key)
        return cls(client, choice, name, card, figures)

    def without_draft(self, if_fits: bool = False) -> "RemoteEngine":
        """The server keeps its draft loaded: the compare screen's off side asks it for plain
        decoding (`"speculative": false`), and says that it divided by that."""
        return self

    def stream(self, messages: list[dict], params: SamplingParams = SamplingParams(),
               speculative: bool | None = None, stop_event: threading.Event | None = None,
               t0: float | None = None) -> Iterator[StreamEvent]:
        t0 = time.perf_counter() if t0 is None else t0
        stop_event = stop_event or threading.Event()
        # What the answer will be, until the server's figures say: as the local engine has it from the start.
        is_spec = self.has_draft and speculative is not False
        # A server other than ours decides speculation itself and does not say: None, not "off".
        stats = GenerationStats(speculative=is_spec if self.is_localchat else None,
                                draft_steps=self.draft_steps if is_spec else 0, draft_loaded=self.has_draft)
        try:
            response = self.client.chat.completions.create(**self._request(messages, params, speculative))
        except Exception as e:
            raise RemoteError(describe(e, self.url)) from None
        done = threading.Event()
        threading.Thread(target=_close_on_stop, args=(response, stop_event, done), daemon=True).start()
        reason, num_tokens, first = "stop", 0, None  # first: (time, tokens) at the first text
        try:
            for chunk in response:
                extra = chunk.model_extra or {}
                ours = extra.get(EXTENSION) or {}
                text = ""
                for choice in chunk.choices:
                    text += (choice.delta.content or "") if choice.delta else ""
                    reason = choice.finish_reason or reason
                usage = chunk.usage.model_dump() if chunk.usage is not None else None
                if usage is not None:
                    stats.prompt_tokens = usage.get("prompt_tokens") or 0
                    num_tokens = usage.get("completion_tokens") or num_tokens
                    ours = usage.get(EXTENSION) or ours
                elif "completion_tokens" in ours:
                    num_tokens = ours["completion_tokens"]
                elif text:
                    num_tokens += 1  # most servers send one token per chunk
                for name in _FIGURES:
                    if name in ours:
                        setattr(stats, name, ours[name])
                now = time.perf_counter()
                if text and first is None:
                    first = (now, num_tokens)
                    stats.ttft_s = now - t0
                _measure(stats, num_tokens, first, now)
                if text:
                    yield StreamEvent(text, [], stats)
        except Exception as e:
            if not stop_event.is_set():
                raise RemoteError(describe(e, self.url)) from None
        finally:
            done.set()
            response.close()
        if self.figures is not None:
            self.figures.after_answer(stats)
        if stop_event.is_set():
            reason = "cancelled"
        elif reason != "length":  # the engine's words: anything else a server says ends the answer as EOS does
            reason = "stop"
        yield StreamEvent("", [], stats, finished=True, finish_reason=reason)

    def _request(self, messages: list[dict], params: SamplingParams, speculative: bool | None) -> dict:
        request = dict(model=self.model_name, messages=messages, stream=True, stream_options={"include_usage": True},
                       temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens)
        if params.seed is not None:
            request["seed"] = params.seed
        if params.stop:
            request["stop"] = list(params.stop)
        # Beyond OpenAI's fields, sent only when they change something: vLLM, SGLang, llama.cpp and ours
        # take these names; a server that does not may refuse them.
        extra = {}
        if params.top_k:
            extra["top_k"] = params.top_k
        if params.min_p:
            extra["min_p"] = params.min_p
        if params.repetition_penalty != 1.0:
            extra["repetition_penalty"] = params.repetition_penalty
        if self.is_localchat and speculative is not None:
            extra["speculative"] = speculative
        if extra:
            request["extra_body"] = extra
        return request


def _measure(stats: GenerationStats, num_tokens: int, first: tuple[float, int] | None, now: float) -> None:
    """Speed as the user sees it: tokens after the first text over the time since it came."""
    stats.generated_tokens = num_tokens
    if first is None:
        return
    stats.decode_s = now - first[0]
    if stats.decode_s > 0 and num_tokens > first[1]:
        stats.decode_tok_s = (num_tokens - first[1]) / stats.decode_s


def _close_on_stop(response, stop_event: threading.Event, done: threading.Event) -> None:
    """Esc while the server is silent (a long prefill, a queue): closing the response ends the read at
    once, and the server sees the disconnect and stops decoding."""
    while not done.is_set():
        if stop_event.wait(STOP_POLL_S):
            response.close()
            return


def describe(error: BaseException, url: str) -> str:
    import openai

    if isinstance(error, openai.APIStatusError):
        body = error.body if isinstance(error.body, dict) else {}
        detail = body.get("error", body) if isinstance(body.get("error", body), dict) else {}
        message = detail.get("message") or error.message
        if error.status_code == 401:
            return f"{url} refused the API key ({message}); pass the right one with --api-key"
        if error.status_code == 429:
            return f"{url} is busy ({message}); try again in a moment"
        return f"{url} answered {error.status_code}: {message}"
    if isinstance(error, openai.APITimeoutError):
        return f"{url} did not answer in time"
    if isinstance(error, openai.APIConnectionError):
        cause = error.__cause__ or error.__context__
        return f"cannot reach {url}" + (f" ({_first_line(cause)})" if cause else "")
    return f"{url}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
