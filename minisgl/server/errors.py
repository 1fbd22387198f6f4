"""Every error the server answers is OpenAI's error object, whatever raised it:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "seed", "code": null}}

-- a refused field, a body that is not JSON, an unknown route (404), a wrong method (405), a body
over the size limit (413), a body not in UTF-8 (415), a dead engine (503) or a bug (500). The size
limit, the encoding and the nesting limit are enforced before the body is parsed, so a huge
request costs its upload and nothing more, and a deeply nested one never reaches code that
recurses once per level (Python's JSON parser, pydantic, the encoders between the processes),
where it would end as a 500. An error
message quotes what the client sent only up to `QUOTE_CHARS` characters.
"""

from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

import numpy as np

from minisgl.core import InvalidRequestError

from .protocol import Unsupported, quote

MAX_DEPTH = 64  # arrays and objects inside each other in a request body; real requests use a dozen
MAX_MESSAGE_CHARS = 1000  # any error message, whatever it quotes
_STRING = re.compile(rb'"[^"]*"')  # a JSON string once its escapes are gone
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")

_KIND = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
         413: "invalid_request_error", 415: "invalid_request_error", 503: "service_unavailable"}


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> Dict[str, Any]:
    kind = _KIND.get(status, "invalid_request_error" if status < 500 else "server_error")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    return {"error": {"message": message, "type": kind, "param": param and param[:200], "code": code}}


def error(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
          headers: Optional[Dict[str, str]] = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def validation_message(exc: RequestValidationError) -> tuple[str, Optional[str]]:
    """(message, param) for the first problem pydantic found, named by its dotted path."""
    first = exc.errors()[0]
    loc = [str(p)[:40] for p in first.get("loc", ()) if p != "body"]  # dict keys are the client's text
    kind = first.get("type")
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, Unsupported):  # a model-level check that names its field
        param = ".".join([*loc, cause.param])
        return f"{param}: {str(cause).split(': ', 1)[1]}", param
    field = ".".join(loc) or "body"
    if kind == "extra_forbidden":
        return f"{field}: unknown field; this server does not implement it (see the API's documented fields)", field
    msg = str(cause) if isinstance(cause, ValueError) else first.get("msg", "invalid")
    return f"{field}: {msg}", field


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error(400, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            routes = "/v1/models, /v1/completions, /v1/chat/completions"
            message = f"no route {quote(request.method)} {quote(request.url.path)}: see {routes}"
        elif exc.status_code == 405:
            message = f"{quote(request.method)} is not allowed on {quote(request.url.path)}"
        else:
            message = str(exc.detail)
        return error(exc.status_code, message)

    @app.exception_handler(InvalidRequestError)
    async def invalid(request: Request, exc: InvalidRequestError) -> JSONResponse:
        return error(400, str(exc))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:  # logged by Starlette too
        # the exception text may hold server paths or client text: the log has it
        return error(500, f"internal server error ({type(exc).__name__}); the server's log has the details")


ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def json_depth(body: bytes) -> int:
    """How deeply arrays and objects nest in a JSON text, found without parsing it (so without
    recursion): strings removed, then the running count of brackets opened and not closed."""
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes first: \\" ends a string
    brackets = _STRING.sub(b"", unescaped).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    opens = (np.frombuffer(brackets, dtype=np.uint8) & 2) != 0  # "[" and "{" have bit 1 set, "]" and "}" not
    return int(np.cumsum(np.where(opens, 1, -1)).max())


class BodyLimit:
    """ASGI middleware: read the body up to `max_bytes`, answer 413 beyond it, 415 when it is not
    UTF-8 and 400 when it nests deeper than `MAX_DEPTH`, else hand it on."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, send: Callable[[dict], Awaitable[None]]) -> None:
        await self._refuse(send, 413, f"the request body is over the limit of {self.max_bytes} bytes "
                                      "(--max-request-bytes)")

    async def _refuse(self, send: Callable[[dict], Awaitable[None]], status: int, message: str) -> None:
        body = json.dumps(error_body(status, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large(send)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(send)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        encoding = json.detect_encoding(body) if body else "utf-8"  # what the JSON parser will decode it as
        if encoding not in ("utf-8", "utf-8-sig"):  # json_depth counts UTF-8 bytes only
            return await self._refuse(send, 415, f"the request body is {encoding.upper()}; this server reads JSON "
                                                 "in UTF-8 only (RFC 8259): send it as UTF-8")
        depth = json_depth(body)
        if depth > MAX_DEPTH:
            return await self._refuse(send, 400, f"the request body nests arrays and objects {depth} levels deep; "
                                                 f"this server accepts at most {MAX_DEPTH}")
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:  # the whole body once; then the real channel (disconnects)
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
