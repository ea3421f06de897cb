"""A target's own tool-call quality, read from a bench's plain greedy rows: is a quantized model still as good?

    python -m ooospec.eval.substrate.call_quality --dataset apibank-l1 \\
        bf16=eval/reports/cpu/quantized/xeon-amx/bf16/qwen2.5-coder-1.5b_apibank-l1.json \\
        w8a8=eval/reports/cpu/quantized/xeon-amx/w8a8/qwen2.5-coder-1.5b_apibank-l1.json \\
        Q4_K_M=eval/reports/cpu/quantized/xeon-amx/qwen2.5-coder-1.5b_apibank-l1.llamacpp.json:llama.cpp

Each ``NAME=FILE[:METHOD]`` is a results JSON of ``ooospec vllm-bench`` (method ``vllm`` by default) or ``ooospec
bench`` (``llama.cpp``, ``hf-greedy``, ...): its rows' output texts are parsed with the target's call syntax
(:func:`~ooospec.runtime.formats.parse_any`) and scored against each record's gold ``calls``:

* ``function``: the first call names the gold first call's function (no call at all counts as wrong);
* ``arguments``: of all gold arguments, those the output's same-named call gives with an equal value (JSON-equal);
* ``call``: every call equal to the gold calls, in order (name and the whole argument object).

Greedy decoding is deterministic, so these are the model's quality on those requests, whichever drafter timed it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ooospec.reporting import md_table


def _canon(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def score(calls: list[dict], gold: list[dict]) -> dict:
    """``function`` / ``call`` (0 or 1) and ``args_right`` of ``args_total`` for one output against its gold."""
    total = sum(len(g.get("arguments") or {}) for g in gold)
    if not gold:
        return {"function": int(not calls), "call": int(not calls), "args_right": 0, "args_total": 0}
    function = int(bool(calls) and calls[0].get("name") == gold[0].get("name"))
    right = 0
    for i, g in enumerate(gold):
        out = calls[i] if i < len(calls) and calls[i].get("name") == g.get("name") else None
        given = (out or {}).get("arguments") or {}
        right += sum(k in given and _canon(given[k]) == _canon(v) for k, v in (g.get("arguments") or {}).items())
    same = len(calls) == len(gold) and all(
        c.get("name") == g.get("name") and _canon(c.get("arguments") or {}) == _canon(g.get("arguments") or {})
        for c, g in zip(calls, gold))
    return {"function": function, "call": int(same), "args_right": right, "args_total": total}


def quality(rows: list[dict], gold: dict[str, list[dict]]) -> dict:
    """Scores summed over ``rows`` (each with ``text`` and ``record_id`` or ``id``) against ``gold`` by record id."""
    from ooospec.runtime.formats import parse_any

    n = function = call = right = total = 0
    for row in rows:
        rid = row.get("record_id") or row.get("id")
        if rid not in gold:
            raise ValueError(f"row {rid!r} has no record in the benchmark")
        s = score(parse_any(row.get("text") or ""), gold[rid])
        n += 1
        function, call = function + s["function"], call + s["call"]
        right, total = right + s["args_right"], total + s["args_total"]
    return {"n": n, "function": function / n if n else None, "arguments": right / total if total else None,
            "call": call / n if n else None}


def rows_of(path: Path, method: str | None) -> list[dict]:
    """The rows of ``method`` in a bench results JSON (``vllm`` for a vllm-bench file when not given)."""
    data = json.loads(path.read_text())
    rows = data.get("examples") or []
    if method is None:
        method = "vllm" if any(r.get("method") == "vllm" for r in rows) else data.get("config", {}).get("reference")
    picked = [r for r in rows if r.get("method") == method]
    if not picked:
        raise ValueError(f"{path}: no rows of method {method!r}")
    return picked


def gold_calls(dataset: str, benchmark_dir: Path | None) -> dict[str, list[dict]]:
    from ooospec.eval.bench.data import load_examples
    from ooospec.runtime.paths import resolve_benchmark

    return {r["id"]: r["calls"] for r in load_examples(resolve_benchmark(dataset, benchmark_dir))}


def main(argv: list[str] | None = None) -> int:
    from ooospec.runtime.paths import BENCHMARK_DIR_FLAG

    p = argparse.ArgumentParser(prog="python -m ooospec.eval.substrate.call_quality",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None)
    p.add_argument("runs", nargs="+", metavar="NAME=FILE[:METHOD]")
    p.add_argument("--out", type=Path, default=None, help="also write the scores as JSON")
    args = p.parse_args(argv)
    gold = gold_calls(args.dataset, args.benchmark_dir)
    scores = {}
    for spec in args.runs:
        name, _, rest = spec.partition("=")
        path, _, method = rest.partition(":")
        if not name or not path:
            p.error(f"{spec!r}: expected NAME=FILE[:METHOD]")
        scores[name] = quality(rows_of(Path(path), method or None), gold)
    table = [[name, s["n"], f"{s['function']:.1%}", f"{s['arguments']:.1%}" if s["arguments"] is not None else "-",
              f"{s['call']:.1%}"] for name, s in scores.items()]
    print(md_table(["weights", "n", "function", "arguments", "whole call"], table, align="lrrrr"))
    if args.out:
        args.out.write_text(json.dumps({"dataset": args.dataset, "scores": scores}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
