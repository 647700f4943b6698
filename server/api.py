"""The HTTP routes: /v1/chat/completions (streamed or not), /v1/models, /health, and OpenAI-style errors.

Every failure a client can cause ends as a 4xx JSON error object; anything else as a 500 with one line.
The server stays up either way."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.errors import UserError
from engine.types import SamplingParams
from server import protocol
from server.protocol import ChatRequest, RequestError
from server.scheduler import EngineFailed, Job, QueueFull, Scheduler

log = logging.getLogger("uvicorn.error")


@dataclass(frozen=True)
class ServeOptions:
    api_key: str | None = None
    # A request body past this is refused before it is read: 4 MiB is about a million tokens of text,
    # more than any context this engine holds.
    max_body_bytes: int = 4 << 20


def build_app(engine, scheduler: Scheduler, options: ServeOptions = ServeOptions()) -> Starlette:
    created = int(time.time())
    max_len = engine.runner.max_len

    def model_card() -> dict:
        return {"id": engine.model_name, "object": "model", "created": created, "owned_by": "localchat",
                protocol.EXTENSION: {"draft": engine.draft_name, "has_draft": engine.has_draft,
                                     "draft_steps": engine.speculator.k if engine.has_draft else 0,
                                     "speculation_default": scheduler.spec_default,
                                     "speculation_note": scheduler.spec_note,
                                     "speculation_default_sampled": scheduler.spec_sampled[0],
                                     "speculation_note_sampled": scheduler.spec_sampled[1],
                                     "max_model_len": max_len, "device": engine.device}}

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": engine.model_name, "decoding": scheduler.is_decoding,
                             "waiting": scheduler.num_waiting})

    async def models(request: Request) -> Response:
        _authorize(request, options.api_key)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        _authorize(request, options.api_key)
        if request.path_params["name"] != engine.model_name:
            raise RequestError(404, f"no model {request.path_params['name']!r} here; this server has "
                                    f"{engine.model_name!r}", "model", "model_not_found")
        return JSONResponse(model_card())

    async def chat_completions(request: Request) -> Response:
        _authorize(request, options.api_key)
        req = protocol.parse_chat_request(await _read_json(request, options.max_body_bytes))
        prompt_ids = _prompt_ids(engine, req.messages, max_len)
        try:
            params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                                    repetition_penalty=req.repetition_penalty, seed=req.seed, stop=req.stop,
                                    # A longer answer than the context holds stops at its end, as in the app.
                                    max_tokens=min(req.max_tokens or max_len, max_len - len(prompt_ids)))
        except UserError as e:
            raise RequestError(400, str(e)) from None
        job = Job(prompt_ids, params, req.speculative, asyncio.get_running_loop())
        try:
            scheduler.submit(job)
        except QueueFull as e:
            raise RequestError(429, str(e), code="rate_limit_exceeded", kind="requests",
                               headers={"Retry-After": str(e.retry_after_s)}) from None
        reply = _Reply(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), engine.model_name, req, len(prompt_ids))
        if req.stream:
            return _EventStream(reply.events(job), scheduler, job)
        return await _whole(request, scheduler, job, reply)

    routes = [Route("/health", _guarded(health)), Route("/v1/models", _guarded(models)),
              Route("/v1/models/{name:path}", _guarded(model)),
              Route("/v1/chat/completions", _guarded(chat_completions), methods=["POST"])]
    handlers = {RequestError: _request_error, HTTPException: _http_error}
    return Starlette(routes=routes, exception_handlers=handlers)


class _Reply:
    """One answer's identity and the bodies it is sent as."""

    def __init__(self, request_id: str, created: int, model: str, req: ChatRequest, prompt_tokens: int):
        self.request_id, self.created, self.model, self.req = request_id, created, model, req
        self.prompt_tokens = prompt_tokens

    def _chunk(self, delta: dict, **kw) -> str:
        body = protocol.chunk(self.request_id, self.created, self.model, delta, **kw)
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    async def events(self, job: Job):
        """Server-sent events: a role chunk, text chunks (each carrying the running token count in our
        extension), the finish chunk with our figures, the usage chunk when asked for, [DONE]."""
        ids_wanted = self.req.return_token_ids
        yield self._chunk({"role": "assistant", "content": ""})
        num_tokens, last = 0, None
        try:
            async for events in job.updates():
                parts = []
                for event in events:
                    num_tokens += len(event.token_ids)
                    last = event
                    if event.text or (ids_wanted and event.token_ids):
                        parts.append(self._chunk({"content": event.text}, extension=_running(event, num_tokens),
                                                 token_ids=event.token_ids if ids_wanted else None))
                if parts:
                    yield "".join(parts)
        except EngineFailed as e:
            yield f"data: {json.dumps(protocol.error_body(str(e), 'server_error'))}\n\n"
            return
        stats = last.stats if last else None
        usage = protocol.usage(self.prompt_tokens, num_tokens, stats, job.queue_s)
        tail = self._chunk({}, reason=protocol.finish_reason(last.finish_reason if last else None),
                           extension=dict(usage[protocol.EXTENSION], completion_tokens=num_tokens))
        if self.req.include_usage:
            body = protocol.usage_chunk(self.request_id, self.created, self.model, usage)
            tail += f"data: {json.dumps(body)}\n\n"
        yield tail + "data: [DONE]\n\n"


def _running(event, num_tokens: int) -> dict:
    """What a text chunk says of the answer so far: its tokens (a verify step may add several) and, with
    speculation, the accepted length until now, so that a client can show both live."""
    figures = {"completion_tokens": num_tokens, "speculative": event.stats.speculative}
    if event.stats.speculative:
        figures["accept_len_mean"] = round(event.stats.accept_len_mean, 3)
    return figures


class _EventStream(StreamingResponse):
    """Starlette stops sending when the client disconnects; the job must stop too, at the engine's next step
    (or leave the queue), whatever point the stream had reached."""

    def __init__(self, content, scheduler: Scheduler, job: Job):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.scheduler, self.job = scheduler, job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.scheduler.cancel(self.job)


async def _whole(request: Request, scheduler: Scheduler, job: Job, reply: _Reply) -> Response:
    """A non-streamed answer; a client that disconnects while it waits stops it as a streaming one does."""
    gone = asyncio.ensure_future(_disconnected(request))
    text, ids, last = [], [], None
    try:
        async def collect() -> None:
            nonlocal last
            async for events in job.updates():
                for event in events:
                    text.append(event.text)
                    ids.extend(event.token_ids)
                    last = event

        work = asyncio.ensure_future(collect())
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client left: nothing to send
            scheduler.cancel(job)
            work.cancel()
            return Response(status_code=499)
        try:
            work.result()
        except EngineFailed as e:
            raise RequestError(500, str(e), kind="server_error") from None
    finally:
        gone.cancel()
        scheduler.cancel(job)  # a no-op once the job is done
    usage = protocol.usage(reply.prompt_tokens, len(ids), last.stats if last else None, job.queue_s)
    body = protocol.completion(reply.request_id, reply.created, reply.model, "".join(text),
                               last.finish_reason if last else None, usage,
                               ids if reply.req.return_token_ids else None)
    return JSONResponse(body)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_json(request: Request, limit: int):
    too_big = RequestError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise too_big
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise RequestError(400, "the request body is not UTF-8 text") from None
    except ValueError as e:
        raise RequestError(400, f"the request body is not valid JSON ({e})") from None


def _prompt_ids(engine, messages: list[dict], max_len: int) -> list[int]:
    try:
        ids = engine.tokenizer.apply_chat_template(messages, max_len=max_len)
    except UserError as e:
        raise RequestError(400, str(e), "messages") from None
    if not ids:
        raise RequestError(400, "the prompt is empty", "messages")
    if len(ids) >= max_len:
        raise RequestError(400, f"the prompt is {len(ids)} tokens but this server's context holds {max_len}; "
                                "shorten the conversation", "messages", "context_length_exceeded")
    return ids


def _authorize(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise RequestError(401, "missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")


def _guarded(endpoint):
    """An unexpected failure becomes a 500 with one line, here: Starlette's last-resort handler would send
    the same but also hand the exception on to uvicorn, which prints its traceback."""
    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except (RequestError, HTTPException):
            raise
        except Exception as e:
            return await _server_error(request, e)

    return run


async def _request_error(request: Request, exc: RequestError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (no such route, wrong method) in the same shape."""
    return JSONResponse(protocol.error_body(f"{exc.detail}: {request.method} {request.url.path}"),
                        status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, text)
    return JSONResponse(protocol.error_body(f"internal error: {text}", "server_error"), status_code=500)
