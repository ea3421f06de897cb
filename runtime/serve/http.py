"""What the HTTP servers share: OpenAI-style error answers, a bounded body read, the loopback check.

    raise RequestError(400, "max_tokens=0 outside [1, 512]", "max_tokens")   # -> error_response(400, ...)
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class RequestError(Exception):
    """A request a server refuses: ``status`` and an OpenAI-style message."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """``{"error": {"message", "type", "param", "code"}}`` with ``status``, as OpenAI answers errors."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) more than ``limit`` bytes whether or not Content-Length says so."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(400, f"bad Content-Length {length[:20]!r}")
        if int(length) > limit:
            raise RequestError(413, f"request body of {int(length)} bytes is over the limit of {limit}")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise RequestError(413, f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_request(request: Request, model: type[M], limit: int) -> M:
    """The body read within ``limit`` bytes, parsed as JSON and validated as ``model``; a bad one is a 400 that
    names the first offending field."""
    body = await read_body(request, limit)
    try:
        raw: Any = json.loads(body)
    except (ValueError, RecursionError):
        raise RequestError(400, "request body is not valid JSON") from None
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise RequestError(400, f"invalid request: {'.'.join(map(str, first['loc']))}: {first['msg']}",
                           str(first["loc"][0]) if first["loc"] else None) from None


def is_loopback(host: str) -> bool:
    """``"127.0.0.1"``, ``"::1"`` and ``"localhost"`` are; ``"0.0.0.0"`` is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@asynccontextmanager
async def admitted(state: dict, worker: Any, max_waiting: int) -> AsyncIterator[None]:
    """Hold the server's one ``worker`` lock for a request: 429 when ``max_waiting`` requests already wait.

    ``state["waiting"]`` / ``state["running"]`` count the queue for ``/health``; a request cancelled while it waits
    (the client went away) leaves the count right.
    """
    if state["waiting"] >= max_waiting:
        raise RequestError(429, f"{state['waiting']} requests already waiting; retry later")
    state["waiting"] += 1
    queued = True
    try:
        async with worker:
            state["waiting"] -= 1
            queued = False
            state["running"] += 1
            try:
                yield
            finally:
                state["running"] -= 1
    finally:
        if queued:
            state["waiting"] -= 1
