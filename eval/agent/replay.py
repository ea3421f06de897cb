"""The agent bench's library: recorded multi-step dialogues, their replay through the agent loop
(:func:`ooospec.runtime.agent.loop.run_agent`) and the summary; ``ooospec agent-bench``
(:mod:`ooospec.eval.agent.cli`) is its command line, :mod:`ooospec.eval.agent.in_vllm` its vLLM target.

Dialogues (:func:`load_dialogues`; ``--limit N`` = the first N dialogues by id of each dataset that have at least
``--min-steps`` calls):

* API-Bank level 3 (``apibank-l3``): the records of one ``meta.sample`` in ``meta.step`` order. The first
  record's messages start the dialogue; record k's gold call is step k's call and its tools are step k's tools
  (ToolSearcher reveals tools, so the tools block grows); the response recorded for step k is the tool message
  record k+1 appends. The last step has no recorded response: :data:`STUB_RESPONSE` answers it.
* ToolAlpaca (``toolalpaca-real``, ``toolalpaca-sim``): one record per dialogue, its steps in ``meta.steps`` (up to
  the first step whose arguments could not be recovered). ToolAlpaca records no tool responses: every call gets
  :data:`STUB_RESPONSE`.

Replay (:func:`replay`, the agent loop of :mod:`ooospec.runtime.agent.loop`): from the dialogue's first messages the
target decodes a turn; when it calls a tool, the tool answers -- after the simulated latency (a sleep: no CPU) --
with the recorded response of the current step, whatever the arguments (a call whose arguments do not validate
against the tool's schema gets the error result at once); the target's own call and that response join the
conversation; the loop ends when the target answers without a call, or after ``steps + 1`` turns (the last one
is the final answer). Every variant sees the same conversation, so their tokens must be equal (``exact``).

Variants, each with its own state (drafter history, sessions), run one after the other per dialogue:

================  =======================================================================================
``stateless``     every turn prefills the whole conversation; the tool runs after the call (no sessions)
``sessions``      KV sessions + the prefix cache (:mod:`ooospec.runtime.agent.session`); the tool runs after the call
``speculative``   sessions + speculative tool execution: at each turn's arrival the speculator guesses the call;
                  the tool starts as soon as the guess is ready and a key hit serves its result
                  (:class:`~ooospec.runtime.agent.tools.SpeculativeTools`; every replayed tool is side-effect free)
``history``       sessions + the loop's own earlier calls run speculatively at each turn's arrival
                  (``--speculate-history N``, no model: what repeating a call is worth without a sidecar)
================  =======================================================================================

``--speculate-history N`` (0: off) adds the N most recent distinct earlier calls as guesses in every speculating
variant (``speculative``, ``dedicated``, ``history``); a hit's source (``guess``: the speculator's call, ``history``)
is in each turn and in the summary's ``hits_by_source``.

Speculators: ``gold`` -- the step's recorded call, ready at arrival (the ceiling of what a sidecar can give;
a hit needs the target to make exactly that call); ``sidecar`` -- the sidecar's joined call (``--sidecar-url``, or
the shipped adapter started for the run). With ``--method ooospec`` the same guess also drafts tokens in every
variant (so decoding is the same across variants and only the tool speculation differs); ``--method ooospec
--speculator gold`` drafts from the recorded call (the ceiling).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from ooospec.pipelines.records import load_records
from ooospec.reporting import md_table, pct
from ooospec.runtime.methods import GOLD, SIDECAR, TOOLSPEC
from ooospec.runtime.sidecar.deployments import SHARED

logger = logging.getLogger(__name__)

VARIANTS = ("stateless", "sessions", "speculative")
HISTORY_VARIANT = "history"                    # run too when --speculate-history >= 1
SPECULATING = ("speculative", "dedicated", "wave-first", HISTORY_VARIANT)   # variants running tools on a guess
EMULATED_VARIANTS = ("dedicated",)              # the sidecar on a device of its own, emulated (eval/agent/in_vllm.py)
SPECULATORS = (GOLD, SIDECAR)   # the hint sources a turn's guess comes from (no oracle: it needs the turn's output)
DEPLOYMENT = SHARED              # a sidecar this bench starts runs on every core at the bench's threads
STUB_RESPONSE = '{"status": "success"}'

# ----------------------------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Dialogue:
    """A recorded multi-step dialogue: its start, and per step the tools shown, the gold call and the response."""

    id: str
    messages: list[dict]
    tools: list[list[dict]]        # [steps] the tools shown at each step
    calls: list[dict]              # [steps] the recorded call of each step
    responses: list[str]           # [steps] the recorded (or stub) response to each step's call

    @property
    def steps(self) -> int:
        return len(self.calls)


def _apibank_dialogues(records: list[dict], path: Path) -> list[Dialogue]:
    by_sample: dict[str, list[dict]] = defaultdict(list)
    for rec in records:
        meta = rec.get("meta") or {}
        if "sample" not in meta or "step" not in meta:
            raise ValueError(f"{path}: record {rec['id']!r} has no meta.sample / meta.step (not API-Bank level 3?)")
        by_sample[meta["sample"]].append(rec)
    dialogues = []
    for sample, recs in sorted(by_sample.items()):
        recs.sort(key=lambda r: r["meta"]["step"])
        steps = [recs[0]]
        for prev, rec in itertools.pairwise(recs):
            n = len(prev["messages"])
            if rec["meta"]["step"] != prev["meta"]["step"] + 1 or rec["messages"][:n] != prev["messages"] \
                    or [m["role"] for m in rec["messages"][n:]] != ["assistant", "tool"]:
                logger.warning("%s: dialogue %s stops at step %s (the next record does not extend it)",
                               path, sample, prev["meta"]["step"])
                break
            steps.append(rec)
        responses = [rec["messages"][-1]["content"] for rec in steps[1:]] + [STUB_RESPONSE]
        dialogues.append(Dialogue(sample, steps[0]["messages"], [r["tools"] for r in steps],
                                  [r["calls"][0] for r in steps], responses))
    return dialogues


def _toolalpaca_dialogues(records: list[dict]) -> list[Dialogue]:
    dialogues = []
    for rec in sorted(records, key=lambda r: r["id"]):
        calls = []
        for step in (rec.get("meta") or {}).get("steps") or rec["calls"]:
            if not isinstance(step.get("arguments"), dict):
                break          # arguments not recoverable (a placeholder): the replay stops before it
            calls.append({"name": step["name"], "arguments": step["arguments"]})
        if calls:
            dialogues.append(Dialogue(rec["id"], rec["messages"], [rec["tools"]] * len(calls), calls,
                                      [STUB_RESPONSE] * len(calls)))
    return dialogues


def load_dialogues(path: Path, limit: int | None = None, min_steps: int = 2) -> list[Dialogue]:
    """The dialogues of a JSONL file of API-Bank level-3 or ToolAlpaca records (by ``source``), sorted by id;
    those with at least ``min_steps`` calls; the first ``limit`` of them."""
    records = load_records(path, "fail", what="agent-bench records").rows
    sources = {rec.get("source") for rec in records}
    if sources == {"apibank"}:
        dialogues = _apibank_dialogues(records, path)
    elif sources == {"toolalpaca"}:
        dialogues = _toolalpaca_dialogues(records)
    else:
        raise ValueError(f"{path}: agent-bench replays API-Bank level-3 or ToolAlpaca records, got sources "
                         f"{sorted(map(str, sources))}")
    dialogues = [d for d in dialogues if d.steps >= min_steps]
    return dialogues[:limit] if limit is not None else dialogues


# ----------------------------------------------------------------------------------------------- replay


class ReplayTools:
    """Every tool of a dialogue, answering with the current step's recorded response after ``latency_s``."""

    def __init__(self, dialogue: Dialogue, latency_s: float):
        from ooospec.runtime.agent.tools import ToolRegistry

        self.dialogue, self.latency_s = dialogue, latency_s
        self.turn = 0
        self.registry = ToolRegistry()
        for tools in dialogue.tools:
            for tool in tools:
                fn = tool["function"]
                if fn["name"] not in self.registry.tools:
                    self.registry.register(fn["name"], self._answer, parameters=fn.get("parameters"),
                                           side_effect_free=True, timeout_s=latency_s + 30.0)

    def _answer(self, arguments: dict) -> str:
        turn = self.turn                       # read at the start: a speculative run belongs to its turn
        time.sleep(self.latency_s)
        responses = self.dialogue.responses
        return responses[turn] if turn < len(responses) else STUB_RESPONSE

    def tools_at(self, turn: int) -> list[dict]:
        return self.dialogue.tools[min(turn, self.dialogue.steps - 1)]

    def start_turn(self, turn: int) -> None:
        self.turn = turn


class HintsOnly:
    """A guess (:class:`~ooospec.runtime.drafters.hints.CallGuess`) used as decoding hints only (the variants without
    tool speculation, under a method that takes hints): it never hands its call to the tools."""

    def __init__(self, guess):
        self.guess = guess

    def poll(self):
        return self.guess.poll()

    @property
    def done(self) -> bool:
        return self.guess.done

    def wait_call(self, timeout: float) -> None:
        return None

    def cancel(self) -> None:
        self.guess.cancel()

    def report(self, result, hint_stats, calls=()) -> dict | None:
        return self.guess.report(result, hint_stats, calls)

    def observe_tool(self, tool_s: float, hit: bool | None) -> None:
        self.guess.observe_tool(tool_s, None)         # no tool ran on this guess: only its latency is news


def make_guesser(speculator: str, chat, dialogue: Dialogue, client=None):
    """``(messages, tools, turn) -> CallGuess``: the step's gold call (a bank ready at arrival), or the sidecar's
    wave for this turn."""
    from ooospec.runtime.drafters.hints import HintBank

    def guess(messages: list[dict], tools: list, turn: int):
        if speculator == GOLD:
            return HintBank.from_calls([dialogue.calls[turn]], chat.fmt, chat.tokenizer) if turn < dialogue.steps \
                else None
        return client.submit(messages, tools, fmt=chat.fmt, tokenizer=chat.tokenizer)

    return guess


def counting(guesser, sent: list[int]):
    """``guesser`` counting in ``sent[0]`` the sidecar waves its guesses sent."""
    from ooospec.runtime.sidecar.client import HintRequest

    def guess(messages: list[dict], tools: list, turn: int):
        g = guesser(messages, tools, turn)
        decision = getattr(g, "decision", None)
        if isinstance(g, HintRequest) and (decision is None or decision.kind != "skip"):
            sent[0] += 1
        return g

    return guess


def history_for(variant: str, speculate_history: int) -> int:
    """How many earlier calls ``variant`` runs speculatively at each turn's arrival (``--speculate-history``)."""
    return speculate_history if variant in SPECULATING else 0


def check_history_variants(variants: Sequence[str], speculate_history: int) -> None:
    """The ``history`` variant needs ``--speculate-history`` >= 1 (else it is ``sessions``): SystemExit."""
    if speculate_history < 0:
        raise SystemExit(f"--speculate-history must be >= 0, got {speculate_history}")
    if HISTORY_VARIANT in variants and speculate_history < 1:
        raise SystemExit("--variants history needs --speculate-history N >= 1 (the earlier calls it runs)")


def replay(chat, dialogue: Dialogue, latency_s: float, variant: str, *, speculator: str, max_new_tokens: int,
           client=None, speculate_top_k: int = 1, speculate_history: int = 0) -> dict:
    """One dialogue under one variant: ``{"wall_s", "turns": [...], "texts", ...}`` (see the module docstring)."""
    from ooospec.runtime.agent.loop import run_agent
    from ooospec.runtime.agent.tools import SpeculativeTools

    tools = ReplayTools(dialogue, latency_s)
    executor = SpeculativeTools(tools.registry)
    guesser = None
    sent = [0]                 # sidecar waves sent (a gate's skip sends none)
    if variant == "speculative" or chat.takes_hints:
        make = counting(make_guesser(speculator, chat, dialogue, client), sent)
        if variant == "speculative":
            guesser = make
        else:
            def guesser(messages: list[dict], tools: list, turn: int):
                g = make(messages, tools, turn)
                return HintsOnly(g) if g is not None else None
    # the sidecar's next block is prefilled while each tool runs (the idle window), whenever a sidecar is asked
    idle = None
    if speculator == SIDECAR and client is not None and guesser is not None:
        def idle(messages: list[dict], tools: list) -> None:
            client.prefill(messages, tools, only_if_pays=True)   # with a gate: only when it pays
    run = run_agent(chat, dialogue.messages, tools.tools_at, executor, max_turns=dialogue.steps + 1,
                    max_new_tokens=max_new_tokens, guess=guesser, on_turn=tools.start_turn, on_tool_start=idle,
                    speculate_top_k=speculate_top_k, speculate_history=history_for(variant, speculate_history))
    return run_row(dialogue, variant, latency_s, run, executor, waves=sent[0])


def run_row(dialogue: Dialogue, variant: str, latency_s: float, run, executor, *, waves: int = 0,
            excluded_s: float = 0.0) -> dict:
    """One replay's row: the dialogue's wall time (less ``excluded_s``: untimed work inside the loop, e.g. an
    emulated sidecar's wave run alone), every turn, the texts, calls, speculative hits and the tool latency they
    hid (the latency of each hit call less what the loop still waited for it), ``waves`` sidecar waves sent."""
    turns = [{"turn": s.turn, "call": s.call, "guess": s.guess, "hit": s.hit, "ok": s.ok,
              "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens, "origin": s.origin,
              "prefilled_tokens": s.prompt_tokens - 1 - s.cached_tokens, "gen_s": s.gen_s,
              "tool_wait_s": s.tool_wait_s, "finish_reason": s.finish_reason, "wave": s.wave,
              "hit_source": s.hit_source} for s in run.steps]
    return {"id": dialogue.id, "variant": variant, "latency_s": latency_s, "wall_s": run.wall_s - excluded_s,
            "excluded_s": excluded_s, "steps": dialogue.steps, "turns": turns, "texts": [s.text for s in run.steps],
            "calls": sum(s.call is not None for s in run.steps), "hits": sum(bool(s.hit) for s in run.steps),
            "tool_hidden_s": sum(max(latency_s - s.tool_wait_s, 0.0) for s in run.steps if s.hit),
            "waves": waves,
            "gold_calls_made": sum(s.call == dialogue.calls[s.turn] for s in run.steps
                                   if s.call is not None and s.turn < dialogue.steps),
            "speculation": executor.stats.to_dict()}


def run_bench(model, tokenizer, dialogues: Sequence[Dialogue], latencies: Sequence[float], *,
              method: str = TOOLSPEC, speculator: str = GOLD, max_new_tokens: int = 128, client=None,
              variants: Sequence[str] = VARIANTS, progress: bool = True, on_row=None,
              speculate_top_k: int = 1, speculate_history: int = 0) -> list[dict]:
    """Every dialogue x latency x variant, variants interleaved per dialogue; one row per run."""
    from ooospec.runtime.agent.chat import ChatModel
    from ooospec.runtime.agent.session import PrefixCache, SessionStore
    from ooospec.runtime.sidecar.process import wait_idle

    def new_chat(variant: str) -> ChatModel:
        sessions = None if variant == "stateless" else SessionStore(model, prefix_cache=PrefixCache())
        return ChatModel(model, tokenizer, method=method, sessions=sessions)

    # warm-up (untimed, thrown away): kernels, allocator, the forward-cost curve the tree policy plans with
    for variant in variants:
        replay(new_chat(variant), dataclasses.replace(dialogues[0], calls=dialogues[0].calls[:1]), 0.0, variant,
               speculator=speculator, max_new_tokens=min(16, max_new_tokens), client=client)
    rows: list[dict] = []
    for latency in latencies:
        chats = {v: new_chat(v) for v in variants}
        if client is not None and client.gate is not None:
            client.gate = client.gate.fresh()     # each latency learns on its own (the tool time differs)
        for dialogue in tqdm(dialogues, desc=f"agent-bench latency {latency:g}s", disable=not progress):
            for variant in variants:
                if client is not None:      # untimed: a cancelled wave still running never slows the next replay
                    wait_idle(client.base_url)
                row = replay(chats[variant], dialogue, latency, variant, speculator=speculator,
                             max_new_tokens=max_new_tokens, client=client, speculate_top_k=speculate_top_k,
                             speculate_history=speculate_history)
                rows.append(row)
                mark_exact(rows)
                if on_row is not None:
                    on_row(rows)
    return rows


def mark_exact(rows: list[dict]) -> None:
    """``row["exact"]``: the row's texts equal the reference row's of the same dialogue and latency (``stateless``,
    or ``sessions`` in a run without stateless turns)."""
    variants = {r["variant"] for r in rows}
    reference = "stateless" if "stateless" in variants else "sessions"
    ref = {(r["id"], r["latency_s"]): r["texts"] for r in rows if r["variant"] == reference}
    for r in rows:
        base = ref.get((r["id"], r["latency_s"]))
        r["exact"] = None if base is None else r["texts"] == base


# ----------------------------------------------------------------------------------------------- summary


def summarize(rows: Sequence[dict]) -> list[dict]:
    """One line per (latency, variant), in first-seen order.

    ``saved_frac`` = 1 - sum(wall) / sum(stateless wall) over the same dialogues; ``prefill_saved_frac`` likewise
    for prefilled prompt tokens; ``hit_rate`` = hits / calls; ``vs_sessions`` = sum(sessions wall) / sum(wall)
    over the same dialogues (> 1: faster than sessions). Worked example: stateless walls [10, 20] and sessions
    walls [9, 17] -> saved_frac 1 - 26 / 30 = 0.133.
    """
    groups: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["latency_s"], r["variant"])].append(r)
    out = []
    for (latency, variant), rs in groups.items():
        base = {r["id"]: r for r in groups.get((latency, "stateless"), [])}
        sessions = {r["id"]: r["wall_s"] for r in groups.get((latency, "sessions"), [])}
        paired = [r for r in rs if r["id"] in sessions]
        wall = sum(r["wall_s"] for r in rs)
        base_wall = sum(base[r["id"]]["wall_s"] for r in rs if r["id"] in base)
        prefilled = sum(t["prefilled_tokens"] for r in rs for t in r["turns"])
        base_prefilled = sum(t["prefilled_tokens"] for r in rs if r["id"] in base for t in base[r["id"]]["turns"])
        calls = sum(r["calls"] for r in rs)
        exact = [r["exact"] for r in rs if r.get("exact") is not None]
        kinds = [r["divergence"]["kind"] for r in rs if r.get("divergence")]
        decided = [t["wave"]["decision"] for r in rs for t in r["turns"] if t.get("wave")]
        sources = [t["hit_source"] for r in rs for t in r["turns"] if t.get("hit") and t.get("hit_source")]
        out.append({
            "latency_s": latency, "variant": variant, "dialogues": len(rs),
            "turns": sum(len(r["turns"]) for r in rs), "calls": calls,
            "mean_wall_s": statistics.fmean(r["wall_s"] for r in rs),
            "saved_frac": 1 - wall / base_wall if base_wall else None,
            "saved_s_per_dialogue": (base_wall - wall) / len(rs) if base_wall else None,
            "prefilled_tokens": prefilled,
            "prefill_saved_frac": 1 - prefilled / base_prefilled if base_prefilled else None,
            "hit_rate": sum(r["hits"] for r in rs) / calls if calls else None,
            "hits_by_source": {k: sources.count(k) for k in sorted(set(sources))},
            "vs_sessions": sum(sessions[r["id"]] for r in paired) / sum(r["wall_s"] for r in paired)
            if paired else None,
            "tool_hidden_s": sum(r.get("tool_hidden_s", 0.0) for r in rs),
            "waves_sent": sum(r.get("waves", 0) for r in rs),
            "tool_wait_s": sum(t["tool_wait_s"] for r in rs for t in r["turns"]),
            "exact_rate": sum(exact) / len(exact) if exact else None,
            "near_ties": kinds.count("near_tie"), "defects": kinds.count("defect"),
            # the wave gate's decisions over the turns it decided ({} without a gate)
            "waves": {k: decided.count(k) for k in ("skip", "index", "slots") if k in decided},
        })
    return out


def markdown_table(summary: Sequence[dict]) -> str:
    head = ["tool latency", "variant", "dialogues", "calls", "mean wall s", "vs sessions", "time saved",
            "prefill tokens", "prefill saved", "hit rate", "waves sent", "tool hidden s", "tool wait s", "exact"]
    gated = any(s.get("waves") for s in summary)
    rows = [[f"{s['latency_s']:g} s", variant_label(s["variant"]), s["dialogues"], s["calls"],
             f"{s['mean_wall_s']:.2f}", _ratio(s.get("vs_sessions")), pct(s["saved_frac"]), s["prefilled_tokens"],
             pct(s["prefill_saved_frac"]), _hits(s) if s["variant"] in SPECULATING else "",
             s.get("waves_sent", 0), f"{s.get('tool_hidden_s', 0.0):.1f}", f"{s['tool_wait_s']:.1f}",
             _exact(s)] + ([", ".join(f"{k} {n}" for k, n in s.get("waves", {}).items())] if gated else [])
            for s in summary]
    if gated:
        head.append("waves (gate)")
    return md_table(head, rows, align="rl" + "r" * (len(head) - 2))


def write_tables(out: Path, summary: Sequence[dict]) -> None:
    """The summary's markdown table, printed and written beside the results JSON ``out`` (``.md``)."""
    table = markdown_table(summary)
    out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md')}")


def _exact(s: dict) -> str:
    """The exact column: the share of dialogues identical to the reference, and how the others parted."""
    notes = [f"{s[k]} {k.replace('_', '-')[:-1] if s[k] == 1 else k.replace('_', '-')}"
             for k in ("near_ties", "defects") if s.get(k)]
    return pct(s["exact_rate"]) + (f" ({', '.join(notes)})" if notes else "")


def _hits(s: dict) -> str:
    """The hit rate column: the share of calls served speculatively, by source when the history served any."""
    by = s.get("hits_by_source") or {}
    return pct(s["hit_rate"]) + (f" ({', '.join(f'{k} {n}' for k, n in by.items())})" if by.get("history") else "")


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


def variant_label(variant: str) -> str:
    """A table's name of a variant: an emulated deployment says so."""
    return f"{variant} (EMULATED)" if variant in EMULATED_VARIANTS else variant
