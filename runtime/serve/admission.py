"""Request admission for both HTTP servers: what one request may cost, decided before it runs and in bounded time.

A request passes, in order::

    body = await read_body(request, max_bytes, timeout_s)        # 413 over the size, 408 past the deadline
    req = parse_body(body, Model, {"prompt": 1024, "stop": 16})  # 400: not UTF-8 / JSON / an object, NaN or
                                                                 # Infinity, a lone surrogate, a list too long
    at_most(len(prompts) * max_tokens, 32768, "...", "max_tokens")   # the work it asks for (400)
    async with admitted(state, worker, limits): ...               # 429 when the queue is full
        await watched(request, work)                              # the work stops when the client leaves (499)

The limits every request meets the same way on both servers (body size and time, queue, keep-alive, shutdown
grace) are :class:`TransportLimits`; each app's ``Limits`` extends them with what its requests ask for.

Every refusal is a :class:`~ooospec.runtime.serve.http.RequestError`, answered in OpenAI's error shape.
:func:`parse_body` checks raw list lengths BEFORE pydantic validates (a 2M-item list of wrong types would
otherwise build a 2M-entry error list), and rejects non-finite numbers while parsing; the parse and the
validation run in a worker thread (:func:`read_request`), so ``/health`` answers meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from ooospec.runtime.serve.http import RequestError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

DISCONNECT_POLL_S = 0.05       # how often a running request checks whether its client is still there
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")   # \ud800..\udfff: a pair is fine, a lone one is not text


@dataclasses.dataclass(frozen=True)
class TransportLimits:
    """What any request may cost a server before its content is looked at; both apps' ``Limits`` extend these
    (the sidecar's with a larger body: a wave repeats its block in every prompt)."""

    max_body_bytes: int = 4 << 20       # 413 (read_body)
    max_waiting: int = 8                # 429 (admitted): requests queued behind the running one
    body_timeout_s: float = 30.0        # 408 (read_body): the whole body must arrive within this
    keep_alive_s: float = 5.0           # a connection with no request for this long is closed (server_config)
    shutdown_grace_s: float = 3.0       # SIGTERM: running requests get this long, then stop at their next forward


L = TypeVar("L", bound=TransportLimits)


def override_limits(limits: L, items: Sequence[str]) -> L:
    """``limits`` (a frozen ``Limits`` dataclass) with ``KEY=VALUE`` overrides, the serve CLIs' ``--limit``.

    Raises ValueError naming the bad item: an unknown key (the message lists the known ones), a value that is not
    a number of the field's type, or one that is not finite and > 0.
    """
    fields = {f.name for f in dataclasses.fields(limits)}
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            raise ValueError(f"--limit {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(fields))}")
        kind = type(getattr(limits, key))
        try:
            value = kind(raw.strip())
        except ValueError:
            raise ValueError(f"--limit {key}: {raw!r} is not a{'n' if kind is int else ''} {kind.__name__}") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--limit {key}: {raw!r} must be finite and > 0")
        changes[key] = value
    return dataclasses.replace(limits, **changes)


def at_most(value: int, limit: int, what: str, param: str | None = None) -> None:
    """400 ``"{what} is {value}, over the limit of {limit}"`` when ``value > limit``."""
    if value > limit:
        raise RequestError(400, f"{what} is {value}, over the limit of {limit}", param)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body: 413 over ``limit`` bytes (announced or not), 408 when it has not fully arrived within
    ``timeout_s`` seconds, 499 when the client closes the connection first."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestError(400, f"bad Content-Length {length[:20]!r}")
        if int(length) > limit:
            raise RequestError(413, f"request body of {int(length)} bytes is over the limit of {limit}")
    chunks, total = [], 0
    with anyio.move_on_after(timeout_s) as deadline:
        try:
            async for chunk in request.stream():
                total += len(chunk)
                if total > limit:
                    raise RequestError(413, f"request body over the limit of {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:
            raise RequestError(499, f"the client closed the connection after {total} body bytes") from None
    if deadline.cancelled_caught:
        raise RequestError(408, f"the request body did not arrive within {timeout_s:g} s ({total} bytes came)")
    return b"".join(chunks)


def _reject_constant(name: str) -> float:
    raise RequestError(400, f"{name} is not a valid JSON number; send finite numbers only")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise RequestError(400, f"the number {text[:30]} overflows a double; send finite numbers only")
    return x


def parse_body(body: bytes, model: type[M], max_items: Mapping[str, int]) -> M:
    """``body`` as ``model``; 400 (naming the first offending field) unless it is a UTF-8 JSON object of finite
    numbers and valid Unicode strings whose top-level lists in ``max_items`` hold at most that many items.

    >>> parse_body(b'{"temperature": NaN}', Model, {})          # RequestError(400, "NaN is not a valid ...")
    >>> parse_body(b'{"prompt": [0, 0, ...2M]}', Model, {"prompt": 1024})   # 400 at once, before pydantic
    """
    try:
        text = body.decode("utf-8")
        raw: Any = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except UnicodeDecodeError:
        raise RequestError(400, "request body is not UTF-8") from None
    except (ValueError, RecursionError):
        raise RequestError(400, "request body is not valid JSON") from None
    if not isinstance(raw, dict):
        raise RequestError(400, f"request body must be a JSON object, got {type(raw).__name__}")
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(raw, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff without its pair), "
                                    "which is not text") from None
    for field, limit in max_items.items():
        value = raw.get(field)
        if isinstance(value, list) and len(value) > limit:
            raise RequestError(400, f"{field}: {len(value)} items, over the limit of {limit}", field)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        first = e.errors(include_url=False, include_input=False)[0]
        loc = ".".join(map(str, first["loc"]))
        raise RequestError(400, f"invalid request: {loc[:100]}: {first['msg'][:200]}",
                           str(first["loc"][0])[:40] if first["loc"] else None) from None


async def read_request(request: Request, model: type[M], limits: TransportLimits, *,
                       max_items: Mapping[str, int]) -> M:
    """:func:`read_body` (``limits.max_body_bytes``, ``limits.body_timeout_s``) then :func:`parse_body` in a worker
    thread (the event loop keeps serving)."""
    body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
    return await anyio.to_thread.run_sync(parse_body, body, model, max_items)


@asynccontextmanager
async def admitted(state: dict, worker: Any, limits: TransportLimits) -> AsyncIterator[None]:
    """Hold the server's one ``worker`` lock for a request: 429 when ``limits.max_waiting`` requests already wait.

    ``state["waiting"]`` / ``state["running"]`` count the queue for ``/health``; a request cancelled while it waits
    (the client went away) leaves the count right.
    """
    if state["waiting"] >= limits.max_waiting:
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


async def watched(request: Request, work: Callable[[threading.Event], Awaitable[T]]) -> T:
    """``await work(stop)`` while watching the client: ``stop`` is set when it disconnects or when this request is
    cancelled (server shutdown past its grace period), and ``work`` -- which polls ``stop`` between forwards --
    then ends at its next forward. A client that left gets :class:`RequestError` 499 (never sent, logged once).
    """
    stop, left = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    async def watch() -> None:
        try:
            while not await request.is_disconnected():
                await anyio.sleep(DISCONNECT_POLL_S)
            left.set()
        finally:
            stop.set()                  # also on cancellation: a shutdown ends the work at its next forward
        tg.cancel_scope.cancel()        # stop waiting in the queue too

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        try:
            box["result"] = await work(stop)
        except Exception as e:  # noqa: BLE001 - re-raised below, outside the task group
            box["error"] = e
        finally:
            if not left.is_set():
                tg.cancel_scope.cancel()    # the work is over: stop watching
    if "result" in box:
        return box["result"]
    if left.is_set():
        raise RequestError(499, "the client closed the request; its work was abandoned")
    raise box["error"]
