"""ooo-spec's drafters as a vLLM speculative method: one draft chain per request and step.

:class:`ChainProposer` is the engine-independent core (no vLLM import): per request it runs the drafters of a
registry method (:data:`~ooospec.runtime.methods.REGISTRY`: ``toolspec`` = schema FSM of the request's tools +
retrieval of earlier calls + prompt lookup; ``ooospec`` adds the hint drafter), merges their candidates and picks
the chain with :func:`~ooospec.runtime.vllm.chain.choose_chain`, then learns from what vLLM accepted. Hints come
per request: a precomputed hint text (``ooospec_hint``), or a sidecar wave started at the request's first step
through :class:`~ooospec.runtime.sidecar.client.SidecarClient` (never waited for; a dead sidecar proposes nothing).

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
                      :data:`~ooospec.runtime.vllm.xargs.MAX_HISTORY_NAME` characters (a longer one is ignored)
    ooospec           ``"off"``: the request opts out: no drafters, no sidecar wave, no history (every step
                      proposes nothing); the other keys are not read. Any other value is ignored (a fault)

Every value is checked before use (:mod:`ooospec.runtime.vllm.xargs`: length, type, nesting, at most
:data:`~ooospec.runtime.vllm.xargs.MAX_TOOLS` tools): a malformed or oversized one is ignored and counted in
:attr:`ChainProposer.faults`, and a toolbox the schema FSM cannot build from leaves the request without an FSM.
Whatever is proposed, vLLM's greedy verification commits the target's own tokens: a drafter changes speed only.

Observability: :meth:`ChainProposer.metrics` (totals, per drafter label the chain tokens it proposed and vLLM
accepted, the chain lengths since the last log, faults), logged at INFO every ``log_interval_s`` seconds of
serving (:class:`ProposerConfig`; the plugin routes ``ooospec`` logs to vLLM's handlers). Two counters join vLLM's
Prometheus metrics (:data:`HINT_COUNTERS`; ``LLM.get_metrics()`` in the engine's process, as a client at batch 1
reads the spec-decode counters around a request): the accepted tokens a hint proposal covered, and those only the
hints had proposed (:func:`~ooospec.runtime.vllm.chain.only_accepted`), i.e. what the sidecar's hints were worth to
the request -- what a client-side wave gate learns from, since vLLM's own counters do not tell drafters apart. (An
OpenAI server's ``/metrics`` shows them only where the engine core shares the server's process or Prometheus
multiprocess mode is set up.)
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ooospec.runtime.budget import AcceptanceStats, Proposal, collect_proposals
from ooospec.runtime.drafters.base import DraftContext, Faults, observe_all
from ooospec.runtime.methods import get_method
from ooospec.runtime.vllm import xargs
from ooospec.runtime.vllm.chain import (
    ChainCost,
    accepted_of,
    choose_chain,
    has_label,
    label_outcomes,
    only_accepted,
    record_chain,
)
from ooospec.runtime.vllm.draft_switch import DraftSwitch
from ooospec.runtime.vllm.options import ProposerConfig
from ooospec.runtime.vllm.step_cost import StepClock, StepCost

logger = logging.getLogger(__name__)

MAX_HISTORIES = 64          # drafter histories kept (least recently used dropped)
HINTS_LABEL = "hints"       # the hint drafter's label (HintDrafter.name)
# Prometheus counters (vLLM's registry; names as ``LLM.get_metrics()`` reports them): accepted tokens a hint proposal
# covered, and those only the hints had proposed
HINT_COUNTERS = ("vllm:ooospec_hint_accepted_tokens", "vllm:ooospec_hint_only_accepted_tokens")
_exported: dict[str, object] = {}


def export_count(name: str, value: int) -> None:
    """Add ``value`` to Prometheus counter ``name`` (created once per process); nothing where prometheus_client is
    not installed (our engine's venv) or the name is taken by another collector."""
    if value <= 0:
        return
    counter = _exported.get(name)
    if counter is None:
        try:
            from prometheus_client import Counter as PromCounter

            counter = PromCounter(name, "ooo-spec: " + name.split(":", 1)[-1].replace("_", " "))
        except (ImportError, ValueError):
            counter = False
        _exported[name] = counter
    if counter:
        counter.inc(value)
@dataclass
class History:
    """What a stream of requests taught the drafters (one per ``ooospec_history``): the retrieval bank, prompt
    lookup and the previous request's FSM (:class:`~ooospec.runtime.decoding.ToolSpecDrafters`), and the drafters'
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
    off: bool = False                         # opted out (``ooospec: "off"``): no drafters, no history


@dataclass
class ChainWindow:
    """The chains of the steps since the last metrics log."""

    steps: int = 0
    accepted: int = 0                         # drafts vLLM accepted, learnt in this window
    lengths: Counter = field(default_factory=Counter)   # chain length -> steps
    batches: Counter = field(default_factory=Counter)   # decoding requests in the engine step -> steps

    def summary(self) -> dict:
        n = max(self.steps, 1)
        return {"steps": self.steps, "mean_chain": sum(k * v for k, v in self.lengths.items()) / n,
                "mean_accepted": self.accepted / n, "chain_lengths": dict(sorted(self.lengths.items())),
                "mean_batch": sum(k * v for k, v in self.batches.items()) / n,
                "max_batch": max(self.batches, default=0)}


class ChainProposer:
    """ooo-spec's drafters over a stream of requests, one chain per request and step (see the module docstring).

    Args:
        tokenizer: the target's HF tokenizer.
        fmt: the target's tool-call format module (``runtime/formats``); None = detected from the tokenizer.
        vocab_size: drafts outside ``[0, vocab_size)`` are dropped.
        max_len: the longest chain (vLLM's ``num_speculative_tokens``).
        config: :class:`ProposerConfig`.
        sidecar: a :class:`~ooospec.runtime.sidecar.client.SidecarClient` (None = built from ``config.sidecar_url``).
        clock: seconds, monotonic (when metrics are logged).
    """

    def __init__(self, tokenizer, *, vocab_size: int, max_len: int, fmt=None, config: ProposerConfig | None = None,
                 sidecar=None, clock: Callable[[], float] = time.monotonic):
        from ooospec.runtime.decoding import ToolSpecDrafters
        from ooospec.runtime.formats import detect_format

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
            from ooospec.runtime.sidecar.client import SidecarClient, adapter_layout

            self.sidecar = SidecarClient(self.config.sidecar_url, model=self.config.sidecar_model,
                                         layout=self.config.sidecar_layout, fallback_layout=adapter_layout(),
                                         wave=self.config.sidecar_wave, top_k=self.config.sidecar_top_k)
            if self.config.sidecar_gate != "off":
                from ooospec.runtime.sidecar.deployments import get_deployment
                from ooospec.runtime.sidecar.gate import WaveGate

                self.sidecar.gate = WaveGate(get_deployment(self.config.sidecar_gate).prior)
        self.requests: OrderedDict[str, RequestState] = OrderedDict()
        self.faults = Faults(lambda message: logger.warning("ooospec %s", message))   # name -> count
        self.totals = {"requests": 0, "off": 0, "steps": 0, "drafted": 0, "accepted": 0, "hint_accepted": 0,
                       "hint_only_accepted": 0}
        self.by_label: dict[str, list[int]] = {}     # drafter label -> [chain tokens proposed, accepted by vLLM]
        self.window = ChainWindow()
        self.clock = clock
        self._logged_at = clock()
        self.step_cost = StepCost(self.config.chain_cost_slope)
        self.switch = (DraftSwitch(min_batch=self.config.draft_switch_min_batch, clock=clock)
                       if self.config.draft_switch else None)
        self.batch = 1                                # decoding requests in the current step

    # ---------------------------------------------------------------------------------------------- requests

    def start(self, req_id: str, prompt_len: int, extra: Mapping | None = None) -> RequestState:
        """A new request: build its drafters (the FSM of its tools, its hints) and start its sidecar wave.

        ``extra`` (its ``extra_args``) is checked first (:func:`~ooospec.runtime.vllm.xargs.parse`): what is
        malformed is ignored and counted in :attr:`faults`; an opted-out request gets no drafters."""
        args = xargs.parse(extra)
        for key, why in args.faults:
            self.faults(key, f"ignored for this request: {why}")
        if args.off:
            state = RequestState(prompt_len=int(prompt_len), drafters=[], off=True)
            self.totals["off"] += 1
        else:
            state = self._drafting_state(int(prompt_len), args)
        self.requests[req_id] = state
        while len(self.requests) > self.config.max_requests:
            self.requests.popitem(last=False)
        self.totals["requests"] += 1
        return state

    def _drafting_state(self, prompt_len: int, args: xargs.RequestArgs) -> RequestState:
        """A request's state with its drafters: the FSM of its tools (when it builds), its hints, then the
        request-independent drafters of its history."""
        history = self._history(args.history)
        toolspec = history.drafters
        hints = self._hints(args) if self.method.takes_hints else None
        for label, p in (hints.priors if hints is not None else {}).items():
            history.acceptance.set_prior(label, p)
        drafters = None
        if args.tools:
            try:
                drafters = toolspec.for_request(self.tokenizer, self.fmt, args.tools, hints)
            except Exception as e:  # noqa: BLE001 - tools the FSM cannot take cost the request its FSM only
                self.faults("schema_fsm", f"not built for a request's tools: {type(e).__name__}: {e}")
        if drafters is None:    # no schema to follow: the request-independent drafters (and its hints)
            drafters = ([hints] if hints is not None else []) + [toolspec.retriever, toolspec.pld]
        return RequestState(prompt_len=prompt_len, drafters=drafters, hints=hints, history=history)

    def _history(self, name: str) -> History:
        """History ``name`` (made on first use; the least recently used beyond :data:`MAX_HISTORIES` is dropped,
        never the default)."""
        from ooospec.runtime.decoding import ToolSpecDrafters

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

    def _hints(self, args: xargs.RequestArgs):
        """The request's :class:`~ooospec.runtime.drafters.hints.HintDrafter`: its schedule, its ``ooospec_hint`` text
        at once, else a sidecar wave (:func:`~ooospec.runtime.drafters.hint_source.resolve_hints`). None: no hints,
        or they did not build (a fault: ``hints``, or ``sidecar`` for a wave that did not start)."""
        from ooospec.runtime.drafters.hint_source import HintInputs, resolve_hints
        from ooospec.runtime.drafters.hints import HintDrafter

        inputs = HintInputs(schedule=args.schedule, text=args.hint, tools=args.tools,
                            messages=args.messages or None)     # an empty conversation is none: no wave
        source = resolve_hints(inputs, self.fmt, self.tokenizer, sidecar=self.sidecar, on_fault=self.faults)
        return HintDrafter(source.guess) if source is not None else None

    def finish(self, req_id: str) -> None:
        """vLLM dropped the request: the retrieval bank and the next FSM learn from its output."""
        state = self.requests.pop(req_id, None)
        if state is None or state.off or len(state.tokens) <= state.prompt_len:
            return
        prompt, output = state.tokens[:state.prompt_len], state.tokens[state.prompt_len:]
        observe_all(state.drafters, prompt, output, self.faults)
        state.history.drafters.observe(prompt, output)

    # ---------------------------------------------------------------------------------------------- steps

    def draft_this_step(self, req_ids: Sequence[str], committed: int) -> bool:
        """Whether this step drafts: the :class:`~.draft_switch.DraftSwitch` told what the last step committed
        (always, without a switch)."""
        if self.switch is None:
            return True
        self.switch.start(req_ids, committed)
        return self.switch.decide(len(req_ids))

    def step(self, req_id: str, tokens: Sequence[int], sampled: Sequence[int], room: int,
             draft: bool = True) -> list[int]:
        """The chain for ``req_id`` given ``tokens`` (prompt + output so far, the last one sampled this step) and
        ``sampled`` (what vLLM committed this step); at most ``min(max_len, room)`` tokens; none when not
        ``draft`` (the draft switch: plain steps pay more at this batch), the last chain still learnt from."""
        state = self.requests[req_id]
        self._log_if_due()
        if state.off:
            return []
        if state.chain:
            self._learn(state, accepted_of(state.chain, sampled))
        state.tokens = list(tokens)
        if not draft:
            state.chain, state.proposals = [], []
            return []
        ctx = DraftContext(tuple(state.tokens), state.prompt_len, state.steps)
        if state.steps == 0:
            state.history.acceptance.start_request()
        state.proposals = collect_proposals(state.drafters, ctx, self.vocab_size, self.faults)
        state.history.acceptance.bonus_scale = 1.0 / max(self.batch, 1)   # exploring costs the whole batch
        state.chain = choose_chain(state.tokens[-1], state.proposals, state.history.acceptance, self.chain_cost(),
                                   min(self.max_len, room))
        state.steps += 1
        state.drafted += len(state.chain)
        self.totals["steps"] += 1
        self.totals["drafted"] += len(state.chain)
        self.window.steps += 1
        self.window.lengths[len(state.chain)] += 1
        self.window.batches[self.batch] += 1
        return list(state.chain)

    def chain_cost(self) -> ChainCost:
        """The price of a chain now: the fixed slope, or (``chain_pricing="batch"``) the learnt one times the
        batch (:mod:`~ooospec.runtime.vllm.step_cost`)."""
        if self.config.chain_pricing == "fixed":
            return self.cost
        return ChainCost(self.step_cost.price(self.batch))

    def _learn(self, state: RequestState, n: int) -> None:
        """vLLM accepted ``n`` drafts of the request's last chain: the estimates and the counters learn it."""
        record_chain(state.history.acceptance, state.chain, state.proposals, n)
        hint = 0
        for label, (proposed, accepted) in label_outcomes(state.chain, state.proposals, n).items():
            counts = self.by_label.setdefault(label, [0, 0])
            counts[0] += proposed
            counts[1] += accepted
            if has_label(label, HINTS_LABEL):
                hint = max(hint, accepted)
        if hint:
            only = only_accepted(state.chain, state.proposals, n, HINTS_LABEL)
            self.totals["hint_accepted"] += hint
            self.totals["hint_only_accepted"] += only
            export_count(HINT_COUNTERS[0], hint)
            export_count(HINT_COUNTERS[1], only)
        state.accepted += n
        self.totals["accepted"] += n
        self.window.accepted += n

    # ---------------------------------------------------------------------------------------------- metrics

    def metrics(self) -> dict:
        """What the proposer did: ``totals`` since it started (requests, opted out, steps, drafted and accepted
        tokens), ``live`` request states, per drafter label the tokens of verified chains it had proposed and
        how many vLLM accepted (``acceptance_rate``: accepted / proposed, the rate of
        :mod:`~ooospec.runtime.metrics` per drafter), the ``window`` of steps since the last log (mean chain
        length, mean accepted drafts per step, chain length -> steps), and ``faults`` per name."""
        drafters = {label: {"proposed": p, "accepted": a, "acceptance_rate": round(a / p, 4) if p else 0.0}
                    for label, (p, a) in sorted(self.by_label.items())}
        fit = self.step_cost.fit()
        pricing = {"mode": self.config.chain_pricing, "batch": self.batch, "slope": round(self.step_cost.slope(), 5),
                   "price": round(self.chain_cost().slope, 5), "steps_timed": len(self.step_cost.samples),
                   "fit_s": None if fit is None else [round(x, 6) for x in fit]}   # a, b_row, b_draft
        return {"totals": dict(self.totals), "live": len(self.requests), "drafters": drafters,
                "window": self.window.summary(), "pricing": pricing, "faults": dict(sorted(self.faults.items())),
                "switch": self.switch.summary() if self.switch is not None else None}

    def _log_if_due(self) -> None:
        """Log :meth:`metrics` when ``log_interval_s`` has passed since the last log, and start a new window."""
        interval = self.config.log_interval_s
        if interval <= 0:
            return
        now = self.clock()
        if now - self._logged_at < interval:
            return
        logger.info("ooo-spec proposer metrics %s", json.dumps(self.metrics(), sort_keys=True))
        self._logged_at, self.window = now, ChainWindow()


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
        self.steps = StepClock(self.core.step_cost, self.core.clock)
        self._req_ids: list[str] = []
        self._lookup: Callable[[str], tuple[int, Mapping | None]] | None = None
        logger.info("ooo-spec proposer: method %s, chains of up to %d tokens, format %s",
                    self.core.method.name, self.core.max_len, self.core.fmt.NAME)

    def bind_batch(self, req_ids: Sequence[str], lookup: Callable[[str], tuple[int, Mapping | None]]) -> None:
        """This step's requests in batch order; ``lookup(req_id) -> (prompt_len, extra_args)``."""
        self._req_ids = list(req_ids)
        self._lookup = lookup

    def finish_requests(self, req_ids: Sequence[str]) -> None:
        """The requests vLLM finished (done or aborted) since the last step: their states go."""
        for req_id in req_ids:
            self.core.finish(req_id)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **_unused) -> list[list[int]]:
        out: list[list[int]] = []
        decoding = [self._req_ids[i] for i, s in enumerate(sampled_token_ids) if len(s) and i < len(self._req_ids)]
        self.steps.start(decoding)           # the step just run, timed when its batch was the previous one
        self.core.batch = len(decoding)
        draft = self.core.draft_this_step(decoding, sum(len(s) for s in sampled_token_ids if len(s)))
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
            out.append(self.core.step(req_id, tokens, list(sampled), room, draft) if room > 0 else [])
        self.steps.end(len(decoding), sum(len(chain) for chain in out))   # the next step verifies roots + chains
        return out

    def load_model(self, *args, **kwargs) -> None:
        """No model: the drafters are CPU code (vLLM calls this on every proposer)."""
