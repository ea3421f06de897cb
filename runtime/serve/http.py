"""What the HTTP servers share: OpenAI-style error answers, the loopback check, the uvicorn server they run on.

    raise RequestError(400, "max_tokens=0 outside [1, 512]", "max_tokens")   # -> refuse(e): the 400 answer
    uvicorn.Server(server_config(app, host="127.0.0.1", port=8000, keep_alive_s=5, grace_s=3)).run()

What one request may cost (body, lists, work, queue, disconnects) is :mod:`ooospec.runtime.serve.admission`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

ABORTED = (408, 499)      # the client was too slow or went away: logged in one line, the answer is best effort


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


def refuse(request: Request, e: RequestError) -> JSONResponse:
    """The answer to a refused request; an aborted one (408 / 499) also gets one log line, never a traceback."""
    if e.status in ABORTED:
        logger.info("aborted %s %s (%d): %s", request.method, request.url.path, e.status, e.message)
    return error_response(e.status, e.message, e.param)


def add_error_handlers(app: FastAPI) -> None:
    """Every failure answers in OpenAI's error shape: RequestError with its status, anything else with a JSON 500
    (logged with its traceback: that one is a bug)."""

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError):
        return refuse(request, exc)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        logger.exception("request failed")
        return error_response(500, f"internal error: {type(exc).__name__}")


def is_loopback(host: str) -> bool:
    """``"127.0.0.1"``, ``"::1"`` and ``"localhost"`` are; ``"0.0.0.0"`` is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class IdleTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that sends no complete request head within
    ``timeout_keep_alive`` seconds -- of opening, or of its last response (uvicorn alone times out only an idle
    keep-alive connection, and stops counting at its first byte). The body has its own deadline
    (:func:`~ooospec.runtime.serve.admission.read_body`)."""

    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle and self._head_deadline is not None:    # a request head arrived
            self._head_deadline.cancel()
            self._head_deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self.timeout_keep_alive, self._close_idle)

    def _close_idle(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            logger.info("closed a connection that sent no request within %s s", self.timeout_keep_alive)
            self.transport.close()


def server_config(app: FastAPI, *, host: str, port: int, keep_alive_s: float, grace_s: float):
    """The uvicorn config both servers run with: idle connections closed after ``keep_alive_s``, and on SIGTERM /
    SIGINT running requests get ``grace_s`` seconds before they are cancelled (their work stops at its next
    forward, see :func:`~ooospec.runtime.serve.admission.watched`)."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=IdleTimeoutH11, log_level="warning", access_log=False,
                          timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=grace_s)
