"""The HTTP face: OpenAI-compatible routes on top of `FrontendManager`.

Streaming responses are Server-Sent Events: ``data: <json>\\n\\n`` per chunk, then
``data: [DONE]``. We wait for the first reply before answering, so a refused request gets a real
HTTP error status instead of a stream that fails halfway. If the client goes away, its handler is
cancelled, and closing its `RequestStream` aborts the request in the scheduler. A response with
several choices streams each one's events (`sse_events`) interleaved, tagged by choice index.

The server listens before the engine is ready: its processes start beside the HTTP loop (loading
the model and, on a GPU, the engine's preparation steps, which can take a minute). Meanwhile
`/health` answers 503 with ``{"status": "starting", "waiting_for": ...}``, the `/v1` routes a 503
error with a `Retry-After` header, and `/metrics` what the API process counted; no request enters
the engine before it is ready. If the start-up fails, the server exits with the error. Once
ready, a watchdog checks the other processes four times a second: when one dies, every open
request ends with a 503 and the server exits with a non-zero status (a supervisor restarts it whole).
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minisgl.core import SamplingParams
from minisgl.message import UserReply

from .args import ServerArgs
from .choices import Choice, gather_or_cancel, total_usage
from .errors import BodyLimit, error, error_body, install_error_handlers
from .frontend import FrontendManager, Lifecycle, RequestFailed
from .launch import Backend, LaunchError
from .metrics import CONTENT_TYPE, CountResponses, Metrics
from .chat import ChatCompletionRequest
from .protocol import CompletionRequest, _Common, quote

T = TypeVar("T")
# (text or None, finish_reason or None, start=False) -> a chunk dict, or with start=True a list of them
ChunkMaker = Callable[..., Any]
DONE = "data: [DONE]\n\n"
ROUTES = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions")
RETRY_AFTER_S = 5  # what a 503 tells a client to wait while the engine starts: a warm-up takes seconds to minutes


class ClientGone(Exception):
    pass


async def until_done_or_gone(request: Request, aw: Awaitable[T], poll_s: float = 0.5) -> T:
    """Await `aw` unless the client disconnects first (then raise ClientGone)."""
    task = asyncio.ensure_future(aw)
    try:
        if await request.is_disconnected():  # tokens may flow faster than poll_s: check every time
            raise ClientGone()
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        task.cancel()  # no-op when done; else (gone, or we are cancelled) stop waiting


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def sse_events(first: UserReply, next_reply: Callable[[], Awaitable[UserReply]], make_chunk: ChunkMaker,
                     include_usage: bool) -> AsyncIterator[str]:
    """The event lines of one streamed request, starting from its first reply.

    Order: the opening chunks (`make_chunk(None, None, start=True)`, a list: chat sends the
    assistant role first), one chunk per reply with text, a final chunk with the finish reason
    and no text, then -- if asked -- a chunk with no choices and the usage, then ``[DONE]``.
    """
    for head in make_chunk(None, None, start=True):
        yield sse(head)
    reply = first
    while True:
        if reply.text:
            yield sse(make_chunk(reply.text, None))
        if reply.finished:
            break
        reply = await next_reply()
    yield sse(make_chunk(None, reply.finish_reason))
    if include_usage:
        yield sse({**make_chunk(None, None), "choices": [], "usage": usage(reply)})
    yield "data: [DONE]\n\n"


def usage(reply: UserReply) -> Dict[str, int]:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


async def merged_events(choices: List[Choice], base: Dict[str, Any], usage_of: Callable[[], Dict[str, int]],
                        include_usage: bool) -> AsyncIterator[str]:
    """Every choice's `sse_events`, interleaved as they come, then one usage chunk and ``[DONE]``.
    A choice that fails (the engine died, the drain time ran out) ends the stream with an error event."""
    lines: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
        try:
            async for line in sse_events(c.first, c.next, lambda *a, **k: c.chunk(base, *a, **k), False):
                if line != DONE:
                    await lines.put(line)
            await lines.put(None)
        except (RequestFailed, ClientGone) as e:
            await lines.put(e)

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        left = len(tasks)
        while left:
            line = await lines.get()
            if isinstance(line, ClientGone):
                return  # nobody to tell
            if isinstance(line, RequestFailed):
                yield sse(error_body(line.status, line.message))
                yield DONE
                return
            if line is None:
                left -= 1
            else:
                yield line
        if include_usage:
            yield sse({**base, "choices": [], "usage": usage_of()})
        yield DONE
    finally:
        for t in tasks:
            t.cancel()


@dataclass
class Served:
    """What the routes share: the settings, the processes behind the server and its counters."""

    args: ServerArgs
    backend: Optional[Backend]
    frontend: Optional[FrontendManager]
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    metrics: Metrics = field(default_factory=Metrics)
    created: int = field(default_factory=lambda: int(time.time()))
    since: float = field(default_factory=time.monotonic)  # when this server began starting

    @property
    def names(self) -> set:
        """The model names a request may use: the served name or the model's path."""
        return {self.args.model_name, self.args.engine.model_path}

    def unknown_model(self, name: str) -> JSONResponse:
        return error(404, f"model {quote(name)} not found: this server serves {self.args.model_name!r}",
                     param="model", code="model_not_found")

    def waiting_for(self) -> Optional[str]:
        return self.backend.waiting_for if self.backend is not None else None

    def refused(self) -> Optional[JSONResponse]:
        """The 503 for a request the server cannot take now (None when it can). While the engine
        starts, it says what start-up waits for and when to come back (`Retry-After`)."""
        message = self.lifecycle.refusal()
        if message is None:
            return None
        if not self.lifecycle.starting:
            return error(503, message)
        waiting = self.waiting_for()
        message += (f" (waiting for {waiting})" if waiting else "") + f"; retry in {RETRY_AFTER_S} s"
        return error(503, message, code="engine_starting", headers={"Retry-After": str(RETRY_AFTER_S)})


def create_app(args: ServerArgs, backend: Optional[Backend]) -> FastAPI:
    s = Served(args, backend, FrontendManager(backend.addrs) if backend is not None else None)
    app = FastAPI(title="minisgl", lifespan=_lifespan(s))
    app.state.lifecycle, app.state.frontend, app.state.metrics = s.lifecycle, s.frontend, s.metrics
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=args.server.max_request_bytes)
    app.add_middleware(CountResponses, metrics=s.metrics, routes=ROUTES)  # outermost: it sees the 413s too
    _status_routes(app, s)
    _model_routes(app, s)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        return await respond(s, request, body, [body.template_prompt()], chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await respond(s, request, body, body.prompts(), chat=False, echo=body.echo)

    return app


async def start_then_watch(s: Served) -> None:
    """Start the engine's processes while the routes answer "starting"; then mark the server ready
    and watch them. A failed start-up ends the server (its processes are stopped already)."""
    try:
        await s.backend.start_async()
    except Exception as e:  # LaunchError names the process and its error; anything else is named here
        s.lifecycle.failed = str(e) if isinstance(e, LaunchError) else f"{type(e).__name__}: {e}"
        s.lifecycle.stop_serving()
        return
    s.lifecycle.ready = True
    s.lifecycle.on_ready()
    while not s.lifecycle.dead:
        await asyncio.sleep(0.25)
        dead = s.backend.dead()
        if dead:
            s.lifecycle.dead = ", ".join(dead)
            s.frontend.fail_all(503, s.lifecycle.refusal())
            await asyncio.sleep(0.5)  # the handlers answer their clients
            s.lifecycle.stop_serving()


def _lifespan(s: Served) -> Callable:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s.frontend.start()
        engine = asyncio.get_running_loop().create_task(start_then_watch(s))  # the port opens meanwhile
        yield
        engine.cancel()  # a start-up still running stops its processes as it ends
        await asyncio.gather(engine, return_exceptions=True)
        s.backend.stop()
        await s.frontend.stop()

    return lifespan


def _status_routes(app: FastAPI, s: Served) -> None:
    frontend, lifecycle, metrics = s.frontend, s.lifecycle, s.metrics

    @app.get("/health")
    async def health() -> JSONResponse:
        if lifecycle.starting:
            body = {"status": "starting", "waiting_for": s.waiting_for(),
                    "starting_for_s": round(time.monotonic() - s.since, 1)}
            return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        refused = s.refused()
        if refused:
            return refused
        try:
            st = await frontend.status(timeout_s=2.0)
        except asyncio.TimeoutError:  # alive (the watchdog says so) and in a long step
            last = {k: v for k, v in vars(frontend.last_status).items() if k != "uid"} if frontend.last_status else {}
            message = "the scheduler is in a long step; these counts are from before it"
            return JSONResponse({**last, "status": "busy", "message": message})
        body = {k: v for k, v in vars(st).items() if k != "uid"}
        return JSONResponse({"status": "ok", **body})

    @app.get("/metrics")
    async def prometheus() -> Response:
        if lifecycle.ready and not lifecycle.dead:  # else: only what the API process counts
            try:
                await frontend.status(timeout_s=1.0)
            except asyncio.TimeoutError:
                pass  # busy: report the last counts
        metrics.scheduler.status = frontend.last_status
        return Response(metrics.render(), media_type=CONTENT_TYPE)


def _model_routes(app: FastAPI, s: Served) -> None:
    def card() -> Dict[str, Any]:
        return {"id": s.args.model_name, "object": "model", "created": s.created, "owned_by": "minisgl",
                "max_model_len": s.backend.info["max_seq_len"]}

    @app.get("/v1/models")
    async def models() -> Any:
        return s.refused() or {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Any:
        return s.refused() or (card() if model_id in s.names else s.unknown_model(model_id))


async def respond(s: Served, request: Request, body: _Common, prompts: List[Any], chat: bool,
                  echo: bool = False) -> Any:
    """Submit every (prompt, choice) pair, wait for each first reply, then answer whole or as a stream."""
    if body.model not in s.names:
        return s.unknown_model(body.model)
    refused = s.refused()
    if refused:
        return refused
    params = [body.sampling_params(j) for j in range(body.n)]  # a refused value fails here, before any submit
    wait = lambda aw: until_done_or_gone(request, aw)  # noqa: E731
    choices: List[Choice] = []
    try:
        if body.n > 1 and s.args.scheduler.prefix_cache == "radix":
            await gather_or_cancel([warm_up(s, p, chat, wait) for p in prompts])
        for i, prompt in enumerate(prompts):
            for j, p in enumerate(params):
                stream = await s.frontend.submit(prompt, chat, p, body.limit() is None, body.stop_list(), echo)
                choices.append(Choice(i * body.n + j, stream, chat, p.logprobs >= 0, wait,
                                      tools=chat and body.offers_tools()))
        await gather_or_cancel([c.next() for c in choices])
        base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{choices[0].stream.uid}", "created": int(time.time()),
                "model": s.args.model_name}
        if not body.stream:
            await gather_or_cancel([c.finish() for c in choices])
            record(s, choices, body.n)
            kind = "chat.completion" if chat else "text_completion"
            return {**base, "object": kind, "choices": [c.final() for c in choices],
                    "usage": total_usage(choices, len(prompts))}
    except RequestFailed as e:
        return error(e.status, e.message)
    except ClientGone:
        return error(499, "client closed the request")
    finally:
        if not body.stream or not all(c.first for c in choices):
            close(choices)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    return StreamingResponse(stream_events(s, choices, base, len(prompts), body.n, include_usage),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def stream_events(s: Served, choices: List[Choice], base: Dict[str, Any], prompts: int, n: int,
                        include_usage: bool) -> AsyncIterator[str]:
    try:
        async for line in merged_events(choices, base, lambda: total_usage(choices, prompts), include_usage):
            yield line
        record(s, choices, n)
    finally:
        close(choices)  # runs on normal end, on ClientGone, and when Starlette cancels us


async def warm_up(s: Served, prompt: Any, chat: bool, wait: Callable) -> None:
    """Run the prompt alone with one token to generate, so its KV lands in the radix cache."""
    stream = await s.frontend.submit(prompt, chat, SamplingParams(max_tokens=1))
    try:
        while not (await wait(stream.next())).finished:
            pass
    finally:
        stream.close()


def record(s: Served, choices: List[Choice], n: int) -> None:
    now = time.monotonic()
    for c in choices:
        if c.last is not None and c.last.finished:
            first_of_prompt = c.index % n == 0  # its siblings share the prompt
            s.metrics.observe_choice(c.last.prompt_tokens if first_of_prompt else 0, c.last.completion_tokens,
                                     c.first_token_s, now - c.submitted)


def close(choices: List[Choice]) -> None:
    for c in choices:
        c.stream.close()  # aborts the request unless it finished
