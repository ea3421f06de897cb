"""ooo-spec's drafters as a vLLM speculative method: one draft chain per request and step.

:class:`ChainProposer` is the engine-independent core (no vLLM import): per request it runs the drafters of a
registry method (:data:`~ooospec.runtime.methods.REGISTRY`: ``toolspec`` = schema FSM of the request's tools +
retrieval of earlier calls + prompt lookup; ``ooospec`` adds the hint drafter), merges their candidates and picks
the chain with :func:`~ooospec.runtime.vllm.chain.choose_chain`, then learns from what vLLM accepted. Hints come
per request: a precomputed hint text (``ooospec_hint``), or a sidecar wave started at the request's first step
through :class:`~ooospec.runtime.sidecar_client.SidecarClient` (never waited for; a dead sidecar proposes nothing).

:class:`OoOSpecProposer` is what vLLM builds for ``method: custom_class``; the plugin
(:mod:`ooospec.runtime.vllm.plugin`) hands it the request ids, prompt lengths and ``extra_args`` each step::

    vllm serve MODEL --speculative-config \\
        '{"method": "custom_class", "model": "ooospec.runtime.vllm.OoOSpecProposer", "num_speculative_tokens": 16}' \\
        --additional-config '{"ooospec": {"method": "ooospec", "sidecar_url": "http://127.0.0.1:8765"}}'

Per-request data (``SamplingParams.extra_args``; the OpenAI server fills it from the request's ``vllm_xargs``,
whose values are strings or numbers, so structured values travel as JSON text)::

    ooospec_tools     the request's tool schemas (JSON list), for the schema FSM and the sidecar wave; the plugin
                      fills it from a chat request's own ``tools`` when the client does not
    ooospec_messages  the conversation (JSON list), for the sidecar wave (filled from a chat request likewise)
    ooospec_hint      a predicted call as text (a client that runs the sidecar itself), used as hints at once
    ooospec_hint_schedule  ``[[after_s, calls], ...]`` (JSON): calls released as hints ``after_s`` seconds after
                      the request's first step (the ``ooospec-dedicated`` emulation: a wave timed alone, replayed)
    ooospec_history   the name of the drafter history the request reads and feeds (retrieval of earlier calls,
                      prompt lookup, the previous request's FSM, acceptance estimates: :class:`History`): one per
                      tenant or agent session keeps their calls apart; default one history for all. At most
                      :data:`MAX_HISTORIES` names (least recently used dropped), each at most
                      :data:`MAX_HISTORY_NAME` characters (a longer one is ignored)

Whatever is proposed, vLLM's greedy verification commits the target's own tokens: a drafter changes speed only.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from ooospec.runtime.budget import AcceptanceStats, Proposal, collect_proposals
from ooospec.runtime.drafting import DraftContext
from ooospec.runtime.methods import REGISTRY, TOOLSPEC, get_method
from ooospec.runtime.vllm.chain import ChainCost, accepted_of, choose_chain, record_chain

logger = logging.getLogger(__name__)

XARG_TOOLS, XARG_MESSAGES, XARG_HINT = "ooospec_tools", "ooospec_messages", "ooospec_hint"
XARG_SCHEDULE, XARG_HISTORY = "ooospec_hint_schedule", "ooospec_history"
MAX_HISTORIES, MAX_HISTORY_NAME = 64, 128          # drafter histories kept (LRU), the longest history name
MAX_SCHEDULED_BANKS, MAX_SCHEDULED_CALLS = 8, 4   # a schedule's bound (a function-first wave has 2 banks of <= 3)
# the registry methods a vLLM engine runs (chains, no tree policy): the served ones marked ``vllm``; a ceiling such as
# ooospec-oracle runs as the served method that takes hints, its hint text coming with each request
VLLM_METHODS = tuple(n for n, m in REGISTRY.items() if m.vllm and m.served)


@dataclass(frozen=True)
class ProposerConfig:
    """``--additional-config '{"ooospec": {...}}'``: the knobs of :class:`ChainProposer` (unknown keys are errors).

    Attributes:
        method: a registry method, ``toolspec`` or ``ooospec`` (``ooospec`` adds hints: ``ooospec_hint`` or the
            sidecar).
        sidecar_url: the sidecar server (``ooospec sidecar serve`` or vLLM serving the adapter); None = no waves.
        sidecar_model: the served sidecar's model name (``sidecar`` for ours, the ``--lora-modules`` name on vLLM).
        sidecar_layout: the prompt layout the adapter learned; None = ask the server (``/health``), and where it
            reports none (vLLM serving the adapter as a LoRA) the shipped adapter's layout.
        sidecar_wave: ``all`` (the index and every tool's arguments in one wave) or ``function-first`` (the index,
            then the arguments of the likeliest functions only: :class:`~ooospec.runtime.sidecar_client.SidecarClient`).
        sidecar_top_k: function-first's most candidate functions.
        chain_cost_slope: ``T(n) = 1 + slope * (n - 1)`` one-token forwards (:class:`~.chain.ChainCost`).
        max_requests: request states kept at most (the oldest is dropped; a preempted request that never returns).
    """

    method: str = TOOLSPEC
    sidecar_url: str | None = None
    sidecar_model: str = "sidecar"
    sidecar_layout: int | None = None
    sidecar_wave: str = "all"
    sidecar_top_k: int = 2
    chain_cost_slope: float = 0.02
    max_requests: int = 4096

    def __post_init__(self):
        if self.method not in VLLM_METHODS:
            raise ValueError(f"ooospec method {self.method!r} does not run in vLLM; choose one of {VLLM_METHODS}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")

    @classmethod
    def from_mapping(cls, d: Mapping | None) -> ProposerConfig:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ooospec option(s) {unknown} in additional_config; known: {sorted(known)}")
        return cls(**d)


def json_arg(extra: Mapping | None, key: str, want: type) -> object | None:
    """``extra[key]`` as a ``want`` (list or str): JSON text is decoded; a malformed value is logged and ignored
    (the request decodes without it, output unchanged)."""
    value = (extra or {}).get(key)
    if value is None:
        return None
    if want is list and isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            logger.warning("ignoring %s: not JSON (%s)", key, e)
            return None
    if not isinstance(value, want):
        logger.warning("ignoring %s: expected a %s, got %s", key, want.__name__, type(value).__name__)
        return None
    return value


@dataclass
class History:
    """What a stream of requests taught the drafters (one per ``ooospec_history``): the retrieval bank, prompt
    lookup and the previous request's FSM (:class:`~ooospec.runtime.methods.ToolSpecDrafters`), and the drafters'
    acceptance estimates the chain choice prices drafts with."""

    drafters: object                          # a ToolSpecDrafters
    acceptance: AcceptanceStats = field(default_factory=AcceptanceStats)


@dataclass
class RequestState:
    """One request's drafters and what its last chain was."""

    prompt_len: int
    drafters: list
    hints: object | None = None               # the HintDrafter, when the request has hints
    chain: tuple[int, ...] = ()               # the chain proposed at the last step
    proposals: list[Proposal] = field(default_factory=list)
    steps: int = 0
    drafted: int = 0                          # chain tokens proposed, all steps
    accepted: int = 0                         # of which vLLM accepted
    tokens: list[int] = field(default_factory=list)   # prompt + output at the last step
    history: History | None = None            # what it learns from and teaches (``ooospec_history``)


class ChainProposer:
    """ooo-spec's drafters over a stream of requests, one chain per request and step (see the module docstring).

    Args:
        tokenizer: the target's HF tokenizer.
        fmt: the target's tool-call format module (``runtime/formats``); None = detected from the tokenizer.
        vocab_size: drafts outside ``[0, vocab_size)`` are dropped.
        max_len: the longest chain (vLLM's ``num_speculative_tokens``).
        config: :class:`ProposerConfig`.
        sidecar: a :class:`~ooospec.runtime.sidecar_client.SidecarClient` (None = built from ``config.sidecar_url``).
    """

    def __init__(self, tokenizer, *, vocab_size: int, max_len: int, fmt=None, config: ProposerConfig | None = None,
                 sidecar=None):
        from ooospec.runtime.formats import detect_format
        from ooospec.runtime.methods import ToolSpecDrafters

        if max_len < 1:
            raise ValueError(f"max_len (num_speculative_tokens) must be >= 1, got {max_len}")
        self.tokenizer = tokenizer
        self.fmt = fmt if fmt is not None else detect_format(tokenizer)
        self.vocab_size = vocab_size
        self.max_len = max_len
        self.config = config or ProposerConfig()
        self.method = get_method(self.config.method)
        self.cost = ChainCost(self.config.chain_cost_slope)
        self.histories: OrderedDict[str, History] = OrderedDict({"": History(ToolSpecDrafters())})   # "": default
        self.sidecar = sidecar
        if self.sidecar is None and self.config.sidecar_url and self.method.takes_hints:
            from ooospec.runtime.sidecar_client import SidecarClient, adapter_layout

            self.sidecar = SidecarClient(self.config.sidecar_url, model=self.config.sidecar_model,
                                         layout=self.config.sidecar_layout, fallback_layout=adapter_layout(),
                                         wave=self.config.sidecar_wave, top_k=self.config.sidecar_top_k)
        self.requests: OrderedDict[str, RequestState] = OrderedDict()
        self.faults: dict[str, int] = {}
        self.totals = {"requests": 0, "steps": 0, "drafted": 0, "accepted": 0}

    # ---------------------------------------------------------------------------------------------- requests

    def start(self, req_id: str, prompt_len: int, extra: Mapping | None = None) -> RequestState:
        """A new request: build its drafters (the FSM of its tools, its hints) and start its sidecar wave."""
        from ooospec.runtime.hints import HintDrafter

        tools = json_arg(extra, XARG_TOOLS, list) or []
        history = self._history(self._history_name(extra))
        toolspec = history.drafters
        hint_source = self._hint_source(extra, tools) if self.method.takes_hints else None
        hints = HintDrafter(hint_source) if hint_source is not None else None
        for label, p in (hints.priors if hints is not None else {}).items():
            history.acceptance.set_prior(label, p)
        if tools:
            drafters = toolspec.for_request(self.tokenizer, self.fmt, tools, hints)
        else:   # no schema to follow: the request-independent drafters (and its hints)
            drafters = ([hints] if hints is not None else []) + [toolspec.retriever, toolspec.pld]
        state = RequestState(prompt_len=int(prompt_len), drafters=drafters, hints=hints, history=history)
        self.requests[req_id] = state
        while len(self.requests) > self.config.max_requests:
            self.requests.popitem(last=False)
        self.totals["requests"] += 1
        return state

    def _history_name(self, extra: Mapping | None) -> str:
        """The request's ``ooospec_history`` ("" = the default history; a malformed name is ignored, logged)."""
        name = (extra or {}).get(XARG_HISTORY)
        if name is None:
            return ""
        if not isinstance(name, str) or len(name) > MAX_HISTORY_NAME:
            self._fault("history", f"{XARG_HISTORY} ignored: expected a string of at most {MAX_HISTORY_NAME} "
                                   f"characters, got {type(name).__name__}")
            return ""
        return name

    def _history(self, name: str) -> History:
        """History ``name`` (made on first use; the least recently used beyond :data:`MAX_HISTORIES` is dropped,
        never the default)."""
        from ooospec.runtime.methods import ToolSpecDrafters

        history = self.histories.get(name)
        if history is None:
            history = self.histories[name] = History(ToolSpecDrafters())
            while len(self.histories) > MAX_HISTORIES:
                del self.histories[next(k for k in self.histories if k != "")]
        self.histories.move_to_end(name)
        return history

    @property
    def acceptance(self) -> AcceptanceStats:
        """The default history's acceptance estimates."""
        return self.histories[""].acceptance

    def _hint_source(self, extra: Mapping | None, tools: list):
        """The request's hints: its ``ooospec_hint`` text at once, else a sidecar wave (None: no hints)."""
        from ooospec.runtime.hints import HintBank

        schedule = json_arg(extra, XARG_SCHEDULE, list)
        if schedule is not None:
            return self._scheduled(schedule)
        text = json_arg(extra, XARG_HINT, str)
        if text:
            calls = self.fmt.parse_calls(text)
            if calls:
                return HintBank.from_calls(calls, self.fmt, self.tokenizer)
            return HintBank({"text": self.tokenizer(text, add_special_tokens=False)["input_ids"]})
        messages = json_arg(extra, XARG_MESSAGES, list)
        if self.sidecar is None or not tools or not messages:
            return None
        try:
            return self.sidecar.submit(messages, tools, fmt=self.fmt, tokenizer=self.tokenizer)
        except Exception as e:  # noqa: BLE001 - a wave that cannot start leaves the request as toolspec
            self._fault("sidecar", f"wave not started: {type(e).__name__}: {e}")
            return None

    def _scheduled(self, schedule: list):
        """:class:`~ooospec.runtime.hints.ScheduledBanks` of an ``ooospec_hint_schedule`` (None when malformed)."""
        from ooospec.runtime.hints import ScheduledBanks

        try:
            pairs = [(float(t), [{"name": c["name"], "arguments": c["arguments"]} for c in calls])
                     for t, calls in schedule]
            if any(not 0 <= t < 3600 for t, _ in pairs):
                raise ValueError("release times outside [0, 3600) s")
            if len(pairs) > MAX_SCHEDULED_BANKS or any(len(calls) > MAX_SCHEDULED_CALLS for _, calls in pairs):
                raise ValueError(f"at most {MAX_SCHEDULED_BANKS} banks of {MAX_SCHEDULED_CALLS} calls")
            return ScheduledBanks.from_calls(pairs, self.fmt, self.tokenizer)
        except (TypeError, ValueError, KeyError) as e:
            self._fault("hints", f"{XARG_SCHEDULE} ignored: {type(e).__name__}: {e}")
            return None

    def finish(self, req_id: str) -> None:
        """vLLM dropped the request: the retrieval bank and the next FSM learn from its output."""
        state = self.requests.pop(req_id, None)
        if state is None or len(state.tokens) <= state.prompt_len:
            return
        prompt, output = state.tokens[:state.prompt_len], state.tokens[state.prompt_len:]
        for drafter in state.drafters:
            try:
                drafter.observe(prompt, output)
            except Exception as e:  # noqa: BLE001
                self._fault(getattr(drafter, "name", type(drafter).__name__), f"observe raised {e!r}")
        state.history.drafters.observe(prompt, output)

    # ---------------------------------------------------------------------------------------------- steps

    def step(self, req_id: str, tokens: Sequence[int], sampled: Sequence[int], room: int) -> list[int]:
        """The chain for ``req_id`` given ``tokens`` (prompt + output so far, the last one sampled this step) and
        ``sampled`` (what vLLM committed this step); at most ``min(max_len, room)`` tokens."""
        state = self.requests[req_id]
        if state.chain:
            n = accepted_of(state.chain, sampled)
            record_chain(state.history.acceptance, state.chain, state.proposals, n)
            state.accepted += n
            self.totals["accepted"] += n
        state.tokens = list(tokens)
        ctx = DraftContext(tuple(state.tokens), state.prompt_len, state.steps)
        if state.steps == 0:
            state.history.acceptance.start_request()
        state.proposals = collect_proposals(state.drafters, ctx, self.vocab_size, self._fault)
        state.chain = choose_chain(state.tokens[-1], state.proposals, state.history.acceptance, self.cost,
                                   min(self.max_len, room))
        state.steps += 1
        state.drafted += len(state.chain)
        self.totals["steps"] += 1
        self.totals["drafted"] += len(state.chain)
        return list(state.chain)

    def _fault(self, name: str, what: str) -> None:
        if name not in self.faults:
            logger.warning("drafter %r %s; its drafts are ignored (output unaffected)", name, what)
        self.faults[name] = self.faults.get(name, 0) + 1


class OoOSpecProposer:
    """vLLM's ``custom_class`` proposer (``speculative_config.model = "ooospec.runtime.vllm.OoOSpecProposer"``).

    vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` once per step
    with the batch in order; the plugin calls :meth:`bind_batch` right before, with the request ids and a lookup
    of each new request's prompt length and ``extra_args``. Built by vLLM as ``OoOSpecProposer(vllm_config)``.
    """

    def __init__(self, vllm_config):
        from ooospec.runtime.vllm import plugin

        if not plugin.installed():
            raise RuntimeError(plugin.NOT_INSTALLED)
        spec = vllm_config.speculative_config
        model_config = vllm_config.model_config
        options = (getattr(vllm_config, "additional_config", None) or {}).get("ooospec")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer,
                                                  trust_remote_code=model_config.trust_remote_code)
        self.core = ChainProposer(tokenizer, vocab_size=model_config.get_vocab_size(),
                                  max_len=spec.num_speculative_tokens, config=ProposerConfig.from_mapping(options))
        self.max_model_len = model_config.max_model_len
        self._req_ids: list[str] = []
        self._lookup: Callable[[str], tuple[int, Mapping | None]] | None = None
        logger.info("ooo-spec proposer: method %s, chains of up to %d tokens, format %s",
                    self.core.method.name, self.core.max_len, self.core.fmt.NAME)

    def bind_batch(self, req_ids: Sequence[str], lookup: Callable[[str], tuple[int, Mapping | None]],
                   finished: Sequence[str] = ()) -> None:
        """This step's requests in batch order; ``lookup(req_id) -> (prompt_len, extra_args)``; ``finished``: the
        requests vLLM dropped since the last step."""
        for req_id in finished:
            self.core.finish(req_id)
        self._req_ids = list(req_ids)
        self._lookup = lookup

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **_unused) -> list[list[int]]:
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not len(sampled) or i >= len(self._req_ids):   # a chunked prefill goes on: no draft this step
                out.append([])
                continue
            req_id, n = self._req_ids[i], int(num_tokens_no_spec[i])
            if req_id not in self.core.requests:
                prompt_len, extra = self._lookup(req_id)
                self.core.start(req_id, prompt_len, extra)
            room = self.max_model_len - n - 1
            tokens = token_ids_cpu[i, :n].tolist()
            out.append(self.core.step(req_id, tokens, list(sampled), room) if room > 0 else [])
        return out

    def load_model(self, *args, **kwargs) -> None:
        """No model: the drafters are CPU code (vLLM calls this on every proposer)."""
