"""The transfer report's sentences: the headline, the sidecar line and, per target, whether hints help and why not.

    transfer_notes(results)   # [(target, "Hints help little: ooospec 1.02x vs AR, ...", [reason, ...]), ...]

Every reason compares a value of the stage's JSON with one of the thresholds below (:data:`HELPS`,
:data:`WEAK_CALLER`, :data:`LATE`, :data:`WRONG`); the Markdown and the HTML report
(:mod:`ooospec.eval.transfer.report`, :mod:`ooospec.eval.transfer.html`) print the same notes.
"""

from __future__ import annotations

from ooospec.eval.transfer.data import CEILING_GAIN, GAIN, bench_name, targets_of
from ooospec.reporting import fmt_cell
from ooospec.runtime.methods import OOOSPEC, TOOLSPEC

HELPS = 1.05          # hint gain (ooospec over toolspec, ratio of mean times) from which hints "help"
WEAK_CALLER = 0.5     # own call accuracy below which a target is a weak caller
LATE = 0.5            # share of requests whose wave was ready before the call ended, below which hints are late
WRONG = 0.5           # share of requests with a right sidecar call, below which hints are mostly wrong


def plural(n: int, noun: str) -> str:
    """``plural(1, "cell")`` -> ``'1 cell'``, ``plural(3, "cell")`` -> ``'3 cells'``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def sidecar_line(results: dict) -> str:
    s = results.get("sidecar")
    if not s:
        return "none (method ooospec not run)"
    trained = f", {s['requests_trained']} training requests" if s.get("requests_trained") else ""
    return f"{s['adapter']} (base {s.get('base')}{trained}, weights {s.get('weights')})"


def headline(results: dict) -> str:
    p = results["params"]
    n_cells = len(results["cells"])
    n_benches = len({bench_name(c) for c in results["cells"]})
    return (f"{plural(len(results['targets']), 'target')} x {plural(n_benches, 'benchmark')} "
            f"({plural(n_cells, 'cell')}), the first {plural(p['limit'], 'example')} of each, up to "
            f"{p['max_new_tokens']} new tokens, "
            + ("warm toolbox (every method's system + tools block cached before the clock starts); "
               if p.get("warm_tools") else "cold (every prompt prefilled in full); ")
            + f"one frozen sidecar: {sidecar_line(results)}. Measured on {results['machine']['cpu']}, "
            f"{plural(results['machine']['threads'], 'thread')}, {results['machine']['dtype']}. Measuring took "
            f"{results['measured_s'] / 60:.1f} min"
            + (f" ({plural(results['resumed_cells'], 'cell')} resumed after a stop)"
               if results["resumed_cells"] else "")
            + f"; the stage's last "
            f"run took {results['wall_s'] / 60:.1f} min (started {results['started']}).")


def transfer_notes(results: dict) -> list[tuple[str, str, list[str]]]:
    """Per target ``(target, verdict, reasons)``: whether hints help it, and when they help little, why -- every
    reason a comparison of the JSON's values with :data:`HELPS`, :data:`WEAK_CALLER`, :data:`LATE`, :data:`WRONG`."""
    return [target_note(results, t) for t in targets_of(results)]


def target_note(results: dict, target: str) -> tuple[str, str, list[str]]:
    """One target's ``(target, verdict, reasons)``: the target's own calls and prompt, how its hints went, the
    headroom gold hints leave, and the tokenizer it shares (or not) with the sidecar, in that order."""
    info, s = results["targets"][target]["info"], results["targets"][target]["summary"]
    gain, ceiling = s.get(GAIN), s.get(CEILING_GAIN)
    if gain is None:
        return target, "ooospec (or toolspec) did not run for this target.", []
    sp = s["speedup"]
    numbers = (f"{OOOSPEC} {sp[OOOSPEC]:.2f}x vs AR, {gain:.2f}x over {TOOLSPEC}'s {sp[TOOLSPEC]:.2f}x"
               + (f"; gold-hint ceiling {ceiling:.2f}x over toolspec" if ceiling is not None else ""))
    helps = gain >= HELPS
    verdict = f"Hints help: {numbers}." if helps else f"Hints help little: {numbers}."
    reasons = caller_reasons(s, info, results["params"]["max_new_tokens"]) + hint_reasons(results, target, s)
    if ceiling is not None and ceiling < HELPS:
        reasons.append(f"little headroom: even gold hints at time zero gain only {ceiling:.2f}x over toolspec; "
                       f"the schema FSM and retrieval drafts already propose most of what a hint would.")
    if not helps and not reasons:
        reasons.append(f"none of the usual causes shows in the data (calls right, waves on time, headroom "
                       f"present); with {s['examples']} examples this may be noise.")
    if info.get("same_tokenizer_as_sidecar") is False:
        sidecar_base = (results.get("sidecar") or {}).get("base") or "the sidecar"
        reasons.append(f"its tokenizer differs from the sidecar's ({sidecar_base}): hints travel as text and are "
                       f"re-tokenized with the target's tokenizer, so that alone costs nothing (the gold-hint "
                       f"ceiling takes the same path).")
    return target, verdict, reasons


def caller_reasons(s: dict, info: dict, max_new_tokens: int) -> list[str]:
    """What the target itself writes (its summary ``s``, its facts ``info``): a weak caller, answers that run into
    the token budget without a call, a prompt without a tool-aware chat template."""
    reasons = []
    call = s["call"]
    if call["call"] < WEAK_CALLER:
        reasons.append(f"a weak caller: its own output is the right call in {call['call']:.0%} of its "
                       f"{call['n']} requests (right function in {call['name']:.0%}); hints carry the right "
                       f"call, so they seldom match what this target writes.")
    if s.get("budget_without_call", 0) >= 0.5:
        reasons.append(f"{s['budget_without_call']:.0%} of its answers hold no call and ran into the "
                       f"{max_new_tokens}-token budget: its speedups there measure drafting "
                       f"of that text (often repetitive, which prompt lookup copies well), not of tool calls.")
    if info["chat_template"] == "none":
        reasons.append("no chat template (a base model): the prompt is the plain System/User/Assistant "
                       "fallback, so it answers in its own way rather than in a call format it was tuned on.")
    elif info["chat_template"] == "plain":
        reasons.append(f"its chat template has no tool support: the tools go into the system prompt as JSON and "
                       f"the call format is the {info['format']} fallback.")
    return reasons


def hint_reasons(results: dict, target: str, s: dict) -> list[str]:
    """How the sidecar's hints went for ``target`` (its summary ``s``): waves the gate skipped, hints that came
    late or wrong, a sidecar that costs more than it saves."""
    reasons = []
    h = s.get("hints") or {}
    skipped = (h.get("wave_decisions") or {}).get("skip", 0) if h else 0
    if skipped:
        reasons.append(f"the wave gate skipped {skipped} of {h['n']} waves: on this machine and deployment "
                       f"their expected cost (sidecar compute on the target's cores) exceeded what their hints "
                       f"would save, so those requests ran as toolspec does (each decision with its estimate is "
                       f"in the cell's hints.wave).")
    if h and h["ready_before_end"] < LATE and skipped < h["n"]:
        reasons.append(late_reason(h, s))
    side = h.get("sidecar_call_arrived") if h else None
    if side and side["call"] < WRONG:
        reasons.append(f"hints are mostly wrong: of the {side['n']} calls the sidecar delivered in time, "
                       f"{side['call']:.0%} were right ({side['name']:.0%} named the right function).")
    deployment = next((c["env"].get("deployment") for c in results["cells"] if c["target"] == target), None)
    if h and s[GAIN] < 1 / HELPS and h.get("mean_wave_s") is not None:
        reasons.append(f"the sidecar costs more than it saves: {OOOSPEC} took {s['mean_s'][OOOSPEC]:.1f} s per "
                       f"request against {TOOLSPEC}'s {s['mean_s'][TOOLSPEC]:.1f} s, hints used in "
                       f"{h['used']:.0%} of requests; under the {deployment} deployment the wave (mean "
                       f"{h['mean_wave_s']:.1f} s of sidecar compute) runs on cores the target needs.")
    return reasons


def late_reason(h: dict, s: dict) -> str:
    """Hints that seldom arrive before the call ends (``h``: the target's pooled hints), and why: waves still
    running at the end, or waves that brought no usable call."""
    errors = h.get("errors") or {}
    why = []
    if errors.get("cancelled"):
        why.append(f"{errors['cancelled']} of {h['n']} waves were still running when the call ended "
                   f"(median wave {fmt_cell(h.get('median_wave_s'), '{:.1f}')} s; a whole toolspec call took "
                   f"{s['mean_s'][TOOLSPEC]:.1f} s on average)")
    failed = {k: v for k, v in errors.items() if k != "cancelled"}
    if failed:
        why.append(f"{sum(failed.values())} of {h['n']} waves brought no usable call ("
                   + ", ".join(f"{k} {v}" for k, v in sorted(failed.items())) + ")")
    return (f"hints seldom arrive: the bank was ready before the call ended in "
            f"{h['ready_before_end']:.0%} of requests" + (": " + "; ".join(why) if why else "") + ".")
