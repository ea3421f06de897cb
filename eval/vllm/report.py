"""``ooospec vllm-report DIR``: one table over the ``ooospec vllm-bench`` results in DIR (``<target>_<bench>.json``).

Per target and benchmark: llama.cpp's greedy (when the cell joined an ``ooospec bench`` of the same requests),
vLLM plain, and each speculative method's speedup over vLLM plain and over llama.cpp, its #MAT (tokens per target
forward), draft tokens accepted per verify step, and exactness against vLLM's greedy output (near-ties / defects);
each method's ratio to ``toolspec`` of the same cell where it ran (what the sidecar adds to the drafters). A folder
with cold and warm cells (``<target>_<bench>_cold.json`` / ``_warm.json``) names each row's caching.
Where the cell has ``vllm-prefill`` rows (time to the first token), also the prefill's share of vLLM plain's time
and each method's decode speedup (both times less the prefill): the part a drafter can change.
Under the table, per cell that ran waves inside its requests (``ooospec-wave-first``): the waves sent, what their
hints were worth (:func:`hint_worth`, from the rows) and the ratio to the paired ``toolspec`` arm (``--paired``).
Writes ``DIR/table.md`` and prints it. :func:`render_table` is one run's table, which ``ooospec vllm-bench`` prints
and writes beside the run's JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ooospec.eval.bench.summaries import method_label
from ooospec.reporting import md_table
from ooospec.runtime.methods import LLAMACPP_REFERENCE, TOOLSPEC, VLLM_PREFILL, VLLM_REFERENCE

HEADERS = ["target", "benchmark", "n", f"{LLAMACPP_REFERENCE} s", f"{VLLM_REFERENCE} s", "prefill s", "method",
           "mean s", f"vs {VLLM_REFERENCE}", f"decode vs {VLLM_REFERENCE}", f"vs {LLAMACPP_REFERENCE}",
           f"vs {TOOLSPEC}", "#MAT", "accepted / verify step", "identical", "near-ties", "defects"]
SKIP = (VLLM_REFERENCE, VLLM_PREFILL)     # the reference and the prefill probe are columns, not rows


def caching(env: dict) -> str:
    """How a cell's prompt KV started, in words (the cold default, or ``vllm-bench --warm-tools``, with the KV cache's
    block size: the prefix cache serves whole blocks only)."""
    if not env.get("warm_tools"):
        return "prefix caching off"
    blocks = f", {env['block_size']}-token blocks" if env.get("block_size") else ""
    return f"prefix caching on{blocks}, toolbox warm"


def cells(folder: Path) -> list[dict]:
    """The vllm-bench results in ``folder``, sorted by target then benchmark."""
    out = []
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".llamacpp.json"):
            continue
        data = json.loads(path.read_text())
        if "methods" in data and "order" in data:
            refresh_wave_summary(data)
            out.append(data)
    return sorted(out, key=lambda d: (d["target"], d["dataset"], bool(d["env"].get("warm_tools"))))


def unresolved(cell: dict, bound: float) -> list[tuple[str, int, str]]:
    """``(record, position, method)`` of each mismatch of ``cell`` that ``bound`` does not make a near tie: its
    margin above the bound, or unknown (plain's margins re-run took another path before that position); one per
    ``(record, position)``, the first method's."""
    out, seen = [], set()
    for row in cell["examples"]:
        m = row.get("mismatch")
        if m is None or (m.get("margin") is not None and m["margin"] <= bound):     # unclassified: no margin, probed
            continue
        if (row["record_id"], m["position"]) not in seen:
            seen.add((row["record_id"], m["position"]))
            out.append((row["record_id"], m["position"], row["method"]))
    return out


def refresh_wave_summary(cell: dict) -> None:
    """Summary figures computed from a cell's rows (so a file written before they existed shows them too): for each
    method that ran waves, the hints' worth (:func:`hint_worth`) and the gate's record (:func:`gate_record`); for
    ``toolspec``, a target step's price by the mean and by the slope (:func:`step_prices`)."""
    for name, summary in cell["methods"].items():
        rows = [r for r in cell.get("examples", []) if r.get("method") == name]
        if "waves_sent" in summary:
            summary.update(hint_worth([r for r in rows if (r.get("wave") or {}).get("banks")]))
            summary.update(gate_record(rows))
        if name == TOOLSPEC and rows:
            summary.update(step_prices(rows))


def gate_record(rows: list[dict]) -> dict:
    """With ``--paired``: the paired ratio over the requests the gate sent no wave and over those it sent one, and for
    the sent waves the latency the gate expected against the one measured (ranges). {} without a gate's decisions."""
    decided = [r for r in rows if (r.get("wave") or {}).get("decision") and r.get("paired")]
    if not decided:
        return {}
    sent = [r for r in decided if r["wave"]["decision"].get("decision") != "skip"]
    skipped = [r for r in decided if r not in sent]

    def ratio(part):
        return sum(r["paired"]["toolspec_s"] for r in part) / sum(r["time_s"] for r in part) if part else None

    out = {"no_wave_n": len(skipped), "no_wave_vs_toolspec": ratio(skipped), "wave_n": len(sent),
           "wave_vs_toolspec": ratio(sent)}
    if sent:
        cost = [r["wave"]["decision"]["expected_cost_s"] for r in sent]
        took = [r["wave"]["wave_s"] for r in sent]
        out.update(expected_wave_s=[min(cost), max(cost)], measured_wave_s=[min(took), max(took)])
    return out


def step_prices(rows: list[dict]) -> dict:
    """A target step's seconds from whole requests: the mean ``seconds / forwards`` and the least-squares slope
    (:class:`~ooospec.runtime.sidecar.gate.StepFit`, what the wave-first gate prices a step with)."""
    from ooospec.runtime.sidecar.gate import StepFit

    fit = StepFit()
    for r in rows:
        fit.add(r["forwards"], r["time_s"])
    return {"step_mean_s": fit.mean_step_s(), "step_slope_s": fit.step_s()}


def hint_worth(rows: list[dict]) -> dict:
    """Over the requests that got a wave: accepted tokens a hint covered and those only the hints had proposed (the
    proposer's counters), per call token; with ``--paired`` also the target forwards saved against the toolspec arm,
    per call token and per hint-only token (``VLLM_CHAIN_MARGINAL`` is that last ratio, pooled). {} without them."""
    rows = [r for r in rows if "hint_only_accepted" in r]
    tokens = sum(r["new_tokens"] for r in rows)
    if not tokens:
        return {}
    only = sum(r["hint_only_accepted"] for r in rows)
    out = {"hint_accepted_per_token": sum(r["hint_accepted"] for r in rows) / tokens,
           "hint_only_per_token": only / tokens, "hint_only_accepted": only}
    if all(r.get("paired") for r in rows):
        saved = sum(max(r["new_tokens"] - r["paired"]["toolspec_accepted"], 1) - r["forwards"] for r in rows)
        out.update(forwards_saved=saved, forwards_saved_per_token=saved / tokens,
                   forwards_saved_per_hint_only=saved / only if only else None)
    return out


def rows_of(cell: dict, with_caching: bool = False) -> list[list]:
    """The cell's method rows; ``with_caching``: the benchmark label says how the prompt KV started."""
    m = cell["methods"]
    llama = m.get(LLAMACPP_REFERENCE, {}).get("mean_s")
    prefill = m.get(VLLM_PREFILL, {}).get("mean_s")
    toolspec = m.get(TOOLSPEC, {}).get("mean_s")
    bench = cell["dataset"] + (f" ({caching(cell['env'])})" if with_caching else "")
    rows = []
    for name in cell["order"]:
        if name in SKIP:
            continue
        s = m[name]
        rows.append([Path(cell["target"]).name, bench, s["n"], f"{llama:.2f}" if llama else "",
                     f"{m[VLLM_REFERENCE]['mean_s']:.2f}", f"{prefill:.2f}" if prefill else "", method_label(name),
                     f"{s['mean_s']:.2f}",
                     f"{s['speedup']:.2f}x", f"{s['decode_speedup']:.2f}x" if "decode_speedup" in s else "",
                     f"{s['vs_llamacpp']:.2f}x" if "vs_llamacpp" in s else "",
                     f"{toolspec / s['mean_s']:.2f}x" if toolspec and name != TOOLSPEC else "", f"{s['mat']:.2f}",
                     f"{s['accepted_per_step']:.2f}", f"{round(s['exact_rate'] * s['n'])}/{s['n']}"
                     + (f" ({s['unclassified']} unclassified)" if s.get("unclassified") else ""),
                     s["near_ties"], s["defects"]])
    return rows


def render(folder: Path) -> str:
    found = cells(folder)
    if not found:
        raise SystemExit(f"{folder}: no vllm-bench results (<target>_<bench>.json)")
    env = found[0]["env"]
    cpu = env["cpu"]
    mixed = len({caching(cell["env"]) for cell in found}) > 1
    head = (f"vLLM {env['vllm']}, {weights_label(env)}, {env['threads']} threads, batch 1, "
            f"{'caching per row' if mixed else caching(env)}, "
            f"k = {env['k']} (ngram {env['ngram_k']}), up to {env.get('max_new_tokens', '?')} new tokens; "
            f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}")
    rows = [r for cell in found for r in rows_of(cell, with_caching=mixed)]
    notes = []
    for cell in found:
        lines = wave_notes(cell["methods"])
        if lines:
            notes.append(f"\n\n**{Path(cell['target']).name}, {cell['dataset']}**" + "".join(lines))
    return head + "\n\n" + md_table(HEADERS, rows, labels=2) + "".join(notes)


def _identical(s: dict) -> str:
    if "exact_rate" not in s:
        return ""
    return f"{s['exact_rate']:.0%}" + (f" ({s['unclassified']} unclassified)" if s.get("unclassified") else "")


def weights_label(env: dict) -> str:
    """The engine's weights: its dtype, and the quantization scheme when the checkpoint is quantized.

    >>> weights_label({"dtype": "bfloat16"}), weights_label({"dtype": "bfloat16", "quantization": {"scheme": "w8a8"}})
    ('bfloat16', 'w8a8 (the rest bfloat16)')
    """
    q = env.get("quantization")
    return f"{q['scheme']} (the rest {env['dtype']})" if q else env["dtype"]


def render_table(results: dict) -> str:
    """One vllm-bench run's table: per method its times, speedups, #MAT, acceptance and exactness."""
    env = results["env"]
    head = (f"{results['target']} on {results['dataset']}: vLLM {env['vllm']}, {weights_label(env)}, {env['threads']} "
            f"threads, batch 1, {caching(env)}, k={env['k']} (ngram {env['ngram_k']})")
    rows = []
    for name, s in results["methods"].items():
        rows.append([method_label(name), s["n"], f"{s['mean_s']:.3f}", f"{s['median_s']:.3f}",
                     f"{s['speedup']:.2f}x" if "speedup" in s else "",
                     f"{s['vs_llamacpp']:.2f}x" if "vs_llamacpp" in s else "",
                     f"{s['mat']:.2f}" if "mat" in s else "",
                     f"{s['accepted_per_step']:.2f}" if "accepted_per_step" in s else "",
                     _identical(s),
                     s.get("near_ties", ""), s.get("defects", "")])
    return head + "\n\n" + md_table(["method", "n", "mean s", "median s", f"vs {VLLM_REFERENCE}",
                                     f"vs {LLAMACPP_REFERENCE}", "#MAT", "accepted / verify step",
                                     f"identical to {VLLM_REFERENCE}", "near-ties", "defects"], rows) + \
        "".join(wave_notes(results["methods"]))


def wave_notes(methods: dict) -> list[str]:
    """Lines under a table for the methods that ran waves inside their requests (``ooospec-wave-first``) or were
    timed paired with ``toolspec`` on their own engine (``--paired``)."""
    out = []
    for name, s in methods.items():
        if "waves_sent" in s:
            out.append(f"\n\n`{name}`: waves sent {s['waves_sent']}/{s['n']}, mean {s['wave_mean_s']:.3f} s each "
                       "(inside the request's time)")
        if "sidecar_waves" in s:
            out.append(f"\n\n`{name}`: the proposer's gate sent waves on {s['sidecar_waves']}/{s['n']} requests "
                       "(the sidecar server's count)")
        if "hint_only_per_token" in s:
            line = (f"\n\n`{name}`, requests with a wave: accepted tokens a hint covered "
                    f"{s['hint_accepted_per_token']:.3f} per call token, only the hints had "
                    f"{s['hint_only_per_token']:.3f}")
            if s.get("forwards_saved_per_token") is not None:
                per_only = s["forwards_saved_per_hint_only"]
                line += (f"; target forwards saved against the paired arm {s['forwards_saved_per_token']:.3f} per call "
                         f"token" + (f", {per_only:.2f} per hint-only token" if per_only is not None else ""))
            if "forwards_saved" in s:
                line += f" ({s['forwards_saved']} forwards saved, {s['hint_only_accepted']} hint-only tokens)"
            out.append(line)
        if "no_wave_n" in s:
            part = [f"{s[k + '_n']} requests {what}: {s[k + '_vs_toolspec']:.2f}x the paired toolspec"
                    for k, what in (("no_wave", "without a wave"), ("wave", "with one")) if s[k + "_n"]]
            line = f"\n\n`{name}`, the gate: " + "; ".join(part)
            if "expected_wave_s" in s:
                (e0, e1), (m0, m1) = s["expected_wave_s"], s["measured_wave_s"]
                line += f"; waves expected to take {e0:.2f}-{e1:.2f} s, took {m0:.2f}-{m1:.2f} s"
            out.append(line)
        if s.get("step_slope_s"):
            out.append(f"\n\n`{name}`: a target step {s['step_mean_s']:.3f} s at the mean per forward, "
                       f"{s['step_slope_s']:.3f} s by the slope of seconds over forwards")
        if "paired_vs_toolspec" in s:
            out.append(f"\n\n`{name}` paired with `toolspec` on the same engine: **{s['paired_vs_toolspec']:.2f}x** "
                       f"(toolspec {s['paired_toolspec_mean_s']:.3f} s, this {s['mean_s']:.3f} s at the mean; "
                       f"faster on {s['paired_faster']}/{s['n']} requests; identical tokens "
                       f"{s['paired_same_tokens']}/{s['n']})")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", type=Path, help="folder of vllm-bench results (eval/reports/vllm)")


def run_cli(args: argparse.Namespace) -> int:
    text = render(args.folder)
    (args.folder / "table.md").write_text(text + "\n")
    print(text)
    return 0
