"""The HTTP face: OpenAI-compatible routes on top of `FrontendManager`.

Streaming responses are Server-Sent Events: ``data: <json>\\n\\n`` per chunk, then
``data: [DONE]``. We wait for the first reply before answering, so a refused request gets a real
HTTP error status instead of a stream that fails halfway. If the client goes away, its handler is
cancelled, and closing its `RequestStream` aborts the request in the scheduler.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Dict, List, Optional, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from minisgl.message import UserReply

from .args import ServerArgs
from .frontend import FrontendManager, RequestFailed
from .launch import Backend
from .protocol import ChatCompletionRequest, CompletionRequest, _Common

T = TypeVar("T")
# (text or None, finish_reason or None, start=False) -> a chunk dict, or with start=True a list of them
ChunkMaker = Callable[..., Any]


def error(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


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


async def sse_events(first: UserReply, next_reply: Callable[[], Awaitable[UserReply]], make_chunk: ChunkMaker, include_usage: bool) -> AsyncIterator[str]:
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
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens, "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def create_app(args: ServerArgs, backend: Optional[Backend]) -> FastAPI:
    frontend = FrontendManager(backend.addrs) if backend is not None else None
    names = {args.model_name, args.model}
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        frontend.start()
        yield
        await frontend.stop()

    app = FastAPI(title="minisgl", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return error(400, f"the request body is not valid JSON: {first.get('msg')}")
        field = ".".join(loc) or "body"
        return error(400, f"{field}: {first.get('msg')}", param=field)

    @app.get("/health")
    async def health() -> JSONResponse:
        dead = backend.dead()
        if dead:
            return error(503, f"server processes died: {', '.join(dead)}")
        try:
            st = await frontend.status()
        except asyncio.TimeoutError:
            return error(503, "the scheduler did not answer within 10 s")
        body = {k: v for k, v in vars(st).items() if k != "uid"}
        return JSONResponse({"status": "ok", **body})

    @app.get("/v1/models")
    async def models() -> Dict[str, Any]:
        card = {"id": args.model_name, "object": "model", "created": created, "owned_by": "minisgl", "max_model_len": backend.info["max_seq_len"]}
        return {"object": "list", "data": [card]}

    async def run(request: Request, body: _Common, prompt: Any, chat: bool, make_chunk, make_final) -> Any:
        if body.model not in names:
            return error(404, f"model {body.model!r} not found: this server serves {args.model_name!r}", param="model", code="model_not_found")
        stream = await frontend.submit(prompt, chat, body.sampling_params(), body.limit() is None, body.stop_list())
        try:
            first = await until_done_or_gone(request, stream.next())
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{first.uid}"
            if not body.stream:
                replies = [first]
                while not replies[-1].finished:
                    replies.append(await until_done_or_gone(request, stream.next()))
                return make_final(rid, "".join(r.text for r in replies), replies[-1])
        except RequestFailed as e:
            return error(e.status, e.message)
        except ClientGone:
            return error(499, "client closed the request")
        finally:
            if not body.stream or stream.finished:
                stream.close()  # aborts the request unless it finished

        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def events() -> AsyncIterator[str]:
            try:
                async for line in sse_events(first, lambda: until_done_or_gone(request, stream.next()), functools.partial(make_chunk, rid), include_usage):
                    yield line
            except ClientGone:
                pass  # nobody to tell; closing the stream below aborts the request
            finally:
                stream.close()  # runs on normal end, on ClientGone, and when Starlette cancels us

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]

        def chunk(rid: str, text: Optional[str], reason: Optional[str], start: bool = False) -> Any:
            base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": args.model_name}
            if start:
                return [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
            delta = {"content": text} if text is not None else {}
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

        def final(rid: str, text: str, last: UserReply) -> Dict[str, Any]:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": last.finish_reason}
            return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": args.model_name, "choices": [choice], "usage": usage(last)}

        return await run(request, body, messages, True, chunk, final)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        def chunk(rid: str, text: Optional[str], reason: Optional[str], start: bool = False) -> Any:
            if start:
                return []  # completions streams have no role chunk
            base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": args.model_name}
            return {**base, "choices": [{"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}]}

        def final(rid: str, text: str, last: UserReply) -> Dict[str, Any]:
            choice = {"index": 0, "text": text, "finish_reason": last.finish_reason, "logprobs": None}
            return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": args.model_name, "choices": [choice], "usage": usage(last)}

        return await run(request, body, body.prompt, False, chunk, final)

    return app
