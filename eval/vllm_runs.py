"""One vLLM bench method's timed requests: its engine settings, run offline (``LLM.generate``) or through ``vllm
serve`` (``--serve-lora``), batch 1, one request after the other (the command line is :mod:`ooospec.eval.vllm_bench`).

    rows = run_method(args, method, records, prompts, sampling, reference)   # one row per request, in order

An ooo-spec method runs as vLLM's ``custom_class`` proposer (:data:`PROPOSER`); vLLM's own by what they draft with
(:func:`speculative_config`). Per request a row holds the wall time, the new tokens and text, and vLLM's spec-decode
counters over the call (:data:`COUNTERS`: drafts, draft tokens, accepted tokens).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ooospec.runtime.backends.quantize import SCHEMES as QUANT_SCHEMES
from ooospec.runtime.backends.quantize import quantization_of
from ooospec.runtime.methods import OOOSPEC, ORACLE, TOOLSPEC, VLLM_REFERENCE, get_method
from ooospec.runtime.sidecar.deployments import WAVE_FIRST as WAVE_FIRST_DEPLOYMENT
from ooospec.runtime.sidecar.prompts import SERVED_NAME
from ooospec.runtime.tokens import common_prefix_len
from ooospec.runtime.vllm.proposer import HINT_COUNTERS

PROPOSER = "ooospec.runtime.vllm.OoOSpecProposer"
WAVE_FIRST = WAVE_FIRST_DEPLOYMENT.name       # the deployment of ooospec-wave-first
PAIRED_HISTORY = "paired-toolspec"           # --paired: the toolspec arm's drafter history (apart from the method's)
WARMUP_HISTORY = "gate-warmup"               # --gate-warmup: its requests' drafter history (apart from the timed arms')
SCHEDULED = ("dedicated", WAVE_FIRST)        # deployments whose hints reach vLLM as a schedule in the request
# Target forwards saved per accepted token that only the hints had proposed (the proposer's
# ``vllm:ooospec_hint_only_accepted_tokens``; the wave-first gate's ``marginal``, its accept rate being those tokens per
# call token). Fitted on eval/reports/vllm-wave-first/hint-only/ (every wave sent, hints from the first step, forwards
# against the paired toolspec arm, 120 requests, both Qwen targets, 4 warm cells): 620 forwards saved for 1516 such
# tokens = 0.41 (0.46-0.48 on bfcl-simple-python, 0.28-0.31 on apibank-l1). The first version priced every
# hint-covered accepted token at 0.35 (most of those the schema FSM proposed as well).
VLLM_CHAIN_MARGINAL = 0.41
# The wave-first gate's prior counts as one request of evidence (the shared gate's: 4): a wave the target waits for
# costs its whole latency, so one wave measured slower than the prior says should stop the next one.
WAVE_FIRST_PRIOR_WEIGHT = 1.0
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")


def speculative_config(method: str, k: int, ngram_k: int) -> dict | None:
    """The engine's ``speculative_config`` for ``method`` (None: plain decoding): ours as vLLM's ``custom_class``
    proposer, vLLM's own by what they draft with (prompt lookup: ``ngram``; ``suffix``)."""
    m = get_method(method)
    if m.is_engine:
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    if "pld" in m.drafters:
        return {"method": "ngram", "num_speculative_tokens": ngram_k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if "suffix" in m.drafters:
        return {"method": "suffix", "num_speculative_tokens": k}
    return None


def ooospec_options(method: str, sidecar_url: str | None, slope: float, wave: dict | None = None) -> dict:
    """``additional_config["ooospec"]`` of an ooo-spec method: the served method the proposer runs (a ceiling runs as
    the method that takes hints, its hints coming with each request)."""
    m = get_method(method)
    options = {"method": OOOSPEC if m.takes_hints else TOOLSPEC, "chain_cost_slope": slope}
    if m.uses_sidecar and sidecar_url and m.deployment is None:   # dedicated: the bench replays a measured wave
        options["sidecar_url"] = sidecar_url
        if wave:
            options.update(sidecar_wave=wave["wave"], sidecar_top_k=wave["top_k"],
                           sidecar_gate=wave.get("gate", "off"))
    return options


def add_engine_arguments(p) -> None:
    """The vLLM engine options every vLLM bench takes (``p``: an argparse parser)."""
    p.add_argument("--threads", type=int, default=2, help="CPU threads (VLLM_CPU_OMP_THREADS_BIND=0-(N-1))")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--quantized", default=None, choices=sorted(QUANT_SCHEMES), metavar="SCHEME",
                   help="run the target's quantized checkpoint from the cache (`ooospec models quantize TARGET "
                        f"--scheme SCHEME`; {', '.join(QUANT_SCHEMES)}) instead of its bf16 weights")
    p.add_argument("--k", type=int, default=16, help="num_speculative_tokens of the ooo-spec methods")
    p.add_argument("--ngram-k", type=int, default=8, help="num_speculative_tokens of vllm-ngram")
    p.add_argument("--chain-cost-slope", type=float, default=0.02)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="on a GPU: the share of its memory the target's engine takes (vLLM's default 0.9; less when "
                        "a sidecar server runs on the same GPU)")


def sidecar_wave(args) -> dict:
    """The sidecar client's wave options of a run (``--sidecar-wave``, ``--sidecar-top-k``, ``--sidecar-gate``)."""
    return {"wave": getattr(args, "sidecar_wave", "all"), "top_k": getattr(args, "sidecar_top_k", 2),
            "gate": getattr(args, "sidecar_gate", "off")}


def request_xargs(method: str, record: dict, reference_text: str | None, schedule: list | None = None) -> dict:
    """A request's ``extra_args``: its tools and messages (JSON text), the oracle's hint, and the dedicated
    emulation's hint schedule (``[[after_s, calls], ...]`` of the wave timed alone, :func:`dedicated_schedules`)."""
    m = get_method(method)
    if not m.is_engine:
        return {}
    xargs = {"ooospec_tools": json.dumps(record["tools"]), "ooospec_messages": json.dumps(record["messages"])}
    if m.hints == ORACLE:
        if reference_text is None:
            raise ValueError(f"{method} needs the {VLLM_REFERENCE!r} output of {record['id']!r} first")
        xargs["ooospec_hint"] = reference_text
    if m.deployment in SCHEDULED:
        if schedule is None:
            raise ValueError(f"{method} needs the hint schedule of {record['id']!r} (its wave) first")
        xargs["ooospec_hint_schedule"] = json.dumps(schedule)
    return xargs


class AloneWaves:
    """Sidecar waves run ALONE on ``url``'s server, one request after the other (nothing else computes meanwhile):
    what ``ooospec-dedicated`` times before vLLM loads and what ``ooospec-wave-first`` waits for inside each request.

        waves = AloneWaves(url, tokenizer, fmt, wave={"wave": "function-first", "top_k": 2}, warm_tools=True)
        waves.prepare(record)                     # untimed: the toolbox prefilled (warm) or every block forgotten
        guess = waves.alone(record, arrival)      # the wave, waited for: each bank with its latency from arrival
    """

    name = "ooospec-dedicated"

    def __init__(self, url: str, tokenizer, fmt, *, wave: dict, warm_tools: bool, gate=None,
                 timeout: float | None = None):
        from ooospec.eval.ooospec_method import WAVE_FIRST_TIMEOUT_S
        from ooospec.runtime.sidecar.client import SidecarClient

        self.url, self.warm_tools, self.tokenizer, self.fmt = url, warm_tools, tokenizer, fmt
        self.client = SidecarClient(url, wave=wave["wave"], top_k=wave["top_k"], gate=gate)
        self.timeout = WAVE_FIRST_TIMEOUT_S if timeout is None else timeout

    def prepare(self, record: dict) -> None:
        """Untimed, before the request's clock: the server idle, holding this request's toolbox (warm) or no block
        at all (cold; a server that cannot forget stops the bench)."""
        from ooospec.runtime.sidecar.process import reset_prefix_cache, wait_idle
        from ooospec.runtime.sidecar.prompts import toolbox_messages

        wait_idle(self.url)
        if self.warm_tools:
            self.client.prefill(toolbox_messages(record["messages"]), record["tools"], wait=True)
        elif not reset_prefix_cache(self.url):
            raise SystemExit(f"{self.name}: {self.url} did not forget its blocks (POST /reset_prefix_cache), so the "
                             f"cold waves would start warm")

    def alone(self, record: dict, arrival: float):
        """The request's wave, submitted at ``arrival`` and waited for (a ``ReleasedGuess``: each distinct bank with
        its latency; its ``req`` keeps the client's stats and the gate's decision)."""
        from ooospec.eval.ooospec_method import ReleasedGuess

        req = self.client.submit(record["messages"], record["tools"], fmt=self.fmt, tokenizer=self.tokenizer,
                                 arrival=arrival)
        return ReleasedGuess.after_alone(req, arrival, self.timeout)


class WaveFirst(AloneWaves):
    """``ooospec-wave-first`` (REAL, the sidecar on the target's cores): the request's sidecar wave runs first, inside
    the request's clock, while the target's engine waits idle; then the target decodes with the wave's last bank as
    hints from its first step. Nothing runs beside anything else on the cores, so the row is a measured deployment
    (the wave's seconds plus the target's), not an emulation. ``gate``: a client-side
    :class:`~ooospec.runtime.sidecar.gate.WaveGate` (the ``wave-first`` prior) that may skip a request's wave; the
    target then decodes as ``toolspec`` would (an empty schedule). With a gate the first request runs without a
    wave: its seconds per verify step and its tokens price the target for the gate (``calibrate_target``), as the
    server's ``/health`` prices the sidecar; the gate then learns from every request (:meth:`observe`).

        wf = WaveFirst(url, tokenizer, fmt, wave={"wave": "function-first", "top_k": 2}, warm_tools=True)
        wf.prepare(record)                        # untimed: the toolbox prefilled (warm) or every block forgotten
        schedule, info = wf.run(record, arrival)  # timed: [[0.0, calls]] (or []) and the wave's seconds, decision
    """

    name = "ooospec-wave-first"

    def __init__(self, url: str, tokenizer, fmt, **kwargs):
        from ooospec.runtime.sidecar.gate import StepFit

        super().__init__(url, tokenizer, fmt, **kwargs)
        self.target_measured = False    # a gate decides only once one request has priced the target here
        self.steps = StepFit()          # the target's seconds per step, over its requests' target parts

    @classmethod
    def for_run(cls, args) -> WaveFirst:
        """The run's: ``--sidecar-url``, the target's tokenizer and format, ``--sidecar-wave/-top-k/-gate``, warm
        when ``--warm-tools`` cached the toolbox blocks."""
        if not getattr(args, "sidecar_url", None):
            raise SystemExit("ooospec-wave-first needs --sidecar-url (its waves run on that server, in each request)")
        from transformers import AutoTokenizer

        from ooospec.runtime.formats import detect_format

        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        return cls(args.sidecar_url, tokenizer, detect_format(tokenizer), wave=sidecar_wave(args),
                   warm_tools=bool(getattr(args, "blocks", None)), gate=wave_first_gate(args))

    def run(self, record: dict, arrival: float) -> tuple[list, dict]:
        """The request's wave, waited for: its schedule (the last bank's calls at 0 s; [] when the gate skipped the
        wave or it failed) and ``{"wave_s", "banks", "decision"}``."""
        if self.client.gate is not None:
            from ooospec.runtime.sidecar.gate import tools_key

            self._key = tools_key(record["tools"])
        if self.client.gate is not None and not self.target_measured:
            self._decision = self._stats = None     # nothing to weigh a wave against yet: run the target alone
            return [], {"wave_s": round(time.perf_counter() - arrival, 4), "banks": [],
                        "decision": {"decision": "skip", "why": "the target's step time is not measured yet"}}
        guess = self.alone(record, arrival)
        req = guess.req
        wave_s = time.perf_counter() - arrival
        schedule = [[0.0, guess.schedule[-1][1].calls]] if guess.schedule else []
        self._decision = getattr(req, "decision", None)
        self._stats = req.stats() if hasattr(req, "stats") else None
        return schedule, {"wave_s": round(wave_s, 4), "banks": [round(t, 4) for t, _ in guess.schedule],
                          "decision": self._decision.to_dict() if self._decision is not None else None}

    def observe(self, target_s: float, new_tokens: int, forwards: int, hint_only: int | None = None,
                text: str | None = None) -> None:
        """The request is over: teach the gate (if any) what it saw -- the target's tokens, forwards and seconds per
        verify step (vLLM reports no per-step times: the slope of the target's seconds over its forwards across the
        requests so far, :class:`~ooospec.runtime.sidecar.gate.StepFit`, the request's mean until there is one)
        and, for a wave it sent, the server's timings and the client-seen latency (what a wave costs here, beyond
        ``/health``'s calibration). ``hint_only``: the accepted tokens only the wave's hints had proposed (the
        proposer's :data:`~ooospec.runtime.vllm.proposer.HINT_COUNTERS`, read around the request), what the gate's
        accept rate learns (None: the accept rate keeps what it had). ``text``: the target's output; its calls teach
        the gate each slot's value length (what a wave decodes: the price of a slot query, ``gate.decide``'s
        ``value_chars``)."""
        from ooospec.runtime.sidecar.outcome import WaveOutcome, value_chars

        gate = self.client.gate
        if gate is None:
            return
        steps = max(int(forwards), 1)
        decision = getattr(self, "_decision", None)
        stats = getattr(self, "_stats", None)
        sent = decision is not None and decision.kind != "skip" and stats is not None
        self.steps.add(steps, float(target_s))                       # the target's part: a forward is a forward
        step_s = self.steps.step_s() or float(target_s) / steps     # the slope over the requests so far
        if not self.target_measured:
            self.target_measured = gate.calibrate_target(step_s, int(new_tokens))
        calls = self.fmt.parse_calls(text) if text else []
        gate.observe(WaveOutcome(
            key=decision.key if decision is not None else self._key, kind=decision.kind if sent else "skip",
            call_tokens=int(new_tokens), tokens_after_ready=int(new_tokens) if sent and hint_only is not None else 0,
            accepted_hint_tokens=int(hint_only or 0) if sent else 0, target_prefill_s=0.0,
            target_decode_s=float(target_s), idle_step_s=(step_s,) * steps,
            server=dict(stats.server) if sent else {}, wave_s=stats.wave_s if sent else None,
            num_queries=stats.n_queries if sent else 0, values=value_chars(calls),
            model_latency_s=decision.model_latency_s if sent else 0.0))


def wave_first_gate(args):
    """``ooospec-wave-first``'s client-side wave gate: None with ``--sidecar-gate off``, else a
    :class:`~ooospec.runtime.sidecar.gate.WaveGate` from the ``wave-first`` deployment's prior (calibrated by the
    server's ``/health``): the target waits for a wave, so all of the wave's latency is its cost."""
    if getattr(args, "sidecar_gate", "off") == "off":
        return None
    from dataclasses import replace

    from ooospec.runtime.sidecar.gate import WaveGate

    return WaveGate(replace(WAVE_FIRST_DEPLOYMENT.prior, marginal=VLLM_CHAIN_MARGINAL),
                    prior_weight=WAVE_FIRST_PRIOR_WEIGHT)


def dedicated_schedules(url: str, records: list[dict], tokenizer, fmt, *, wave: dict, warm_tools: bool,
                        timeout: float = 60.0) -> dict[str, list]:
    """``record id -> [[after_s, calls], ...]``: each request's sidecar wave run ALONE (nothing else runs: no vLLM
    engine is loaded yet), one request after the other, each bank it produced (a function-first wave's early one,
    then the final one) with its latency from submission -- what ``ooospec-dedicated`` replays inside vLLM.
    ``warm_tools``: the request's toolbox is prefilled first, untimed; else the server forgets every earlier block
    first (a cold toolbox: no earlier request's block either). A failed wave gives an empty schedule."""
    waves = AloneWaves(url, tokenizer, fmt, wave=wave, warm_tools=warm_tools, timeout=timeout)   # nothing to gate
    out = {}
    for record in records:
        waves.prepare(record)
        guess = waves.alone(record, time.perf_counter())
        out[record["id"]] = [[round(t, 4), bank.calls] for t, bank in guess.schedule]
    if records and not any(out.values()):
        raise SystemExit(f"ooospec-dedicated: no wave of the {len(records)} requests was answered by {url} (is the "
                         f"sidecar server up, and is it ours?): the row would be toolspec's, not the emulation")
    return out


def counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters and the proposer's hint counters now (zeros for plain decoding)."""
    out = dict.fromkeys(COUNTERS + HINT_COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in out:
            out[metric.name] += float(getattr(metric, "value", 0.0) or 0.0)
    return out


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where token lists ``a`` and ``b`` differ (the shorter one's length when one is a prefix
    of the other); None when they are equal."""
    n = common_prefix_len(a, b)
    return None if n == len(a) == len(b) else n


def margin_at(logprobs, position: int) -> float | None:
    """The top-2 logprob margin behind the reference token at ``position`` (vLLM ``logprobs=2``)."""
    if logprobs is None or position >= len(logprobs) or not logprobs[position]:
        return None
    values = sorted((lp.logprob for lp in logprobs[position].values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def next_token_margins(llm, prompts: Sequence[Sequence[int]], extra_args: dict | None = None) -> list[float | None]:
    """The top-2 logprob margin of the next token after each prompt (token ids), by ``llm`` (a vLLM ``LLM``) in one
    untimed greedy batch; ``extra_args`` e.g. ``{"ooospec": "off"}`` for an engine that drafts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2, extra_args=extra_args)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [margin_at(o.outputs[0].logprobs, 0) for o in outs]


def engine_kwargs(args, method: str) -> dict:
    kw = {"model": args.model_dir, "tokenizer": args.model_dir, "dtype": args.dtype,
          "max_model_len": args.max_model_len, "enable_prefix_caching": bool(getattr(args, "warm_tools", False)),
          "seed": 0,
          "disable_log_stats": False, "max_num_seqs": 1}
    if getattr(args, "gpu_memory_utilization", None):
        kw["gpu_memory_utilization"] = args.gpu_memory_utilization
    spec = speculative_config(method, args.k, args.ngram_k)
    if spec is not None:
        kw["speculative_config"] = spec
    if get_method(method).is_engine:
        kw["additional_config"] = {"ooospec": ooospec_options(method, args.sidecar_url, args.chain_cost_slope,
                                                              sidecar_wave(args))}
    return kw


def warm_block(llm, ids: Sequence[int], block: int | None) -> None:
    """``--warm-tools``: the engine's prefix cache holds exactly the request's first ``block`` tokens (its system +
    tools block) and nothing else; no-op without a block (cold)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    if block:
        llm.reset_prefix_cache()
        llm.generate([TokensPrompt(prompt_token_ids=list(ids[:block]))], SamplingParams(temperature=0.0, max_tokens=1),
                     use_tqdm=False)


def toolspec_arm(llm, params: dict, record: dict, ids: Sequence[int], block: int | None) -> dict:
    """``--paired``: the request again on the same engine as ``toolspec`` (no hints: no schedule and no sidecar; a
    drafter history of its own, :data:`PAIRED_HISTORY`), from the same cache state; its seconds, tokens, accepted."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    warm_block(llm, ids, block)
    sp = SamplingParams(**params, extra_args={**request_xargs(TOOLSPEC, record, None),
                                              "ooospec_history": PAIRED_HISTORY})
    before = counters(llm)
    t = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0].outputs[0]
    wall = time.perf_counter() - t
    after = counters(llm)
    return {"toolspec_s": wall, "tokens": list(out.token_ids),
            "accepted": int(after[COUNTERS[2]] - before[COUNTERS[2]])}


def warm_gate(llm, wave_first: WaveFirst, method: str, params: dict, warmup: dict) -> None:
    """``--gate-warmup``: each of ``warmup``'s requests (``{"records", "prompts", "blocks"}``: requests that are not
    timed) run as a timed one would (the same cache state, the wave if the gate sends it, then the target) and teach
    the gate; nothing is recorded. A deployed gate has seen earlier traffic on its machine; these are that traffic.
    The target's drafters learn from them in a history of their own (:data:`WARMUP_HISTORY`): the timed arms (this
    method's and ``--paired``'s toolspec) start from the same drafter state, else the method would retrieve from the
    warm-up's calls and its pair would not."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    blocks = warmup.get("blocks")
    for i, (record, ids) in enumerate(zip(warmup["records"], warmup["prompts"])):
        warm_block(llm, ids, blocks[i] if blocks else None)
        wave_first.prepare(record)
        before = counters(llm)
        t = time.perf_counter()
        schedule, wave = wave_first.run(record, t)
        sp = SamplingParams(**params, extra_args={**request_xargs(method, record, None, schedule),
                                                  "ooospec_history": WARMUP_HISTORY})
        out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0].outputs[0]
        wall = time.perf_counter() - t
        after = counters(llm)
        accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
        tokens = len(out.token_ids)
        wave_first.observe(wall - wave["wave_s"], tokens, max(tokens - accepted, 1),
                           hint_only=int(after[HINT_COUNTERS[1]] - before[HINT_COUNTERS[1]]), text=out.text)
        decision = (wave["decision"] or {}).get("decision", "-")
        print(f"[vllm-bench] gate warm-up {record['id']}: {decision}, {wall:.2f}s", file=sys.stderr)
    gate = wave_first.client.gate
    print(f"[vllm-bench] gate after {len(warmup['records'])} warm-up requests: {gate.summary()['decisions']}, "
          f"accept {gate.estimates().accept_rate}", file=sys.stderr)


def run_method(args, method: str, records: list[dict], prompts: list[list[int]], params,
               reference: dict[str, dict]) -> list[dict]:
    """Build the method's engine, warm it up, time every request; rows in record order."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if get_method(method).prefill_only:        # time to the first token: the prompt's forward
        params = {**params, "max_tokens": 1}
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(args, method))
    load_s = time.perf_counter() - t0
    rows = []
    try:
        schedules = dict(getattr(args, "hint_schedules", None) or {})
        wave_first = None
        if get_method(method).deployment == WAVE_FIRST:
            wave_first = WaveFirst.for_run(args)
            schedules[records[0]["id"]] = []          # the warm-up request: no wave
        warm_xargs = request_xargs(method, records[0], reference.get(records[0]["id"], {}).get("text"),
                                   schedules.get(records[0]["id"])) or None
        if wave_first is not None and warm_xargs is not None:    # its history stays the paired arm's alike
            warm_xargs = {**warm_xargs, "ooospec_history": WARMUP_HISTORY}
        warm = SamplingParams(**{**params, "max_tokens": 16}, extra_args=warm_xargs)
        llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], warm, use_tqdm=False)
        if wave_first is not None and (getattr(args, "warmup", None) or {}).get("records") \
                and wave_first.client.gate is not None:
            warm_gate(llm, wave_first, method, params, args.warmup)
        sidecar = engine_kwargs(args, method).get("additional_config", {}).get("ooospec", {}).get("sidecar_url")
        blocks = getattr(args, "blocks", None)
        paired = wave_first is not None and bool(getattr(args, "paired", False))
        for i, (record, ids) in enumerate(zip(records, prompts)):
            block = blocks[i] if blocks else None
            pair = toolspec_arm(llm, params, record, ids, block) if paired and i % 2 else None   # odd: toolspec first
            warm_block(llm, ids, block)
            ref = reference.get(record["id"], {})
            if sidecar:       # the previous request's wave may still run: untimed, let it finish
                from ooospec.runtime.sidecar.process import reset_prefix_cache, wait_idle

                wait_idle(sidecar)
                if not blocks:    # a cold toolbox: the sidecar holds no earlier block either
                    reset_prefix_cache(sidecar)
            if wave_first is not None:
                wave_first.prepare(record)
            sp = None if wave_first is not None else SamplingParams(     # wave-first: once its wave is in
                **params, extra_args=request_xargs(method, record, ref.get("text"), schedules.get(record["id"]))
                or None)
            before = counters(llm)
            t = time.perf_counter()
            wave = None
            if wave_first is not None:       # inside the clock: the wave, waited for, then the target
                schedules[record["id"]], wave = wave_first.run(record, t)
                sp = SamplingParams(**params, extra_args=request_xargs(method, record, None, schedules[record["id"]]))
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
            wall = time.perf_counter() - t
            after = counters(llm)
            tokens = list(out.token_ids)
            accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
            extra = {"released_s": [t for t, _ in schedules[record["id"]]]} if record["id"] in schedules else {}
            hints = {"hint_accepted": int(after[HINT_COUNTERS[0]] - before[HINT_COUNTERS[0]]),
                     "hint_only_accepted": int(after[HINT_COUNTERS[1]] - before[HINT_COUNTERS[1]])}
            if get_method(method).takes_hints:
                extra.update(hints)
            if wave is not None:
                extra["wave"] = wave
                wave_first.observe(wall - wave["wave_s"], len(tokens), max(len(tokens) - accepted, 1),
                                   hint_only=hints["hint_only_accepted"], text=out.text)
            if paired:
                first = "toolspec" if pair is not None else method
                pair = pair or toolspec_arm(llm, params, record, ids, block)
                extra["paired"] = {"toolspec_s": pair["toolspec_s"], "toolspec_accepted": pair["accepted"],
                                   "same_tokens": pair["tokens"] == tokens, "first": first}
            rows.append({**extra, "record_id": record["id"], "method": method, "prompt_len": len(ids),
                         "time_s": wall, "new_tokens": len(tokens), "tokens": tokens, "text": out.text,
                         "drafts": int(after[COUNTERS[0]] - before[COUNTERS[0]]),
                         "draft_tokens": int(after[COUNTERS[1]] - before[COUNTERS[1]]),
                         "accepted": accepted, "forwards": max(len(tokens) - accepted, 1),
                         "load_s": load_s})
            print(f"[vllm-bench] {method} {record['id']}: {wall:.2f}s, {len(tokens)} tokens, {accepted} accepted",
                  file=sys.stderr)
        if method == VLLM_REFERENCE and args.classify:
            margins_for = SamplingParams(**params, logprobs=2)
            for row, ids in zip(rows, prompts):
                lp = llm.generate([TokensPrompt(prompt_token_ids=ids)], margins_for, use_tqdm=False)[0].outputs[0]
                row["margins"] = [margin_at(lp.logprobs, i) for i in range(len(lp.token_ids))]
    finally:
        del llm
        gc.collect()
    return rows


def server_command(args, method: str, port: int) -> list[str]:
    """``--serve-lora``: the OpenAI server of one method; the sidecar adapter is a LoRA module of the same engine,
    and ``ooospec`` sends its waves to that same server, so they are batched with the target's steps."""
    kw = engine_kwargs(args, method)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kw["model"], "--port", str(port),
           "--dtype", kw["dtype"], "--max-model-len", str(kw["max_model_len"]), "--no-enable-prefix-caching",
           "--seed", "0", "--max-num-seqs", str(args.server_max_seqs), "--enable-lora", "--max-lora-rank", "64",
           "--lora-modules", f"{SERVED_NAME}={args.serve_lora}"]
    if "gpu_memory_utilization" in kw:
        cmd += ["--gpu-memory-utilization", str(kw["gpu_memory_utilization"])]
    if "speculative_config" in kw:
        cmd += ["--speculative-config", json.dumps(kw["speculative_config"])]
    if "additional_config" in kw:
        options = dict(kw["additional_config"]["ooospec"])
        if get_method(method).uses_sidecar:
            options.update(sidecar_url=f"http://127.0.0.1:{port}", sidecar_model=SERVED_NAME)
        cmd += ["--additional-config", json.dumps({"ooospec": options})]
    return cmd


def stop_server(proc, timeout_s: float = 60.0) -> None:
    """Terminate a server process; kill it when it has not exited after ``timeout_s``."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def scrape_counters(url: str) -> dict[str, float]:
    """The spec-decode counters of a server's ``/metrics`` (Prometheus text)."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for name in COUNTERS:
            if line.startswith(name + "_total"):
                out[name] += float(line.split()[-1])
    return out


def wait_idle(url: str, timeout_s: float = 120.0) -> None:
    """Until the server runs and queues no request (its ``/metrics`` gauges), at most ``timeout_s``."""
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        busy = sum(float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
        if busy == 0:
            return
        time.sleep(0.05)


def run_server_method(args, method: str, records: list[dict], prompts: list[list[int]], params: dict,
                      reference: dict[str, dict]) -> list[dict]:
    """:func:`run_method` against ``vllm serve`` (``--serve-lora``), timed at the client, one request at a time."""
    import subprocess
    import urllib.request

    from ooospec.runtime.sidecar.process import free_port, health

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(args.out).with_suffix(f".{method}.server.log"), "w")   # noqa: SIM115 - closed below
    proc = subprocess.Popen(server_command(args, method, port), stdout=log, stderr=subprocess.STDOUT)

    def post(ids: list[int], record: dict, max_tokens: int) -> dict:
        ref = reference.get(record["id"], {})
        body = {"model": args.model_dir, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                "stop": params["stop"], "stop_token_ids": params["stop_token_ids"],
                "include_stop_str_in_output": True, "skip_special_tokens": False, "return_token_ids": True,
                "vllm_xargs": request_xargs(method, record, ref.get("text")) or None}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=600).read())["choices"][0]

    rows = []
    try:
        deadline = time.time() + 900
        while health(url) is None:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"vllm-bench: the {method} server did not start; see {log.name}")
            time.sleep(1)
        post(prompts[0], records[0], 16)
        for record, ids in zip(records, prompts):
            before = scrape_counters(url)
            t = time.perf_counter()
            choice = post(ids, record, params["max_tokens"])
            wall = time.perf_counter() - t
            wait_idle(url)        # the sidecar's wave (ooospec) may still run: let it finish, untimed
            after = scrape_counters(url)
            tokens = list(choice.get("token_ids") or [])
            accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
            rows.append({"record_id": record["id"], "method": method, "prompt_len": len(ids), "time_s": wall,
                         "new_tokens": len(tokens), "tokens": tokens, "text": choice["text"],
                         "drafts": int(after[COUNTERS[0]] - before[COUNTERS[0]]),
                         "draft_tokens": int(after[COUNTERS[1]] - before[COUNTERS[1]]),
                         "accepted": accepted, "forwards": max(len(tokens) - accepted, 1), "served": True})
            print(f"[vllm-bench] served {method} {record['id']}: {wall:.2f}s, {len(tokens)} tokens, "
                  f"{accepted} accepted", file=sys.stderr)
    finally:
        stop_server(proc)
        log.close()
    return rows

def sampling_params(model_dir: str, tokenizer, fmt, max_new_tokens: int) -> dict:
    """Greedy, batch 1, the same stop rule for every method: the target's EOS ids and the format's closing tag."""
    eos = sorted({t for t in (tokenizer.eos_token_id, *_gen_eos(model_dir)) if t is not None})
    stop = fmt.call_suffix.strip()
    return {"temperature": 0.0, "max_tokens": max_new_tokens, "stop_token_ids": eos,
            "stop": [stop] if stop else None, "include_stop_str_in_output": True, "skip_special_tokens": False}


def _gen_eos(model_dir: str) -> list[int]:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def environment(args) -> dict:
    """A vLLM run's ``env`` block: vLLM's version, the CPU and its flags, threads, dtype, the drafting settings and
    the vLLM CPU env; a bench adds or overrides its own keys."""
    from importlib.metadata import PackageNotFoundError, version

    from ooospec.runtime.backends.hardware import cpu_info

    vllm_version = "not installed"
    for dist in ("vllm", "vllm-cpu"):         # vLLM's CPU build is its own distribution
        try:
            vllm_version = f"{version(dist)} ({dist})"
            break
        except PackageNotFoundError:
            continue
    return {"vllm": vllm_version, "python": platform.python_version(), "cpu": cpu_info(),
            "threads": args.threads, "dtype": args.dtype,
            "quantization": quantization_of(args.model_dir) if getattr(args, "model_dir", None) else None,
            "k": args.k, "ngram_k": getattr(args, "ngram_k", None),
            "max_model_len": getattr(args, "max_model_len", None), "max_new_tokens": args.max_new_tokens,
            "prefix_caching": bool(getattr(args, "warm_tools", False)),
            "warm_tools": bool(getattr(args, "warm_tools", False)),
            "batch": 1,
            "chain_cost_slope": args.chain_cost_slope, "argv": sys.argv[1:],
            "served": bool(getattr(args, "serve_lora", None)),
            "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING")}}
