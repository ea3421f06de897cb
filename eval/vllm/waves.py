"""The sidecar's waves in a vLLM bench: run alone before vLLM loads (``ooospec-dedicated``'s schedules) or first,
inside each request's clock (``ooospec-wave-first``), and the client-side gate that may skip them.

    schedules = dedicated_schedules(url, records, tokenizer, fmt, wave=sidecar_wave(args), warm_tools=True)
    wf = WaveFirst.for_run(args)                    # ooospec-wave-first: wf.prepare(record); wf.run(record, t)
"""

from __future__ import annotations

import time

from ooospec.runtime.sidecar.deployments import WAVE_FIRST as WAVE_FIRST_DEPLOYMENT

WAVE_FIRST = WAVE_FIRST_DEPLOYMENT.name       # the deployment of ooospec-wave-first
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

def sidecar_wave(args) -> dict:
    """The sidecar client's wave options of a run (``--sidecar-wave``, ``--sidecar-top-k``, ``--sidecar-gate``)."""
    return {"wave": getattr(args, "sidecar_wave", "all"), "top_k": getattr(args, "sidecar_top_k", 2),
            "gate": getattr(args, "sidecar_gate", "off")}



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
        from ooospec.eval.bench.ooospec_method import WAVE_FIRST_TIMEOUT_S
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
        from ooospec.eval.bench.ooospec_method import ReleasedGuess

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
