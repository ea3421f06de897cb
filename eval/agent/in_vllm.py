"""``ooospec agent-bench --engine vllm``: the agent loop with the target in vLLM, sessions as vLLM's prefix cache,
and tools started from the sidecar's call before the target has written it.

Run in the vLLM environment (README "vLLM"), with a sidecar server running (``ooospec sidecar serve``)::

    ooospec agent-bench --engine vllm --target qwen2.5-coder-1.5b --limit 2 --latencies 0,0.5,2 \\
        --speculator sidecar --sidecar-url http://127.0.0.1:8765 --sidecar-wave function-first \\
        --out eval/reports/agents/vllm/qwen2.5-coder-1.5b.json

The dialogues and their replay are :mod:`ooospec.eval.agent.cli`'s (the same loop,
:func:`ooospec.runtime.agent.loop.run_agent`); here the target is one in-process vLLM engine running ooo-spec's
``custom_class`` proposer (``toolspec``'s drafters: schema FSM, retrieval, prompt lookup; a request with an
``ooospec_hint_schedule`` adds the hints), greedy, batch 1, prefix caching on. Each (latency, variant) keeps its
own drafter history in the proposer (``ooospec_history``), so no variant learns from another's calls.

Variants (every dialogue starts from an empty vLLM prefix cache with only its toolbox -- the system + tools
block -- cached, untimed; the sidecar likewise starts each dialogue with only the toolbox in its cache):

================  =======================================================================================
``stateless``     vLLM's prefix cache emptied before every turn: each turn prefills the whole conversation
``sessions``      the prefix cache keeps the conversation between turns; the tool runs after the call
                  (``toolspec`` + sessions: the baseline of the issue's criterion)
``speculative``   sessions + the sidecar's wave sent at each turn's arrival, on the SAME cores as the target (the
                  ``shared`` deployment, real): when its joined call is ready, a side-effect-free tool runs at
                  once; a key hit serves its result when the target's call is complete. The target drafts as
                  ``toolspec`` (a wave's hints cannot reach a request already in vLLM)
``dedicated``     EMULATED (the seeds' deployment: the sidecar on a device of its own, as fast as this CPU):
                  each turn's wave is run ALONE first (vLLM idle; untimed, excluded from the dialogue's wall
                  time), then the turn runs with the wave's joined call handed to the tools at the wave's
                  measured latency, and its banks released to the target as hints at their latencies
                  (``ooospec_hint_schedule``)
``wave-first``    REAL, the sidecar on the target's cores: each turn's wave runs first, inside the turn's time,
                  the target waiting (nothing runs beside anything); its joined call starts the tool at the
                  wave's end and its banks are hints from the target's first step
``history``       sessions + the loop's own earlier calls run speculatively at each turn's arrival (no sidecar;
                  ``--speculate-history N`` >= 1, which adds the same guesses to ``speculative`` and ``dedicated``)
================  =======================================================================================

With ``--speculator gold`` the guessed call is the step's recorded call, ready at arrival (the ceiling; no wave,
so no ``dedicated`` variant). Every replayed tool is side-effect free (:class:`~ooospec.eval.agent.cli.ReplayTools`);
a side-effecting tool is never run speculatively (:class:`~ooospec.runtime.agent.tools.SpeculativeTools`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from ooospec.eval.agent.replay import (
    HISTORY_VARIANT,
    Dialogue,
    ReplayTools,
    check_history_variants,
    counting,
    history_for,
    make_guesser,
    mark_exact,
    run_row,
    summarize,
    write_tables,
)
from ooospec.eval.vllm.runs import first_divergence, next_token_margins
from ooospec.runtime.backends.hardware import vllm_dtype
from ooospec.runtime.methods import GOLD, OOOSPEC, SIDECAR

WAVE_FIRST_VARIANT = "wave-first"
VLLM_VARIANTS = ("stateless", "sessions", "speculative", "dedicated", WAVE_FIRST_VARIANT, HISTORY_VARIANT)
PROPOSER = "ooospec.runtime.vllm.OoOSpecProposer"


class VllmChat:
    """The target in an in-process vLLM engine behind the agent loop's chat interface
    (:meth:`~ooospec.runtime.agent.chat.ChatModel.complete`'s arguments and
    :class:`~ooospec.runtime.agent.chat.ChatTurn`).

    Args:
        llm: a ``vllm.LLM`` running :data:`PROPOSER` with prefix caching on.
        params: ``SamplingParams`` keywords (greedy; the format's end of a call as a stop string).
        history: the proposer's drafter history for this chat's requests (``ooospec_history``).
        stateless: empty vLLM's prefix cache before every turn.
    """

    takes_hints = True     # a dedicated guess's banks go to the proposer as a hint schedule; others are not sent

    def __init__(self, llm, tokenizer, fmt, params: dict, *, history: str, stateless: bool = False,
                 eos_token_ids: Sequence[int] = ()):
        self.llm, self.tokenizer, self.fmt = llm, tokenizer, fmt
        self.params, self.history, self.stateless = params, history, stateless
        self.eos_token_ids = set(eos_token_ids)
        self.trace: list[tuple[list[int], list[int]]] = []    # (prompt, output) of each turn (classification)

    def encode(self, messages: list[dict], tools: list[dict]) -> list[int]:
        text = self.fmt.render_prompt(self.tokenizer, messages, tools)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def warm_toolbox(self, messages: Sequence[dict], tools: Sequence[dict]) -> None:
        """Untimed: vLLM's prefix cache emptied, then holding only this conversation's system + tools block."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from ooospec.runtime.agent.chat import system_tools_block
        from ooospec.runtime.formats import common
        from ooospec.runtime.formats.messages import normalize_messages

        self.llm.reset_prefix_cache()
        block = system_tools_block(self.fmt, self.tokenizer, normalize_messages(messages),
                                   common.wrap_tools(list(tools)))
        self.llm.generate([TokensPrompt(prompt_token_ids=block)], SamplingParams(temperature=0.0, max_tokens=1),
                          use_tqdm=False)

    def complete(self, messages: Sequence, tools: Sequence = (), *, max_new_tokens: int = 256, hints=None):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from ooospec.runtime.agent.chat import ChatTurn
        from ooospec.runtime.engine import GenerationResult
        from ooospec.runtime.formats import common
        from ooospec.runtime.formats.messages import normalize_messages

        messages = normalize_messages(messages)
        tools = common.wrap_tools(list(tools)) if tools else []
        names = [t["function"]["name"] for t in tools]
        prompt = self.encode(messages, tools)
        xargs = {"ooospec_tools": json.dumps(tools), "ooospec_history": self.history}
        schedule = hint_schedule(hints)
        if schedule is not None:
            xargs["ooospec_hint_schedule"] = json.dumps(schedule)
        if self.stateless:
            self.llm.reset_prefix_cache()
        sp = SamplingParams(**{**self.params, "max_tokens": max_new_tokens}, extra_args=xargs)
        t0 = time.perf_counter()
        out = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        tokens = list(out.outputs[0].token_ids)
        self.trace.append((prompt, tokens))
        text = self.tokenizer.decode([t for t in tokens if t not in self.eos_token_ids], skip_special_tokens=False)
        calls = [c for c in self.fmt.parse_calls(text) if c["name"] in names] if tools else []
        length = out.outputs[0].finish_reason == "length"
        reason = "tool_calls" if calls else ("length" if length else "stop")
        cached = int(getattr(out, "num_cached_tokens", 0) or 0)
        result = GenerationResult(tokens=tokens, n_forwards=0, steps=[], prefill_s=0.0, decode_s=wall,
                                  stop_reason="max_new_tokens" if length else "stop")
        return ChatTurn(text=text, calls=calls, finish_reason=reason, prompt_tokens=len(prompt),
                        completion_tokens=len(tokens), cached_tokens=cached,
                        origin="stateless" if self.stateless else ("prefix" if cached else "new"), result=result)


def hint_schedule(guess) -> list | None:
    """A dedicated guess's banks as ``ooospec_hint_schedule`` (``[[after_s, calls], ...]``, the offsets counted
    from now); None for any other guess (its hints are not sent)."""
    from ooospec.eval.bench.ooospec_method import ReleasedGuess

    if not isinstance(guess, ReleasedGuess):
        return None
    elapsed = time.perf_counter() - guess.start
    return [[round(max(t - elapsed, 0.0), 4), bank.calls] for t, bank in guess.schedule if bank.calls]


def dedicated_guesser(client, chat: VllmChat, excluded: list[float] | None):
    """``(messages, tools, turn) -> ReleasedGuess``: the turn's wave run ALONE now (nothing else runs), its banks
    replayed from the turn's start; the time spent is added to ``excluded[0]`` (not part of the dialogue).
    ``excluded`` None (``wave-first``, real): the wave is part of the turn's time, the target waiting for it; its
    banks are all out when the target starts, and its joined call starts the tool at the wave's end."""
    from ooospec.eval.bench.ooospec_method import ReleasedGuess
    from ooospec.runtime.sidecar.process import wait_idle

    def guess(messages: list[dict], tools: list, turn: int):
        t0 = time.perf_counter()
        if excluded is not None:    # a wave-first wave never outlives its turn: nothing to wait for
            wait_idle(client.base_url)
        arrival = time.perf_counter()
        req = client.submit(messages, tools, fmt=chat.fmt, tokenizer=chat.tokenizer, arrival=arrival)
        released = ReleasedGuess.after_alone(req, arrival)
        if excluded is None:        # wave-first: every bank is out before the target starts
            return ReleasedGuess(req, [(0.0, bank) for _, bank in released.schedule])
        excluded[0] += time.perf_counter() - t0
        return released

    return guess


def replay_vllm(chat: VllmChat, dialogue: Dialogue, latency_s: float, variant: str, *, speculator: str,
                max_new_tokens: int, client=None, speculate_top_k: int = 1, gated=None,
                speculate_history: int = 0) -> dict:
    """One dialogue under one variant (see the module docstring): a row of
    :func:`~ooospec.eval.agent.cli.run_row`. ``gated``: the client whose wave gate decides the ``speculative``
    variant's waves (None: ``client``, every wave sent); ``dedicated`` always sends every wave."""
    from ooospec.runtime.agent.loop import run_agent
    from ooospec.runtime.agent.tools import SpeculativeTools
    from ooospec.runtime.sidecar.process import reset_prefix_cache, wait_idle
    from ooospec.runtime.sidecar.prompts import toolbox_messages

    tools = ReplayTools(dialogue, latency_s)
    executor = SpeculativeTools(tools.registry)
    excluded, sent = [0.0], [0]
    guesser = None
    if client is not None:           # untimed: no wave left running, the sidecar's cache = the toolbox only
        wait_idle(client.base_url)
        reset_prefix_cache(client.base_url)
        client.prefill(toolbox_messages(dialogue.messages), dialogue.tools[0], wait=True)
    if not chat.stateless:
        chat.warm_toolbox(dialogue.messages, dialogue.tools[0])
    chat.trace = []
    if variant == "speculative":
        guesser = counting(make_guesser(speculator, chat, dialogue, gated or client), sent)
    elif variant == "dedicated":
        guesser = dedicated_guesser(client, chat, excluded)
    elif variant == WAVE_FIRST_VARIANT:
        guesser = dedicated_guesser(client, chat, None)
    run = run_agent(chat, dialogue.messages, tools.tools_at, executor, max_turns=dialogue.steps + 1,
                    max_new_tokens=max_new_tokens, guess=guesser, on_turn=tools.start_turn,
                    speculate_top_k=speculate_top_k, speculate_history=history_for(variant, speculate_history))
    if variant in ("dedicated", WAVE_FIRST_VARIANT):
        sent[0] = sum(1 for s in run.steps)        # one wave per turn, each run alone
    row = run_row(dialogue, variant, latency_s, run, executor, waves=sent[0], excluded_s=excluded[0])
    row["_trace"] = chat.trace              # in memory only (left out of the JSON): for classify()
    return row


def first_turn_divergence(trace: Sequence[tuple[list[int], list[int]]],
                     ref: Sequence[tuple[list[int], list[int]]]) -> tuple[int, int] | None:
    """``(turn, token)`` where a replay's outputs first differ from the reference replay's (same prompts up to
    there, since every earlier turn agreed); None when they never do."""
    for turn, ((prompt, out), (ref_prompt, ref_out)) in enumerate(zip(trace, ref)):
        if prompt != ref_prompt:
            return None                      # cannot happen before a differing output; nothing to classify
        k = first_divergence(out, ref_out)
        if k is not None:
            return turn, k
    return None


def classify(llm, rows: list[dict], tie_margin: float) -> None:
    """``row["divergence"]`` of every row whose texts differ from its reference row's: the turn and token where
    they part and the top-2 logprob margin there (one untimed forward of the reference prompt and its tokens up to
    there, drafts off), a ``near_tie`` at or under ``tie_margin`` (batched verification of other chains can flip
    such a token in bf16), else a ``defect``."""
    reference = "stateless" if any(r["variant"] == "stateless" for r in rows) else "sessions"
    refs = {(r["id"], r["latency_s"]): r for r in rows if r["variant"] == reference}
    for row in rows:
        ref = refs.get((row["id"], row["latency_s"]))
        if row.get("exact") is not False or ref is None:
            continue
        found = first_turn_divergence(row["_trace"], ref["_trace"])
        if found is None:
            continue
        turn, k = found
        prompt, output = ref["_trace"][turn]
        margin = next_token_margins(llm, [list(prompt) + list(output[:k])], {"ooospec": "off"})[0]
        row["divergence"] = {"turn": turn, "token": k, "margin": margin,
                             "kind": "near_tie" if margin is not None and margin <= tie_margin else "defect"}


def variants_of(text: str, speculator: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VLLM_VARIANTS]
    if unknown or not names:
        raise SystemExit(f"--variants: unknown {unknown or text!r}; known: {', '.join(VLLM_VARIANTS)}")
    for waved in ("dedicated", WAVE_FIRST_VARIANT):
        if speculator == GOLD and waved in names:
            raise SystemExit(f"--variants {waved} needs --speculator sidecar (a wave to time)")
    return names


def build_engine(args, model_dir: str):
    """The target's vLLM engine (in this process): ``custom_class`` = ooo-spec's proposer, prefix caching on."""
    from vllm import LLM

    options = {"method": OOOSPEC, "chain_cost_slope": args.chain_cost_slope}   # no sidecar_url: hints per request
    return LLM(model=model_dir, tokenizer=model_dir, dtype=args.vllm_dtype, max_model_len=args.max_model_len,
               enable_prefix_caching=True, seed=0, max_num_seqs=1, disable_log_stats=False,
               speculative_config={"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": args.k},
               additional_config={"ooospec": options})


def run_bench_vllm(llm, tokenizer, fmt, params: dict, eos: Sequence[int], dialogues: Sequence[Dialogue],
                   latencies: Sequence[float], variants: Sequence[str], *, speculator: str, max_new_tokens: int,
                   client=None, on_row=None, progress: bool = True, speculate_top_k: int = 1,
                   gate=None, speculate_history: int = 0) -> list[dict]:
    """Every latency x dialogue x variant, variants interleaved per dialogue (after an untimed warm-up). ``gate``
    (a :class:`~ooospec.runtime.sidecar.gate.WaveGate`): the ``speculative`` variant's waves go through a fresh copy
    of it per latency, which learns from that latency's turns only."""
    def chat(variant: str, latency: float | str) -> VllmChat:
        return VllmChat(llm, tokenizer, fmt, params, history=f"{variant}@{latency}",
                        stateless=variant == "stateless", eos_token_ids=eos)

    warm = Dialogue(dialogues[0].id, dialogues[0].messages, dialogues[0].tools[:1], dialogues[0].calls[:1],
                    dialogues[0].responses[:1])
    for variant in variants:
        replay_vllm(chat(variant, "warm-up"), warm, 0.0, variant, speculator=speculator,
                    max_new_tokens=min(16, max_new_tokens), client=client)
    rows: list[dict] = []
    for latency in latencies:
        chats = {v: chat(v, latency) for v in variants}
        gated = None if gate is None or client is None else _client_like(client, gate.fresh())
        for dialogue in tqdm(dialogues, desc=f"agent-bench (vLLM) latency {latency:g}s", disable=not progress):
            for variant in variants:
                rows.append(replay_vllm(chats[variant], dialogue, latency, variant, speculator=speculator,
                                        max_new_tokens=max_new_tokens, client=client,
                                        speculate_top_k=speculate_top_k, gated=gated,
                                        speculate_history=speculate_history))
                mark_exact(rows)
                if on_row is not None:
                    on_row(rows)
    return rows


def run(args, dialogues: Sequence[Dialogue], latencies: Sequence[float]) -> int:
    """``agent-bench --engine vllm`` (``args``: agent-bench's parsed options) over ``dialogues`` at ``latencies``."""
    from transformers import AutoTokenizer

    from ooospec.eval.vllm.runs import environment as vllm_environment
    from ooospec.eval.vllm.runs import sampling_params
    from ooospec.pipelines.records import write_json
    from ooospec.runtime.backends.fetch import REGISTRY, fetch
    from ooospec.runtime.backends.hardware import vllm_cpu_env
    from ooospec.runtime.formats import detect_format

    variants = variants_of(args.variants, args.speculator)
    check_history_variants(variants, args.speculate_history)
    if args.speculator == SIDECAR and not args.sidecar_url:
        raise SystemExit("--engine vllm --speculator sidecar needs --sidecar-url (a running `ooospec sidecar serve`)")
    threads = 2 if args.threads == "auto" else int(args.threads)
    vllm_cpu_env(threads, kvcache_gb=2)
    model_dir = str(fetch(args.target, args.cache)) if args.target in REGISTRY else args.target
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fmt = detect_format(tokenizer)
    params = sampling_params(model_dir, tokenizer, fmt, args.max_new_tokens)
    eos = params["stop_token_ids"]
    client = _client(args) if args.speculator == SIDECAR else None
    args.ngram_k, args.dtype = None, args.vllm_dtype      # what vllm_runs.environment reads
    out = args.out or Path("results") / f"agent_vllm_{Path(args.target).stem or 'target'}.json"
    config = {"engine": "vllm", "target": args.target, "datasets": args.datasets, "limit": args.limit,
              "min_steps": args.min_steps, "latencies": latencies, "variants": variants,
              "speculator": args.speculator, "max_new_tokens": args.max_new_tokens,
              "speculate_top_k": args.speculate_top_k, "speculate_history": args.speculate_history,
              "dialogues": [d.id for d in dialogues],
              "sidecar": None if client is None else {"url": args.sidecar_url, "wave": args.sidecar_wave,
                                                      "top_k": args.sidecar_top_k,
                                                      "gate": args.sidecar_gate}}
    env = {**vllm_environment(args), "prefix_caching": True, "warm_tools": True, "sidecar_server": _served(args)}
    llm = build_engine(args, model_dir)
    t0 = time.perf_counter()

    def save(rows: list[dict], partial: bool) -> dict:
        results = {"config": config, "env": {**env, "wall_s": time.perf_counter() - t0}, "partial": partial,
                   "summary": summarize(rows), "dialogues": [{k: v for k, v in r.items() if k != "_trace"}
                                                             for r in rows]}
        write_json(out, results)
        return results

    rows = run_bench_vllm(llm, tokenizer, fmt, params, eos, dialogues, latencies, variants,
                          speculator=args.speculator, max_new_tokens=args.max_new_tokens, client=client,
                          on_row=lambda rows: save(rows, True), speculate_top_k=args.speculate_top_k,
                          gate=_gate(args) if client is not None else None,
                          speculate_history=args.speculate_history)
    classify(llm, rows, args.tie_margin)
    results = save(rows, False)
    write_tables(out, results["summary"])
    return 0


def _client(args):
    from ooospec.runtime.sidecar.client import SidecarClient

    return SidecarClient(args.sidecar_url, wave=args.sidecar_wave, top_k=args.sidecar_top_k)


def _client_like(client, gate):
    """A client of ``client``'s server and wave, its waves decided by ``gate``."""
    from ooospec.runtime.sidecar.client import SidecarClient

    return SidecarClient(client.base_url, wave=client.wave, top_k=client.top_k, min_prob=client.min_prob, gate=gate)


def _gate(args):
    """``--sidecar-gate on``: the wave gate of the shared deployment (the sidecar on the target's cores), None: off."""
    from ooospec.runtime.sidecar.deployments import GATE_ON

    if args.sidecar_gate != GATE_ON:
        return None
    from ooospec.eval.agent.replay import DEPLOYMENT
    from ooospec.runtime.sidecar.gate import WaveGate

    return WaveGate(DEPLOYMENT.prior)


def _served(args) -> dict | None:
    """How the sidecar server runs (its ``/health``: engine, dtype, threads, cpus, calibration) and which adapter."""
    if not args.sidecar_url:
        return None
    from ooospec.runtime.sidecar.process import health

    served = health(args.sidecar_url) or {}
    return {k: served.get(k) for k in ("engine", "dtype", "threads", "cpus", "layout_version", "calibration")}


def add_arguments(p) -> None:
    """The options only ``--engine vllm`` reads (the rest are agent-bench's)."""
    g = p.add_argument_group("--engine vllm (and the sidecar's wave, either engine)")
    g.add_argument("--variants", default=",".join(VLLM_VARIANTS),
                   help=f"comma-separated, from {', '.join(VLLM_VARIANTS)} (see eval/agent/in_vllm.py)")
    g.add_argument("--vllm-dtype", default="auto", type=vllm_dtype,
                   help="the target's dtype in vLLM (auto: float32 on a CPU without native bf16, else bfloat16)")
    g.add_argument("--k", type=int, default=16, help="num_speculative_tokens of the proposer")
    g.add_argument("--tie-margin", type=float, default=0.25,
                   help="a turn that differs from the reference where the top-2 logprob margin is at most this is a "
                        "near tie (bf16), else a defect")
    g.add_argument("--chain-cost-slope", type=float, default=0.02)
    g.add_argument("--max-model-len", type=int, default=4096)
    g.add_argument("--sidecar-wave", choices=("all", "function-first"), default="all",
                   help="the sidecar client's wave: every tool's arguments at once, or the function index first "
                        "(runtime/sidecar/protocol.py)")
    g.add_argument("--sidecar-top-k", type=int, default=2, help="function-first: the most candidate functions")

