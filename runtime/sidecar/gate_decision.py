"""The wave gate's decision for one request: which option (``skip``, ``index``, ``slots``) has the largest
expected net saving, and which queries the wave then asks.

:func:`decide` weighs the options a request's full wave allows (:class:`~ooospec.runtime.sidecar.gate_pricing.Option`)
with the prices of :mod:`~ooospec.runtime.sidecar.gate_pricing`: the ``slots`` option drops the argument slots whose
value the target usually copies verbatim from the request (:func:`verbatim_prior` before evidence; prompt lookup
drafts those anyway), an ``index`` wave is not offered for a toolbox of one tool, and the forwards of a ``slots``
wave grow with the longest value its slots were seen to take. The result is a :class:`WaveDecision` (``to_dict()``
is what the bench rows and the chat turn stats carry). Pure: the evidence comes in as arguments; the online gate
that gathers it and logs each decision is :class:`~ooospec.runtime.sidecar.gate.WaveGate`. The stats are kept per
tool set, :func:`tools_key`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ooospec.runtime import schemas
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.gate_pricing import (
    KINDS,
    Estimates,
    Kind,
    Option,
    expected_cost_s,
    expected_saving_s,
    model_latency_s,
)
from ooospec.runtime.sidecar.protocol import only_tool

VERBATIM_THRESHOLD = 0.5    # a slot whose value the request held verbatim this often is left to prompt lookup


@dataclass(frozen=True)
class WaveDecision:
    """One request's decision and the estimate behind it (``to_dict()`` is the logged record)."""

    kind: Kind
    saving_s: float                      # expected target seconds saved by the chosen option
    cost_s: float                        # expected target seconds it costs
    queries: tuple[str, ...]             # what is asked: "index", "<tool>.<param>"
    dropped: tuple[str, ...]             # argument slots left to prompt lookup (value usually verbatim)
    options: Mapping[str, tuple[float, float]]   # kind -> (saving_s, cost_s) of every option weighed
    key: str                             # the tool set the stats are kept for
    probe: bool = False                  # sent to measure although the estimate said skip
    cached_chars: int = 0                # leading block characters expected in the server's prefix cache
    model_latency_s: float = 0.0         # the chosen option's latency as the model priced it (before wave_scale)
    wave: sp.Wave | None = field(default=None, compare=False, repr=False)   # the wave to send (None: skip)

    def to_dict(self) -> dict:
        return {"decision": self.kind, "expected_saving_s": round(self.saving_s, 4),
                "expected_cost_s": round(self.cost_s, 4), "queries": list(self.queries),
                "num_queries": len(self.queries), "dropped_verbatim": list(self.dropped),
                "options": {k: [round(s, 4), round(c, 4)] for k, (s, c) in self.options.items()},
                "probe": self.probe, "cached_chars": self.cached_chars,
                "model_latency_s": round(self.model_latency_s, 4)}


def query_name(q: sp.SlotQuery) -> str:
    if q.form == "function_index":
        return "index"
    return "call" if q.form == "direct_call" else f"{q.function}.{q.parameter}"


def verbatim_prior(schema: Any) -> float:
    """P(a slot's value is in the request verbatim) before evidence: an enum's values are in the prompt's tools
    block, so prompt lookup copies them (0.9); anything else 0.3 (asked until the target shows otherwise)."""
    return 0.9 if isinstance(schema, Mapping) and "enum" in schema else 0.3


def decide(wave: sp.Wave, tools: Sequence[Any], est: Estimates,
           verbatim: Mapping[tuple[str, str], tuple[float, float]] | None = None, key: str = "",
           probe: bool = False, cached_chars: int = 0,
           value_chars: Mapping[tuple[str, str], float] | None = None) -> WaveDecision:
    """Weigh skip / index / slots for ``wave`` (the request's full wave) and pick the best net saving.

    Args:
        wave: :func:`~ooospec.runtime.sidecar.prompts.build_wave` of the request.
        tools: the request's tools (for the verbatim priors of slots without evidence).
        est: the estimates for this request's tool set.
        verbatim: ``(tool, parameter) -> (times its value was in the request verbatim, times seen)`` so far;
            the rate is ``(found + 2 * prior) / (seen + 2)`` with :func:`verbatim_prior` of the slot's schema.
        key: the tool set (:func:`tools_key`), recorded in the decision.
        probe: send anyway: the best option other than skip (its estimate is still what is logged).
        cached_chars: the block's leading characters whose KV the sidecar server is expected to hold (a toolbox an
            earlier wave or :meth:`~ooospec.runtime.sidecar.gate.WaveGate.remember` sent): they cost no prefill.
        value_chars: ``(tool, parameter) -> mean characters of the values the target wrote there``: a wave decodes
            until its longest answer ends, so the ``slots`` option costs at least ``2 + longest / chars_per_token``
            forwards (the index, the value, its end) where its slots were seen (the prior's forwards come from short
            values; free-text ones take many more).
    Returns:
        the decision; its ``wave`` is the subset to send (None for skip).
    """
    schemas_of = {(schemas.tool_name(t), p): s for t in tools for p, s in sp.tool_parameters(t).items()}
    index = tuple(q for q in wave.queries if q.form == "function_index")
    kept, dropped = [], []
    for q in wave.queries:
        if q.form != "argument":
            continue
        found, seen = (verbatim or {}).get((q.function, q.parameter), (0.0, 0.0))
        p = (found + 2.0 * verbatim_prior(schemas_of.get((q.function, q.parameter)))) / (seen + 2.0)
        (dropped if p >= VERBATIM_THRESHOLD else kept).append(q)
    cached = min(cached_chars, len(wave.block))
    longest = max(((value_chars or {}).get((q.function, q.parameter), 0.0) for q in kept), default=0.0)
    forwards = max(est.forwards["slots"], 2.0 + longest / est.chars_per_token) if longest else None
    options = [Option("skip", (), 0), Option("index", index, len(wave.block), cached),
               Option("slots", index + tuple(kept), len(wave.block), cached, forwards)]
    if not kept:
        options.pop()            # slots would be the index wave again
    if only_tool(tools):
        options.pop(1)           # one tool: its name is known (the schema FSM drafts it); an index wave buys nothing
    scored = {o.kind: (expected_saving_s(o, est), expected_cost_s(o, est)) for o in options}
    candidates = options[1:] if probe and len(options) > 1 else options     # nothing to probe: skip
    best = max(candidates, key=lambda o: (scored[o.kind][0] - scored[o.kind][1], -KINDS.index(o.kind)))
    saving, cost = scored[best.kind]
    return WaveDecision(best.kind, saving, cost, tuple(query_name(q) for q in best.queries),
                        tuple(query_name(q) for q in dropped) if best.kind == "slots" else (), scored, key,
                        probe=probe, cached_chars=cached, model_latency_s=model_latency_s(best, est),
                        wave=None if best.kind == "skip" else sp.Wave(wave.block, best.queries))


def tools_key(tools: Sequence[Any]) -> str:
    """A short id of a tool set (its sorted tool names): the stats are kept per target (one gate) and tool set."""
    names = sorted(str(schemas.tool_name(t)) for t in tools)
    return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:12]
