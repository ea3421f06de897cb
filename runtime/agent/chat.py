"""One chat turn on the target: render the conversation, continue its session, decode, parse the tool calls.

What the chat server (:mod:`ooospec.runtime.serve.chat_app`) and the agent loop (:mod:`ooospec.runtime.agent.loop`)
share. A :class:`ChatModel` holds the target, its tokenizer and format, the decoding method and, optionally, a
:class:`~ooospec.runtime.agent.session.SessionStore` (KV kept across turns + the prefix cache of system + tools
blocks)::

    chat = ChatModel(model, tok, method="toolspec", sessions=SessionStore(model, prefix_cache=PrefixCache()))
    turn = chat.complete(messages, tools, max_new_tokens=256)   # = chat.generate(chat.prepare(messages, tools))
    turn.calls          # [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    turn.cached_tokens  # prompt tokens whose KV was reused (0 on a first turn without a prefix-cache hit)

:meth:`ChatModel.prepare` does everything that can refuse a request (messages, tools, ``tool_choice``, the
prompt's length: ValueError naming the field) before any decoding, so a server answers 4xx up front; on a target
with a fixed-size context (llama.cpp's ``n_ctx``) :meth:`ChatModel.context_room` says how many new tokens fit.

Methods: the registry's served ones (:data:`~ooospec.runtime.methods.SERVED`: ``ar``, ``toolspec``, ``ooospec``),
driven by a :class:`~ooospec.runtime.decoding.RequestDecoder`; one that takes hints (``ooospec``) drafts from a
:class:`~ooospec.runtime.drafters.hints.CallGuess` of the call: the ``hints`` a caller passes, else a wave sent at
arrival when a :class:`~ooospec.runtime.sidecar.client.SidecarClient` is given. Output is the target's greedy decoding
whatever the method, session or prefix cache.

``tool_choice`` (OpenAI's values) works through the format's fixed call opening, which every format has:
``"auto"`` (default) renders the tools and lets the model choose; ``"none"`` renders no tools and parses no
calls; ``"required"`` appends the call opening up to the function name (``<tool_call>\\n{"name":`` for hermes)
to the prompt; ``{"type": "function", "function": {"name": N}}`` appends it up to the arguments
(``<tool_call>\\n{"name": "N", "arguments":``). The forced text ends at JSON punctuation, never in a space or an
open string, so the model's next token is the one it would pick in the middle of its own call (byte-level BPE
attaches a space to the word after it). The forced text is part of the returned text, so it parses as a call. The
stop rule is the format's end of a call (``fmt.is_complete``), EOS or the token cap.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
from transformers import PreTrainedModel

from ooospec.runtime.agent.session import SessionStore
from ooospec.runtime.backends.models import eos_token_ids
from ooospec.runtime.backends.target import Target, as_target
from ooospec.runtime.decoding import RequestDecoder
from ooospec.runtime.drafters.hint_source import HintInputs, resolve_hints
from ooospec.runtime.drafters.hints import CallGuess, HintDrafter
from ooospec.runtime.engine import DEFAULT_MAX_DEPTH, GenerationResult
from ooospec.runtime.formats import common, detect_format
from ooospec.runtime.formats.messages import normalize_messages
from ooospec.runtime.methods import TOOLSPEC, get_method
from ooospec.runtime.tokens import common_prefix_len

FinishReason = Literal["tool_calls", "stop", "length"]
_PROBES = ("a", "b")     # two user contents that differ in their first character (see shared_block_len)


@dataclass(frozen=True)
class PreparedTurn:
    """A request ready to decode: what :meth:`ChatModel.prepare` checked and rendered."""

    messages: list[dict]          # normalized (record shape)
    tools: list[dict]             # the tools shown to the model (none under tool_choice "none")
    tool_names: list[str]         # the request's tools, shown or not
    opening: str                  # forced call opening appended to the prompt ("" unless tool_choice forces)
    prompt_ids: list[int]


@dataclass
class ChatTurn:
    """One assistant turn."""

    text: str                     # the assistant's text: forced call opening + decoded output, EOS excluded
    calls: list[dict]             # parsed calls to tools of the request ({"name", "arguments"}), in order
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int            # prompt tokens whose KV was reused, not prefilled
    origin: str                   # a store's "session" / "fork" / "prefix" / "new", or "stateless"
    result: GenerationResult
    hints: dict | None = None     # HintDrafter stats when the turn had hints (+ "wave": the wave gate's record)


def system_tools_block(fmt, tokenizer, messages: Sequence[dict], tools: Sequence[dict]) -> list[int]:
    """The prompt tokens that depend only on the leading system message and the tools (the block an agent
    repeats on every request): the common token prefix of the prompts of two probe user messages."""
    head = [m for m in messages[:1] if m["role"] == "system"]
    a, b = (tokenizer(fmt.render_prompt(tokenizer, head + [{"role": "user", "content": c}], list(tools)),
                      add_special_tokens=False)["input_ids"] for c in _PROBES)
    return list(a[:common_prefix_len(a, b)])


def forced_opening(fmt, tool_choice: Any, tool_names: Sequence[str]) -> str:
    """The text appended to the prompt for ``tool_choice`` (``""`` for auto / none); raises ValueError when the
    choice names no tool of the request.

    >>> from ooospec.runtime.formats import hermes
    >>> forced_opening(hermes, {"type": "function", "function": {"name": "f"}}, ["f"])
    '<tool_call>\\n{"name": "f", "arguments":'
    """
    if tool_choice in (None, "auto", "none"):
        return ""
    if not tool_names:
        raise ValueError("tool_choice asks for a tool call but the request has no tools")
    if tool_choice == "required":
        return fmt.call_prefix + '{"name":'
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or tool_choice.get("type") != "function":
        raise ValueError('tool_choice must be "auto", "none", "required" or {"type": "function", "function": '
                         '{"name": ...}}')
    if name not in tool_names:
        raise ValueError(f"tool_choice names {name!r}, which is not among the request's tools {list(tool_names)}")
    return fmt.call_prefix + '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "' + fmt.args_key + '":'


class ChatModel:
    """The target behind a chat API (see the module docstring).

    Args:
        model, tokenizer: the target (sdpa/eager attention, eval mode).
        method: a served method's name (:data:`~ooospec.runtime.methods.SERVED`).
        sidecar: for a method whose hints come from a sidecar (``ooospec``): a
            :class:`~ooospec.runtime.sidecar.client.SidecarClient` asked at every request's arrival; None = hints
            only when a caller passes them.
        sessions: KV kept across turns (None = every turn prefills its whole prompt: the stateless path).
        engine_kwargs: :class:`~ooospec.runtime.engine.SpecEngine` keywords (``policy``, ``cost``, ...).
    """

    def __init__(self, model: Target | PreTrainedModel, tokenizer, *, method: str = TOOLSPEC, sidecar=None,
                 sessions: SessionStore | None = None, **engine_kwargs):
        self.takes_hints = get_method(method, served=True).takes_hints   # ValueError naming the served methods
        self.model, self.tokenizer = model, tokenizer
        target = as_target(model)
        self.backend: str = target.backend
        self.n_ctx: int | None = getattr(target, "n_ctx", None)      # a fixed-size context (llama.cpp), or None
        self.fmt = detect_format(tokenizer)
        self.method = method
        self.sidecar = sidecar
        self.sessions = sessions
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.engine_kwargs = engine_kwargs
        # the request's engine; acceptance estimates, retrieval bank and PLD learnt across requests
        self.decoder = RequestDecoder(method, model, eos_token_ids=self.eos_token_ids, **engine_kwargs)
        self._blocks: OrderedDict[str, list[int]] = OrderedDict()   # (system, tools) -> probe render ids

    # ------------------------------------------------------------------------------------- rendering

    def encode(self, messages: list[dict], tools: list[dict], opening: str = "") -> list[int]:
        """Prompt ids: the conversation through the target's chat template (+ a forced call opening)."""
        text = self.fmt.render_prompt(self.tokenizer, messages, tools) + opening
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def shared_block_len(self, messages: list[dict], tools: list[dict], prompt_ids: Sequence[int]) -> int:
        """How many leading prompt tokens depend only on the leading system messages and the tools.

        The template renders the same system + tools block with two probe user messages; the block is their
        common token prefix, cut to what ``prompt_ids`` shares with it. Cached per (system, tools).
        """
        head = [m for m in messages[:1] if m["role"] == "system"]
        key = json.dumps([head, tools], sort_keys=True, ensure_ascii=False)
        probe = self._blocks.get(key)
        if probe is None:
            probe = system_tools_block(self.fmt, self.tokenizer, messages, tools)
            self._blocks[key] = probe
            if len(self._blocks) > 64:
                self._blocks.popitem(last=False)
        self._blocks.move_to_end(key)
        return common_prefix_len(probe, prompt_ids)

    def context_room(self, prompt_tokens: int) -> int | None:
        """The most new tokens a turn after a ``prompt_tokens``-token prompt can decode: what a fixed-size context
        (a llama.cpp target's ``n_ctx`` cells) holds past the prompt and the deepest draft tree; None where the
        cache grows as needed (HF)."""
        if self.n_ctx is None:
            return None
        return self.n_ctx - prompt_tokens - self.decoder.engine_kwargs.get("max_depth", DEFAULT_MAX_DEPTH) - 1

    # ------------------------------------------------------------------------------------- one turn

    def prepare(self, messages: Sequence[Any], tools: Sequence[Any] = (), tool_choice: Any = "auto",
                max_prompt_tokens: int | None = None) -> PreparedTurn:
        """Check and render a request (OpenAI or record-shaped ``messages`` and ``tools``).

        Raises ValueError naming what is wrong: a message, a tool, ``tool_choice`` (see the module docstring),
        a template that refuses the conversation, or a prompt over ``max_prompt_tokens``.
        """
        messages = normalize_messages(messages)
        try:
            tools = common.wrap_tools(list(tools)) if tools else []
        except TypeError as e:
            raise ValueError(f"tools: {e}") from None
        names = [t["function"]["name"] for t in tools]
        opening = forced_opening(self.fmt, tool_choice, names)
        shown = [] if tool_choice == "none" else tools
        try:
            prompt = self.encode(messages, shown, opening)
        except jinja2.TemplateError as e:
            raise ValueError(f"messages: the chat template refuses this conversation: {e}") from None
        if max_prompt_tokens is not None and len(prompt) > max_prompt_tokens:
            raise ValueError(f"messages: the prompt is {len(prompt)} tokens, over the limit of {max_prompt_tokens}")
        return PreparedTurn(messages, shown, names, opening, prompt)

    def complete(self, messages: Sequence[Any], tools: Sequence[Any] = (), *, max_new_tokens: int = 256,
                 tool_choice: Any = "auto", hints: CallGuess | None = None,
                 on_tokens: Callable[[Sequence[int]], None] | None = None) -> ChatTurn:
        """:meth:`prepare` then :meth:`generate`."""
        return self.generate(self.prepare(messages, tools, tool_choice), max_new_tokens=max_new_tokens,
                             hints=hints, on_tokens=on_tokens)

    def generate(self, turn: PreparedTurn, *, max_new_tokens: int = 256, hints: CallGuess | None = None,
                 on_tokens: Callable[[Sequence[int]], None] | None = None) -> ChatTurn:
        """Decode the assistant's next turn.

        Args:
            hints: a guess of this turn's call, for a method that takes hints; None = the sidecar's wave, if any
                (:func:`~ooospec.runtime.drafters.hint_source.resolve_hints`).
            on_tokens: called with the tokens generated so far after every committed token (streaming); an
                exception it raises ends generation and propagates (the session is emptied, nothing is lost).
        """
        arrival = time.perf_counter()
        messages, shown_tools, names, opening, prompt = (turn.messages, turn.tools, turn.tool_names, turn.opening,
                                                          turn.prompt_ids)
        source = resolve_hints(HintInputs(guess=hints, messages=messages, tools=shown_tools), self.fmt,
                               self.tokenizer, sidecar=self.sidecar, arrival=arrival) if self.takes_hints else None
        request = source.guess if source is not None and source.started else None    # the wave this turn started
        hint_drafter = HintDrafter(source.guess) if source is not None else None
        engine = self.decoder.engine(self.tokenizer, self.fmt, shown_tools, hint_drafter)
        stop = self._stop_rule(opening, bool(shown_tools), on_tokens)
        try:
            if self.sessions is None:
                result, origin = engine.generate(prompt, max_new_tokens, stop), "stateless"
            else:
                shared = self.shared_block_len(messages, shown_tools, prompt)
                session, origin = self.sessions.session_for(prompt, shared)
                result = session.generate(engine, prompt, max_new_tokens, stop)
                self.sessions.remember_prefix(session, shared)
        finally:
            if request is not None:
                request.cancel()
        self.decoder.observe(prompt, result.tokens)

        out = [t for t in result.tokens if t not in self.eos_token_ids]
        text = opening + self.tokenizer.decode(out, skip_special_tokens=False)
        calls = [c for c in self.fmt.parse_calls(text) if c["name"] in names] if shown_tools else []
        if calls:
            reason: FinishReason = "tool_calls"
        else:
            reason = "length" if result.stop_reason == "max_new_tokens" else "stop"
        hint_stats = hint_drafter.stats(result) if hint_drafter else None
        hints_out = hint_stats.to_dict() if hint_stats else None
        wave = request.report(result, hint_stats, calls) if request is not None else None
        if wave is not None:      # the sidecar's wave gate decided this request (runtime/sidecar/gate.py)
            hints_out["wave"] = wave
        return ChatTurn(text=text, calls=calls, finish_reason=reason, prompt_tokens=len(prompt),
                        completion_tokens=len(result.tokens), cached_tokens=result.num_cached, origin=origin,
                        result=result, hints=hints_out)

    def _stop_rule(self, opening: str, with_tools: bool,
                   on_tokens: Callable[[Sequence[int]], None] | None) -> Callable[[Sequence[int]], bool] | None:
        """End of the call when tools are shown (``fmt.is_complete`` on the opening + output), else only EOS / the
        cap; ``on_tokens`` rides along (the engine calls the stop rule after every committed token)."""
        if not with_tools and on_tokens is None:
            return None

        def stop(generated: Sequence[int]) -> bool:
            if on_tokens is not None:
                on_tokens(generated)
            if not with_tools:
                return False
            return self.fmt.is_complete(opening + self.tokenizer.decode(list(generated), skip_special_tokens=False))

        return stop
