"""The chat server: an OpenAI-compatible ``POST /v1/chat/completions`` with tools, on the speculative engine.

Run it with ``ooospec serve --target NAME [--backend auto|hf|llama.cpp] [--method toolspec|ooospec|ar] [--sidecar
URL] [--host 127.0.0.1] [--port 8000]`` (loopback by default; the server has no authentication). Endpoints:
``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``. Any OpenAI client works::

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    r = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=messages, tools=tools)
    r.choices[0].message.tool_calls[0].function   # name="get_weather", arguments='{"city": "Paris"}'

A request takes ``messages`` (system / user / assistant with ``tool_calls`` / tool), ``tools``, ``tool_choice``
(``"auto"``, ``"none"``, ``"required"`` or a named function, see :mod:`ooospec.runtime.agent.chat`), ``max_tokens`` or
``max_completion_tokens``, ``stream`` (+ ``stream_options.include_usage``). Decoding is greedy and exact:
``temperature`` above 0, ``n`` > 1, ``logprobs`` and ``stop`` are refused with 400. The answer has OpenAI's shape:
``choices[0].message`` with ``content`` or ``tool_calls`` (``[{"id", "type": "function", "function": {"name",
"arguments": JSON text}}]``) and ``finish_reason`` ``tool_calls`` / ``stop`` / ``length``; ``usage`` has
``prompt_tokens_details.cached_tokens`` (prompt tokens whose KV was reused) and ``ooospec`` the turn's timings.

Streaming (SSE, ``chat.completion.chunk``): a first chunk with the role, then -- when no tools are shown -- the
text as it is decoded; with tools, the content or the ``tool_calls`` once the turn is complete (a call is only
known when it parses); a last chunk with ``finish_reason``, a usage chunk when asked, then ``data: [DONE]``.
A client that goes away ends its generation at the next token, streamed or not; so does a shutdown once its
grace period (``shutdown_grace_s``) is over.

Sessions: requests are stateless as in OpenAI's API, and the server finds the conversation they continue by
token prefix (:class:`~ooospec.runtime.agent.session.SessionStore`): the next turn of a tool conversation prefills
only the new tokens; a new conversation with known system + tools starts from the prefix cache.

Limits (:class:`Limits`, checked by :mod:`~ooospec.runtime.serve.admission` before any decoding, all answered with
4xx and an OpenAI-style ``{"error": {...}}`` body): body size (413) and the time it may take to arrive (408),
messages, tools, prompt tokens, ``max_tokens`` (400), unknown model (404), waiting requests (429). On a target
with a fixed-size context (the llama.cpp backend's ``n_ctx``) the prompt and ``max_tokens`` must fit it: a request
that names ``max_tokens`` gets 400 when they do not, the default ``max_tokens`` is cut to what fits
(:func:`fit_context`). One generation runs at a time (the model is not shared between threads); ``/health``
answers meanwhile.

Backends: the same app serves a transformers model or a llama.cpp GGUF (:attr:`ChatModel.backend`, reported by
``/health``): sessions, the prefix cache, streaming and every served method run on both
(``ooospec serve --backend``, :mod:`ooospec.serve_cli`).

Call log (off unless ``create_app(..., call_log=CallLog(path))`` / ``ooospec serve --call-log PATH``): each
finished request that showed tools -- its tools, its messages and the answer with the ids the client got -- goes to
:class:`~ooospec.runtime.call_log.CallLog` once the answer is complete, from the handler (the writer thread does
the disk work); cancelled and failed requests are not recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict

from ooospec.runtime.agent.chat import ChatModel, ChatTurn, PreparedTurn
from ooospec.runtime.call_log import SERVE, CallLog
from ooospec.runtime.serve.admission import TransportLimits, admitted, read_request, watched
from ooospec.runtime.serve.http import RequestError, add_error_handlers, is_loopback, server_config

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8000


@dataclass(frozen=True)
class Limits(TransportLimits):
    """Per-request limits (the transport ones, body / queue / connection, from :class:`TransportLimits`); a
    request over any of them gets a 4xx answer before any decoding."""

    max_messages: int = 512             # 400
    max_tools: int = 128                # 400
    max_prompt_tokens: int = 16384      # 400
    max_tokens: int = 2048              # 400: the request's max_tokens / max_completion_tokens
    default_max_tokens: int = 512       # when the request names none


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat completions request this server honours; other fields are ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    messages: list[Any]
    model: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: dict | None = None
    temperature: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    logprobs: bool | None = None


class GenerationCancelled(Exception):
    """The client went away (or the server is shutting down); raised from the token callback to end generation."""


# ------------------------------------------------------------------------------------------ pure parts


def check_request(req: ChatCompletionRequest, served: str, limits: Limits) -> int:
    """The request's ``max_tokens`` once every field is acceptable; raises :class:`RequestError` (4xx) otherwise."""
    if req.model is not None and req.model != served:
        raise RequestError(404, f"The model `{req.model}` does not exist (served: {served!r}).", "model")
    if req.n != 1 or req.logprobs:
        raise RequestError(400, "n > 1 and logprobs are not supported: this server returns one greedy completion")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise RequestError(400, f"temperature={req.temperature} outside [0, 2]", "temperature")
    if req.temperature:
        raise RequestError(400, f"temperature={req.temperature}: this server decodes greedily (exactly) only; "
                                "send 0 or leave it out", "temperature")
    if req.stop:
        raise RequestError(400, "stop sequences are not supported (generation ends at EOS, the end of a tool call "
                                "or max_tokens)", "stop")
    if not 1 <= len(req.messages) <= limits.max_messages:
        raise RequestError(400, f"{len(req.messages)} messages; send between 1 and {limits.max_messages}", "messages")
    if req.tools is not None and len(req.tools) > limits.max_tools:
        raise RequestError(400, f"{len(req.tools)} tools; at most {limits.max_tools}", "tools")
    max_tokens = next((m for m in (req.max_completion_tokens, req.max_tokens) if m is not None),
                      limits.default_max_tokens)
    if not 1 <= max_tokens <= limits.max_tokens:
        raise RequestError(400, f"max_tokens={max_tokens} outside [1, {limits.max_tokens}]", "max_tokens")
    return max_tokens


def fit_context(max_tokens: int, named: bool, prompt_tokens: int, room: int | None) -> int:
    """``max_tokens`` once it fits the target's context after the prompt (``room``:
    :meth:`~ooospec.runtime.agent.chat.ChatModel.context_room`; None: no fixed context). A ``max_tokens`` the request
    ``named`` is refused (400) when it does not fit, the default is cut to ``room``; 400 when nothing fits."""
    if room is None or max_tokens <= room:
        return max_tokens
    if room < 1:
        raise RequestError(400, f"the prompt ({prompt_tokens} tokens) leaves no room for an answer in the model's "
                                "context", "messages")
    if named:
        raise RequestError(400, f"max_tokens={max_tokens} does not fit the model's context after the prompt "
                                f"({prompt_tokens} tokens): at most {room}", "max_tokens")
    return room


def assistant_message(turn: ChatTurn) -> tuple[dict, str]:
    """``(message, finish_reason)`` in OpenAI's shape; tool calls get fresh ``call_...`` ids."""
    if turn.calls:
        calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                  "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                 for c in turn.calls]
        return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
    return {"role": "assistant", "content": turn.text}, turn.finish_reason


def usage(turn: ChatTurn) -> dict:
    return {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
            "total_tokens": turn.prompt_tokens + turn.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.cached_tokens}}


def turn_stats(turn: ChatTurn, queue_s: float) -> dict:
    r = turn.result
    return {"session": turn.origin, "cached_tokens": turn.cached_tokens, "prefill_s": r.prefill_s,
            "decode_s": r.decode_s, "n_forwards": r.n_forwards, "stop_reason": r.stop_reason, "queue_s": queue_s,
            "hints": turn.hints}


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ------------------------------------------------------------------------------------------ the app


class _ChatRoutes:
    """The app's routes and what they share: the model, its served name, the limits, the one worker (one generation
    at a time: the model and sessions are not shared) and the queue counts ``/health`` reports."""

    def __init__(self, chat: ChatModel, model_name: str, limits: Limits, call_log: CallLog | None):
        self.chat, self.model_name, self.limits, self.call_log = chat, model_name, limits, call_log
        self.worker = anyio.CapacityLimiter(1)
        self.state = {"waiting": 0, "running": 0}

    async def health(self) -> dict:
        sessions = self.chat.sessions.stats() if self.chat.sessions is not None else None
        return {"status": "ok", "model": self.model_name, "method": self.chat.method, "backend": self.chat.backend,
                "running": self.state["running"], "waiting": self.state["waiting"], "sessions": sessions}

    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "ooospec"}]}

    async def completions(self, request: Request):
        """``POST /v1/chat/completions``: the whole answer, or an SSE stream of it (:meth:`stream`)."""
        t_arrival = time.perf_counter()
        req, prepared, max_tokens = await self.parse(request)
        if req.stream:
            if self.state["waiting"] >= self.limits.max_waiting:     # refuse before the stream opens
                raise RequestError(429, f"{self.state['waiting']} requests already waiting; retry later")
            return StreamingResponse(self.stream(req, prepared, max_tokens), media_type="text/event-stream")
        turn, queue_s = await watched(request, lambda stop: self.run_turn(prepared, max_tokens, _stop_at(stop)))
        message, finish = assistant_message(turn)
        logger.info("chat turn: %d prompt tokens (%d cached, %s), %d new, %.2f s", turn.prompt_tokens,
                    turn.cached_tokens, turn.origin, turn.completion_tokens, time.perf_counter() - t_arrival)
        response_id = f"chatcmpl-{uuid.uuid4().hex}"
        self.log_call(req, message, response_id)
        return {"id": response_id, "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                                       "logprobs": None}],
                "usage": usage(turn), "ooospec": turn_stats(turn, queue_s)}

    def log_call(self, req: ChatCompletionRequest, message: dict, response_id: str) -> None:
        """Hand a finished request with tools to the call log, when there is one (it never blocks)."""
        if self.call_log is not None and req.tools:
            self.call_log.record(req.tools, req.messages, message, model=self.model_name, source=SERVE,
                                 request_id=response_id)

    async def parse(self, request: Request) -> tuple[ChatCompletionRequest, PreparedTurn, int]:
        """The request, its prepared turn and its ``max_tokens``; :class:`RequestError` (4xx) when refused."""
        limits = self.limits
        req = await read_request(request, ChatCompletionRequest, limits,
                                 # stop is refused below; the lists are bounded before pydantic sees them
                                 max_items={"messages": limits.max_messages, "tools": limits.max_tools, "stop": 4})
        max_tokens = check_request(req, self.model_name, limits)
        try:
            prepared = self.chat.prepare(req.messages, req.tools or [], req.tool_choice or "auto",
                                         max_prompt_tokens=limits.max_prompt_tokens)
        except (ValueError, TypeError) as e:
            raise RequestError(400, str(e)[:500], str(e).split(":", 1)[0].split("[", 1)[0][:40]) from None
        n_prompt = len(prepared.prompt_ids)
        named = req.max_completion_tokens is not None or req.max_tokens is not None
        return req, prepared, fit_context(max_tokens, named, n_prompt, self.chat.context_room(n_prompt))

    async def run_turn(self, prepared: PreparedTurn, max_tokens: int, on_tokens) -> tuple[ChatTurn, float]:
        """Queue for the worker (429 beyond ``max_waiting``) and decode in a thread; ``on_tokens`` runs after every
        committed token (raising :class:`GenerationCancelled` there ends the turn). Returns the turn and the
        seconds it queued."""
        t_queued = time.perf_counter()
        async with admitted(self.state, self.worker, self.limits):
            queue_s = time.perf_counter() - t_queued
            turn = await anyio.to_thread.run_sync(
                lambda: self.chat.generate(prepared, max_new_tokens=max_tokens, on_tokens=on_tokens))
        return turn, queue_s

    async def stream(self, req: ChatCompletionRequest, prepared: PreparedTurn,
                     max_tokens: int) -> AsyncIterator[str]:
        """The SSE chunks of one turn (see the module docstring); a closed stream ends the generation."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue = asyncio.Queue()
        gone = False

        def on_tokens(generated: Sequence[int]) -> None:
            if gone:
                raise GenerationCancelled
            if not prepared.tools:         # plain text: stream it as it is decoded
                text = self.chat.tokenizer.decode(list(generated), skip_special_tokens=True)
                loop.call_soon_threadsafe(deltas.put_nowait, text)

        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.model_name}
        yield _chunk(base, {"role": "assistant", "content": ""})
        task = asyncio.ensure_future(self.run_turn(prepared, max_tokens, on_tokens))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved even if the client left
        try:
            sent = ""
            async for piece in _text_pieces(task, deltas):
                sent += piece
                yield _chunk(base, {"content": piece})
            try:
                turn, _ = task.result()
            except RequestError as e:
                yield _sse({"error": {"message": e.message, "type": "invalid_request_error", "code": e.status}})
                return
            except Exception as e:       # the stream is open: report the failure in it
                logger.exception("streamed generation failed")
                yield _sse({"error": {"message": f"generation failed: {type(e).__name__}", "type": "server_error",
                                      "code": 500}})
                return
            message, finish = assistant_message(turn)
            self.log_call(req, message, base["id"])
            include_usage = (req.stream_options or {}).get("include_usage")
            for line in _last_chunks(base, message, finish, sent, usage(turn) if include_usage else None):
                yield line
        finally:
            gone = True                    # a closed stream (client gone) ends the generation at its next token


def _stop_at(stop: threading.Event) -> Callable[[Sequence[int]], None]:
    """A token callback that ends the generation (:class:`GenerationCancelled`) once ``stop`` is set."""
    def on_tokens(generated: Sequence[int]) -> None:
        if stop.is_set():
            raise GenerationCancelled
    return on_tokens


def _chunk(base: dict, delta: dict, finish: str | None = None) -> str:
    """One ``chat.completion.chunk`` event: ``base`` (id, created, model) with ``delta``."""
    return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})


async def _text_pieces(task: asyncio.Future, deltas: asyncio.Queue) -> AsyncIterator[str]:
    """The new text of every decoded prefix ``deltas`` receives while ``task`` runs: only a prefix that extends
    what was sent and does not end inside a character (``"\\ufffd"``)."""
    sent = ""
    while not task.done() or not deltas.empty():
        getter = asyncio.ensure_future(deltas.get())
        await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            continue
        text = getter.result()
        if text.startswith(sent) and len(text) > len(sent) and not text.endswith("\ufffd"):
            yield text[len(sent):]
            sent = text


def _last_chunks(base: dict, message: dict, finish: str, sent: str, turn_usage: dict | None) -> list[str]:
    """The events after a finished turn: the tool calls or the content not sent yet (``message``), the finish
    reason, the usage when given, ``[DONE]``."""
    out = []
    if message.get("tool_calls"):
        out.append(_chunk(base, {"tool_calls": [{"index": i, **tc} for i, tc in enumerate(message["tool_calls"])]}))
    elif message["content"] != sent:
        out.append(_chunk(base, {"content": message["content"].removeprefix(sent)}))
    out.append(_chunk(base, {}, finish))
    if turn_usage is not None:
        out.append(_sse({**base, "choices": [], "usage": turn_usage}))
    out.append("data: [DONE]\n\n")
    return out


def create_app(chat: ChatModel, *, model_name: str, limits: Limits = Limits(),
               call_log: CallLog | None = None) -> FastAPI:
    """The FastAPI app serving ``chat`` under the name ``model_name``; ``call_log``: where finished requests with
    tools are recorded (None: nowhere). The caller closes it."""
    app = FastAPI(title="ooo-spec chat", docs_url=None, redoc_url=None)
    routes = _ChatRoutes(chat, model_name, limits, call_log)
    app.get("/health")(routes.health)
    app.get("/v1/models")(routes.models)
    app.post("/v1/chat/completions")(routes.completions)
    add_error_handlers(app)
    return app


def serve(chat: ChatModel, *, model_name: str, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          limits: Limits = Limits(), call_log: CallLog | None = None) -> None:
    """Serve ``chat`` until SIGINT/SIGTERM (warns when ``host`` is not loopback: there is no authentication);
    ``call_log`` is closed (drained) at shutdown."""
    import uvicorn

    if not is_loopback(host):
        logger.warning("serving on %s: the chat server has no authentication; keep it on loopback (127.0.0.1) "
                       "unless the network is yours", host)
    app = create_app(chat, model_name=model_name, limits=limits, call_log=call_log)
    logger.info("chat server for %s (method %s, backend %s) on http://%s:%d/v1", model_name, chat.method,
                chat.backend, host, port)
    if call_log is not None:
        logger.info("recording requests with tools in %s", call_log.path)
    try:
        uvicorn.Server(server_config(app, host=host, port=port, keep_alive_s=limits.keep_alive_s,
                                     grace_s=limits.shutdown_grace_s)).run()
    finally:
        if call_log is not None:
            call_log.close()
