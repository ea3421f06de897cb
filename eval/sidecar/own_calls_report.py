"""The learning curve of a sidecar tuned on a toolbox's own calls: tables, JSON and a plot from the runs' metrics.

    python -m ooospec.eval.sidecar.own_calls_report eval/reports/own-calls/metrics/runs eval/reports/own-calls

Reads ``<runs>/<name>.heldout.json`` (``eval_sidecar`` on the toolbox's held-out requests; one per evaluated
adapter) and, where it exists, ``<runs>/<name>.train.json`` (``train_sidecar``: how many of the toolbox's requests
the run saw, and the adapter it continued from). An adapter without a train file is a starting point (0 requests
of the toolbox). Every number in the outputs is one of those files' numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

from ooospec.pipelines.params import module_main
from ooospec.pipelines.records import atomic_write_text, read_jsonl, write_json
from ooospec.reporting import md_table
from ooospec.runtime.calls import compact_json

QUALITY = (("function", ("function_index", "accuracy")), ("argument EM", ("argument", "exact_match")),
           ("argument EM non-null", ("argument", "exact_match_non_null")),
           ("joined call EM", ("joined", "exact_match")), ("direct call EM", ("direct_call", "exact_match")))


def wilson(p: float | None, n: int | None, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson 95% interval of a rate ``p`` measured on ``n`` requests (None when either is missing).

    >>> [round(x, 3) for x in wilson(0.5, 100)]
    [0.404, 0.596]
    """
    if p is None or not n:
        return None
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _get(d: dict, path: tuple[str, ...]):
    for key in path:
        d = d.get(key) if isinstance(d, dict) else None
    return d


def curve_rows(runs: Path) -> list[dict]:
    """One row per evaluated adapter: its base, what it continued from, toolbox requests trained, quality, wave."""
    rows = []
    for heldout in sorted(runs.glob("*.heldout.json")):
        name = heldout.name.removesuffix(".heldout.json")
        ev = json.loads(heldout.read_text())
        train_file = runs / f"{name}.train.json"
        train = json.loads(train_file.read_text()) if train_file.exists() else {}
        row = {"run": name, "base": ev.get("base"), "adapter": ev.get("adapter"),
               "continued_from": (train.get("init_adapter") or {}).get("path"),
               "requests_trained": (train.get("requests") or {}).get("trained", 0),
               "train_seconds": train.get("train_seconds"), "heldout_requests": ev.get("requests"),
               "wave_median_s": round(ev["latency"]["wave"]["median_ms"] / 1000, 3)
               if _get(ev, ("latency", "wave", "median_ms")) is not None else None,
               "threads": _get(ev, ("latency", "threads")), "dtype": ev.get("dtype")}
        row.update({label: _get(ev, path) for label, path in QUALITY})
        row["joined call EM 95% interval"] = wilson(row["joined call EM"], row["heldout_requests"])
        rows.append(row)
    return sorted(rows, key=lambda r: (str(r["base"]), r["requests_trained"], r["run"]))


def gains(rows: list[dict]) -> list[dict]:
    """Per base: the starting point (0 requests) against the run that saw the most requests, in points."""
    out = []
    for base in sorted({r["base"] for r in rows}):
        mine = [r for r in rows if r["base"] == base]
        start = next((r for r in mine if r["requests_trained"] == 0), None)
        best = max(mine, key=lambda r: r["requests_trained"])
        if start is None or best is start:
            continue
        out.append({"base": base, "from": start["run"], "to": best["run"], "requests": best["requests_trained"],
                    **{label: round(100 * (best[label] - start[label]), 1)
                       for label, _ in QUALITY if best[label] is not None and start[label] is not None}})
    return out


def _conversation_text(record: dict) -> str:
    """The messages' text (records are normalized at ingest: every content a string)."""
    return "\n".join(str(m.get("content") or "") for m in record.get("messages", []))


def _value_text(value) -> str:
    return value if isinstance(value, str) else compact_json(value)


def copy_ceiling(heldout: list[dict], train: list[dict]) -> dict:
    """Where the held-out calls' argument values come from: written verbatim in the request's conversation, else
    seen in training for the same tool and parameter, else neither (the target reformatted or invented it, which
    a sidecar must derive as the target does). A request whose every value is copyable or seen is within reach of a
    sidecar that only copies and recalls.

    >>> rec = {"messages": [{"role": "user", "content": "alarm at 6:30 for Jane"}],
    ...        "calls": [{"name": "A", "arguments": {"who": "Jane", "at": "06:30", "tok": "t1"}}]}
    >>> seen = {"calls": [{"name": "A", "arguments": {"tok": "t1"}}]}
    >>> c = copy_ceiling([rec], [seen])
    >>> (c["values"], c["in_conversation"], c["seen_in_training"], c["neither"], c["requests_within_reach"])
    (3, 1, 1, 1, 0)
    """
    seen: dict[tuple[str, str], set[str]] = {}
    for r in train:
        for call in r.get("calls") or []:
            for k, v in (call.get("arguments") or {}).items():
                seen.setdefault((call.get("name"), k), set()).add(_value_text(v))
    values = copied = known = within = 0
    for r in heldout:
        text, reach = _conversation_text(r), True
        for call in r.get("calls") or []:
            for k, v in (call.get("arguments") or {}).items():
                if v is None:
                    continue
                values += 1
                v_text = _value_text(v)
                if v_text in text:
                    copied += 1
                elif v_text in seen.get((call.get("name"), k), ()):
                    known += 1
                else:
                    reach = False
        within += reach
    return {"requests": len(heldout), "training_requests": len(train), "values": values, "in_conversation": copied,
            "seen_in_training": known, "neither": values - copied - known, "requests_within_reach": within}


def _next_tool_step(prev: list[dict], messages: list[dict]) -> bool:
    """``messages`` continue ``prev`` by the assistant's call and the tool's result only (the rule by which
    :mod:`ooospec.eval.agent.replay` chains API-Bank's steps into one dialogue)."""
    return messages[:len(prev)] == prev and [m.get("role") for m in messages[len(prev):]] == ["assistant", "tool"]


def dialogue_shape(heldout: list[dict]) -> dict:
    """How agent-like the held-out conversations are: dialogues (``meta.dialogue``), those with two calls or more,
    and those where a call follows the previous call's tool result directly (no user turn between: the agent loop
    the agent bench replays).

    >>> turn = lambda n, d: {"meta": {"dialogue": d}, "calls": [{}], "messages": [{"role": "user"}] + [
    ...     m for _ in range(n) for m in ({"role": "assistant"}, {"role": "tool"})]}
    >>> dialogue_shape([turn(0, "a"), turn(1, "a"), turn(0, "b")])
    {'dialogues': 2, 'with_two_calls_or_more': 1, 'with_back_to_back_calls': 1}
    """
    by: dict[str, list[dict]] = {}
    for r in heldout:
        by.setdefault(str((r.get("meta") or {}).get("dialogue", r.get("id"))), []).append(r)
    multi = chained = 0
    for recs in by.values():
        recs.sort(key=lambda r: len(r.get("messages") or []))
        multi += sum(len(r.get("calls") or []) for r in recs) >= 2
        chained += any(_next_tool_step(a["messages"], b["messages"]) for a, b in itertools.pairwise(recs))
    return {"dialogues": len(by), "with_two_calls_or_more": multi, "with_back_to_back_calls": chained}


def ceiling_lines(c: dict) -> list[str]:
    """The copy ceiling (and, where measured, the dialogues' shape) as report lines."""
    def share(key: str, total: int) -> str:
        return f"{c[key]} ({100 * c[key] / max(total, 1):.0f}%)"

    origin = (f"- **Where the held-out calls' values come from** ({c['values']} non-null argument values of "
              f"{c['requests']} held-out requests): written verbatim in the conversation "
              f"{share('in_conversation', c['values'])}, seen for that tool and parameter in the "
              f"{c['training_requests']} training requests {share('seen_in_training', c['values'])}, neither "
              f"{share('neither', c['values'])}: the target derived those (reformatted, assembled or made up), and a "
              "sidecar must derive them exactly as the target does.")
    reach = (f"- **Copy and recall**: {share('requests_within_reach', c['requests'])} of the held-out requests have "
             "every value copyable or seen: a sidecar that only copies from the request and recalls its training "
             "data gets at most these right.")
    shape = c.get("dialogue_shape")
    agent = [] if not shape else [
        (f"- **Agent loops**: of {shape['dialogues']} held-out dialogues {shape['with_two_calls_or_more']} hold two "
         f"calls or more, {shape['with_back_to_back_calls']} a call right after the previous call's tool result (no "
         "user turn between: the loop the agent bench replays).")]
    return [origin, reach, *agent]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _interval(iv) -> str:
    return "-" if iv is None else f"[{100 * iv[0]:.0f}, {100 * iv[1]:.0f}]"


def markdown(rows: list[dict], deltas: list[dict], runs: Path, ceiling: dict | None = None) -> str:
    header = ["run", "base", "toolbox requests trained", *[label for label, _ in QUALITY], "joined 95% interval",
              "held-out requests", "wave median s", "train s"]
    table = md_table(header, [[r["run"], r["base"], r["requests_trained"], *[_pct(r[label]) for label, _ in QUALITY],
                               _interval(r["joined call EM 95% interval"]), r["heldout_requests"], r["wave_median_s"],
                               r["train_seconds"] or "-"] for r in rows])
    lines = [f"- **{d['base']}**: {d['from']} -> {d['to']} ({d['requests']} requests): joined call "
             f"{d.get('joined call EM', 0):+.1f} points, function {d.get('function', 0):+.1f}, argument EM non-null "
             f"{d.get('argument EM non-null', 0):+.1f}" for d in deltas]
    lines += ceiling_lines(ceiling) if ceiling else []
    note = ("The joined call's 95% interval is Wilson's on the held-out requests: two runs whose intervals overlap "
            "widely may differ by chance alone.")
    return (f"<!-- generated by `python -m ooospec.eval.sidecar.own_calls_report {runs} ...` from the runs' metrics; "
            f"do not edit by hand -->\n# Learning curve\n\n{table}\n\n{note}\n\n" + "\n".join(lines) + "\n")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for base in sorted({r["base"] for r in rows}):
        mine = sorted((r for r in rows if r["base"] == base), key=lambda r: r["requests_trained"])
        for label, style in (("joined call EM", "-o"), ("argument EM non-null", "--s")):
            ax.plot([r["requests_trained"] for r in mine], [100 * (r[label] or 0) for r in mine], style,
                    label=f"{base}: {label}")
    ax.set_xlabel("toolbox requests trained on (0 = the sidecar you start from)")
    ax.set_ylabel("% of held-out requests")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def write_report(runs: Path, out: Path, heldout: Path | None = None, train: Path | None = None) -> dict:
    """``learning_curve.{md,json,png}`` in ``out``; returns the JSON. With the held-out and training records, the
    copy ceiling too (:func:`copy_ceiling`)."""
    runs, out = Path(runs), Path(out)
    rows = curve_rows(runs)
    if not rows:
        raise SystemExit(f"no <run>.heldout.json under {runs}: run eval_sidecar first")
    deltas = gains(rows)
    ceiling = None
    if heldout and train:
        held = list(read_jsonl(heldout))
        ceiling = copy_ceiling(held, list(read_jsonl(train))) | {"dialogue_shape": dialogue_shape(held)}
    report = {"rows": rows, "gains": deltas, "ceiling": ceiling}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "learning_curve.json", report)
    atomic_write_text(out / "learning_curve.md", markdown(rows, deltas, runs, ceiling))
    plot(rows, out / "learning_curve.png")
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", type=Path, help="folder of <run>.heldout.json (eval_sidecar) and <run>.train.json")
    p.add_argument("out", type=Path, help="report folder (learning_curve.md / .json / .png)")
    p.add_argument("--heldout", type=Path, help="the held-out records (for the copy ceiling)")
    p.add_argument("--train", type=Path, help="the training records (dedupe's train.jsonl; with --heldout)")


def run_cli(args: argparse.Namespace) -> int:
    if (args.heldout is None) != (args.train is None):
        raise SystemExit("--heldout and --train go together")
    report = write_report(args.runs, args.out, args.heldout, args.train)
    for g in report["gains"]:
        print(f"{g['base']}: {g['from']} -> {g['to']} ({g['requests']} requests): joined call "
              f"{g.get('joined call EM', 0):+.1f} points")
    if report["ceiling"]:
        print(ceiling_lines(report["ceiling"])[1].removeprefix("- "))
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.eval.sidecar.own_calls_report", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
