"""The sidecar's wave alone, by engine and wave shape: latency, cold and with the toolbox warm, and agreement.

    python -m ooospec.eval.sidecar.engines data/slots/heldout.jsonl --limit 100 --threads 2 \\
        --configs transformers:all,transformers:function-first,llama.cpp:function-first \\
        --out eval/reports/sidecar/engines/waves.json --report eval/reports/sidecar/engines/waves.md

Each request row (``expand_slots``'s heldout rows: the block, the tools, the gold slots) is answered by every
``engine:shape`` config, in the same process, one request at a time, after a warm-up:

* ``all``: the wave a client sends by default (:func:`~ooospec.runtime.sidecar.prompts.build_wave` without the direct
  call): the function index and every tool x parameter, one pass.
* ``function-first``: the index query alone (its answer capped at the digits an index can have, top-5 logprobs of
  its first token), then the argument queries of the candidate functions only
  (:func:`~ooospec.runtime.sidecar.protocol.function_candidates`: the greedy one and others above ``--min-prob``,
  at most ``--top-k``), the block reused from the first stage (the engine's block cache).

``cold``: the engine holds no block when the request arrives; ``warm``: the request's toolbox (the block's tools
section, layout 3) was prefilled before the clock starts, as a server that has seen the toolbox holds it. The
wave time is the wall time from the first stage's start to the last answer. Agreement: the answers of every query
two configs both compute, against the first config (the reference); a difference is a near-tie when the
reference's top-2 log-probabilities at the first differing token are within ``--tie-nats``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ooospec.reporting import fmt_cell, md_table
from ooospec.runtime import schemas
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.gate import query_name
from ooospec.runtime.sidecar.protocol import TOP_LOGPROBS, function_candidates, index_tokens

logger = logging.getLogger(__name__)

SHAPES = ("all", "function-first")
CACHES = ("cold", "warm")


# ------------------------------------------------------------------------------------------ waves of a row


def argument_queries(tools: Sequence[Any], functions: Sequence[str] | None = None) -> list[sp.SlotQuery]:
    """One argument query per parameter of every tool (or of the named ones), in tool and schema order."""
    out = []
    for tool in tools:
        name = schemas.tool_name(tool)
        if name is None or (functions is not None and name not in functions):
            continue
        out += [sp.SlotQuery("argument", name, p, sp.argument_query(tool, p)) for p in sp.tool_parameters(tool)]
    return out


INDEX = sp.SlotQuery("function_index", None, None, sp.INDEX_QUERY)


def toolbox_of(block: str) -> str:
    """The tools section of a layout-3 block (what a server that has seen the toolbox holds)."""
    cut = block.find("Conversation:\n")
    return block[:cut] if cut > 0 else ""


# ------------------------------------------------------------------------------------------ running


def reset(sidecar) -> None:
    """The engine holds no block: a fresh prefix cache (transformers), an emptied sequence 0 (llama.cpp), an
    emptied prefix cache (vLLM)."""
    if sidecar.engine == "transformers":
        from ooospec.runtime.agent.session import PrefixCache

        sidecar.prefix_cache = PrefixCache(max_tokens=16384)
    else:
        sidecar.reset_cache()


def answer_row(sidecar, row: Mapping, shape: str, *, top_k: int, min_prob: float) -> dict:
    """One request's wave(s), timed: ``{"wave_s", "stages", "answers": {query: text}, "functions"}``."""
    tools, block = row["tools"], row["block"]
    t0 = time.perf_counter()
    if shape == "all":
        wave = sp.Wave(block, (INDEX, *argument_queries(tools)))
        results, waves = [sidecar.answer(wave)], [wave]
        functions = None
    else:
        first = sp.Wave(block, (INDEX,))
        r1 = sidecar.answer(first, logprobs=TOP_LOGPROBS if top_k > 1 else 0, max_new_tokens=index_tokens(len(tools)))
        top = r1.top_logprobs[0][0] if r1.top_logprobs and r1.top_logprobs[0] else None
        picked = function_candidates(r1.answers[0], top, len(tools), top_k=top_k, min_prob=min_prob)
        functions = [schemas.tool_name(tools[i]) for i in picked]
        second = sp.Wave(block, tuple(argument_queries(tools, functions)))
        results, waves = [r1], [first]
        if second.queries:
            results.append(sidecar.answer(second))
            waves.append(second)
    wave_s = time.perf_counter() - t0
    answers = {query_name(q): a for w, r in zip(waves, results) for q, a in zip(w.queries, r.answers)}
    stages = [{"queries": len(w.queries), "prefill_s": r.prefill_s, "decode_s": r.decode_s,
               "n_forwards": r.n_forwards, "block_tokens": r.block_tokens, "cached_tokens": r.cached_tokens}
              for w, r in zip(waves, results)]
    return {"id": row["id"], "wave_s": wave_s, "stages": stages, "answers": answers, "functions": functions}


def run_config(sidecar, rows: Sequence[Mapping], shape: str, cache: str, *, top_k: int, min_prob: float) -> list[dict]:
    out = []
    for row in rows:
        reset(sidecar)
        if cache == "warm" and toolbox_of(row["block"]):
            sidecar.prefill(toolbox_of(row["block"]))
        out.append(answer_row(sidecar, row, shape, top_k=top_k, min_prob=min_prob))
    return out


# ------------------------------------------------------------------------------------------ scoring


def gold_of(row: Mapping) -> dict[str, str]:
    return {query_name(sp.SlotQuery(s["form"], s["function"], s["parameter"], s["query"])): s["answer"]
            for s in row["slots"]}


def _value(text: str) -> Any:
    try:
        return sp.compact_json(sp.first_json(text))
    except ValueError:
        return None


def quality(rows: Sequence[Mapping], runs: Sequence[Mapping]) -> dict:
    """Index accuracy and exact argument values (the gold function's parameters the run answered), vs gold."""
    index_ok = args_ok = args_n = 0
    for row, run in zip(rows, runs):
        gold = gold_of(row)
        index_ok += _value(run["answers"].get("index", "")) == _value(gold["index"])
        for name, text in gold.items():
            if name not in ("index", "call") and name.startswith(f"{row['function']}."):
                args_n += 1
                args_ok += name in run["answers"] and _value(run["answers"][name]) == _value(text)
    return {"index_accuracy": index_ok / max(len(rows), 1), "argument_exact": args_ok / max(args_n, 1),
            "gold_arguments": args_n}


def agreement(reference: Sequence[Mapping], other: Sequence[Mapping]) -> dict:
    """Queries both answered, how many answers equal, and the differing ``(row id, query)`` pairs."""
    both = same = 0
    differ = []
    for a, b in zip(reference, other):
        for name in a["answers"].keys() & b["answers"].keys():
            both += 1
            if a["answers"][name] == b["answers"][name]:
                same += 1
            else:
                differ.append((a["id"], name, a["answers"][name], b["answers"][name]))
    return {"both": both, "same": same, "rate": same / both if both else None, "differ": differ}


def classify_ties(sidecar, rows: Mapping[str, Mapping], differ: Sequence[tuple], tie_nats: float) -> int:
    """How many differences are near-ties of the reference engine: at the first token where the two answers part,
    its top-2 log-probabilities are within ``tie_nats`` (re-decoded with logprobs, untimed)."""
    ties = 0
    for rid, name, ref, other in differ:
        row = rows[rid]
        query = next((q for q in (INDEX, *argument_queries(row["tools"])) if query_name(q) == name), None)
        if query is None:
            continue
        reset(sidecar)
        r = sidecar.answer(sp.Wave(row["block"], (query,)), logprobs=2)
        ids = sidecar.tokenizer(other, add_special_tokens=False)["input_ids"]
        at = next((i for i, (x, y) in enumerate(zip(r.tokens[0], ids)) if x != y), min(len(ids), len(r.tokens[0])))
        steps = r.top_logprobs[0] if r.top_logprobs else []
        if at < len(steps) and len(steps[at]) == 2:
            a, b = sorted(steps[at].values(), reverse=True)
            ties += a - b <= tie_nats
    return ties


# ------------------------------------------------------------------------------------------ summary


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarize(rows: Sequence[Mapping], runs: Mapping[str, list[dict]], reference: str) -> list[dict]:
    out = []
    for key, rs in runs.items():
        waves = [r["wave_s"] for r in rs]
        ref = runs.get(reference)
        out.append({"config": key, "p50_s": statistics.median(waves), "p90_s": _pct(waves, 0.9),
                    "prefill_p50_s": statistics.median(sum(s["prefill_s"] for s in r["stages"]) for r in rs),
                    "decode_p50_s": statistics.median(sum(s["decode_s"] for s in r["stages"]) for r in rs),
                    "mean_queries": statistics.mean(sum(s["queries"] for s in r["stages"]) for r in rs),
                    "mean_forwards": statistics.mean(sum(s["n_forwards"] for s in r["stages"]) for r in rs),
                    "p50_vs_reference": None if ref is None else
                    statistics.median(r["wave_s"] for r in rs) / statistics.median(x["wave_s"] for x in ref),
                    **quality(rows, rs)})
    return out


def render(summary: Sequence[Mapping], agree: Mapping[str, Mapping], env: Mapping, command: str) -> str:
    head = ["config", "p50 s", "p90 s", "p50 / reference", "prefill p50 s", "decode p50 s", "queries", "forwards",
            "index acc.", "arg. exact",
            "agreement with reference (near-ties)"]
    body = []
    for s in summary:
        a = agree.get(s["config"])
        by = f" of {a['ties_by']}" if a and a.get("ties_by") else ""
        agree_cell = "-" if a is None else (f"{a['same']}/{a['both']} ({a['ties']} of the {a['both'] - a['same']} "
                                            f"differences near-ties{by})")
        body.append([s["config"], fmt_cell(s["p50_s"], "{:.3f}"), fmt_cell(s["p90_s"], "{:.3f}"),
                     fmt_cell(s["p50_vs_reference"], "{:.2f}x"), fmt_cell(s.get("prefill_p50_s"), "{:.3f}"),
                     fmt_cell(s.get("decode_p50_s"), "{:.3f}"), fmt_cell(s["mean_queries"], "{:.1f}"),
                     fmt_cell(s["mean_forwards"], "{:.1f}"), fmt_cell(s["index_accuracy"], "{:.1%}"),
                     fmt_cell(s["argument_exact"], "{:.1%}"), agree_cell])
    return (f"# Sidecar waves alone, by engine and shape\n\n{env['cpu']} ({', '.join(env['flags'])}), "
            f"{env['threads']} threads, {env['requests']} heldout requests, adapter {env['adapter']}.\n\n"
            f"```\n{command}\n```\n\n" + md_table(head, body) + "\n")


# ------------------------------------------------------------------------------------------ command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rows", type=Path, help="expand_slots request rows (data/slots/heldout.jsonl)")
    p.add_argument("--render", action="store_true",
                   help="no waves: re-render --report from the waves JSON in --out (its rows file: `rows`)")
    p.add_argument("--limit", type=int, default=100, help="requests (seeded choice, as eval_sidecar makes it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adapter", type=Path, default=None, help="adapter folder (default: the shipped one)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--configs", default="transformers:all,transformers:function-first,llama.cpp:function-first",
                   help="engine:shape pairs, the first is the reference")
    p.add_argument("--caches", default="cold,warm", help="cold and/or warm")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--min-prob", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=2, help="requests answered untimed per config first")
    p.add_argument("--tie-nats", type=float, default=0.5)
    p.add_argument("--vllm-ngram", type=int, default=None,
                   help="the vLLM engine's n-gram draft tokens per query and step (default: the engine's, 0: none)")
    p.add_argument("--out", type=Path, required=True, help="the JSON of every wave")
    p.add_argument("--report", type=Path, default=None, help="markdown table")
    p.add_argument("--reference-runs", type=Path, default=None,
                   help="an earlier run's waves JSON (same rows) whose configs run first: the reference is its first "
                        "(e.g. transformers from the main venv beside vLLM from its own venv); differences are then "
                        "classified by the first engine loaded here")


def reference_runs(path: Path, rows: Sequence[Mapping]) -> tuple[dict[str, list[dict]], dict, str]:
    """``(runs, env, reference config)`` of an earlier run; SystemExit when its requests are not ``rows``."""
    done = json.loads(path.read_text())
    ids = [r["id"] for r in rows]
    for key, run in done["runs"].items():
        if [r["id"] for r in run] != ids:
            raise SystemExit(f"--reference-runs {path}: {key} answered other requests than these {len(ids)} rows "
                             "(same rows file, --limit and --seed?)")
    return done["runs"], done["env"], done["summary"][0]["config"].rsplit(":", 1)[0]


def _configs(text: str) -> list[tuple[str, str]]:
    from ooospec.runtime.sidecar.engines import ENGINES

    out = []
    for item in text.split(","):
        engine, _, shape = item.strip().partition(":")
        if engine not in ENGINES or shape not in SHAPES:
            raise SystemExit(f"--configs: {item!r} is not engine:shape with engine in {ENGINES}, shape in {SHAPES}")
        out.append((engine, shape))
    return out


def run_configs(args: argparse.Namespace, configs: list[tuple[str, str]], caches: list[str], rows: list[dict],
                runs: dict[str, list[dict]]) -> dict[str, Any]:
    """Every engine:shape:cache run over ``rows`` (after ``--warmup`` untimed ones) into ``runs``; the sidecars
    loaded, by engine."""
    from tqdm import tqdm

    from ooospec.runtime.sidecar.engines import load_sidecar

    loaded: dict[str, Any] = {}
    for engine, shape in configs:
        if engine not in loaded:
            options = {"ngram_tokens": args.vllm_ngram} if engine == "vllm" and args.vllm_ngram is not None else {}
            loaded[engine] = load_sidecar(args.adapter, threads=args.threads, dtype="auto", engine=engine, **options)
        sidecar = loaded[engine]
        for cache in caches:
            key = f"{engine}:{shape}:{cache}"
            run_config(sidecar, rows[:args.warmup], shape, cache, top_k=args.top_k, min_prob=args.min_prob)
            runs[key] = run_config(sidecar, tqdm(rows, desc=key), shape, cache, top_k=args.top_k,
                                   min_prob=args.min_prob)
    return loaded


def agreements(args: argparse.Namespace, caches: list[str], runs: dict[str, list[dict]], loaded: dict[str, Any],
               reference: str, by_id: dict[str, dict]) -> dict[str, dict]:
    """Each run against the reference run of the same cache state, its differences classified as ties or not by
    the reference's engine."""
    judge = loaded.get(reference.split(":")[0]) or next(iter(loaded.values()))
    agree = {}
    for cache in caches:
        ref_key = f"{reference}:{cache}"
        for key, run in runs.items():
            if key.endswith(f":{cache}") and key != ref_key and ref_key in runs:
                a = agreement(runs[ref_key], run)
                a["ties"] = classify_ties(judge, by_id, a["differ"], args.tie_nats)
                a["ties_by"] = judge.engine
                agree[key] = a
    return agree


def run_environment(args: argparse.Namespace, rows: list[dict], loaded: dict[str, Any], prior_env: dict) -> dict:
    """What the runs ran on: the CPU, threads, requests, adapter and each engine's weights."""
    from ooospec.runtime.backends.hardware import cpu_info

    info = cpu_info()
    env = {"cpu": info["model"], "flags": info["flags"], "threads": args.threads, "requests": len(rows),
           "adapter": str(args.adapter or "adapters/sidecar"),
           "engines": {**prior_env.get("engines", {}),
                       **{e: {"weights": s.weights, "threads": s.threads} for e, s in loaded.items()}}}
    if args.reference_runs:
        env["reference_runs"] = {"path": str(args.reference_runs), "command": json.loads(
            args.reference_runs.read_text())["command"]}
    return env


def run_cli(args: argparse.Namespace) -> int:
    import sys

    from ooospec.pipelines.eval_sidecar import select_requests

    configs, caches = _configs(args.configs), [c for c in args.caches.split(",") if c]
    rows = select_requests([json.loads(line) for line in args.rows.open()], args.limit, args.seed)
    if args.render:
        done = json.loads(args.out.read_text())
        text = render(summarize(rows, done["runs"], done["summary"][0]["config"]), done["agreement"], done["env"],
                      done["command"])
        if args.report:
            args.report.write_text(text)
        print(text)
        return 0
    runs: dict[str, list[dict]] = {}
    prior_env: dict = {}
    reference = ":".join(configs[0])
    if args.reference_runs:
        runs, prior_env, reference = reference_runs(args.reference_runs, rows)
    loaded = run_configs(args, configs, caches, rows, runs)
    agree = agreements(args, caches, runs, loaded, reference, {r["id"]: r for r in rows})
    summary = summarize(rows, runs, f"{reference}:cold")
    env = run_environment(args, rows, loaded, prior_env)
    command = "python -m ooospec.eval.sidecar.engines " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".partial")
    tmp.write_text(json.dumps({"env": env, "command": command, "summary": summary, "agreement": agree,
                               "runs": runs}, indent=1, ensure_ascii=False))
    tmp.replace(args.out)
    text = render(summary, agree, env, command)
    if args.report:
        args.report.write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_cli(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
