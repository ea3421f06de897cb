"""How far one vLLM engine's own numerics move a top-2 margin: the near-tie bound of that engine and weight format.

    .venv-vllm/bin/python -m ooospec.eval.vllm.numerics --target qwen2.5-coder-0.5b --quantized w8a8 \\
        --dataset bfcl-simple-python --skip 30 --limit 16 \\
        --out eval/reports/cpu/quantized/xeon-amx/numerics_qwen2.5-coder-0.5b_w8a8.json
    python -m ooospec.eval.vllm.numerics --reclassify CELL.json --bound-from NUMERICS.json   # main venv

Speculative decoding verifies k drafted tokens in one multi-token forward; plain decoding scores one token per
forward. On a CPU the two shapes run different kernels (another accumulation order; int8 activations quantized per
token over another set of rows), so the same position's logits differ in the last bits -- and a choice whose top-2
margin is smaller than that difference can come out either way without any drafter being wrong. llama.cpp's backend
measures it per file (:func:`ooospec.runtime.backends.llamacpp.batch_shape_diff`); this measures it inside vLLM on the
traffic itself: each request decoded greedily one token per step (``logprobs=2``), then the prompt plus that output
scored in one forward (``prompt_logprobs=2``, prefix caching off), and at every output position the two top-2
margins compared. The engine's near-tie bound is the largest swing seen, at least :data:`MIN_BOUND` (the bf16 bound
of ``vllm-bench --tie-margin``). ``--reclassify`` counts a stored cell's mismatches again against that bound and
records the bound and its source in the cell's ``env.tie_margin``; ``--probe`` adds the positions where a mismatch
probe saw the engine, with no drafter, pick the drafted token (the engine's numerics, whatever the margin).
``--probe-cells`` runs those probes (:func:`probe`) on every mismatch the bound leaves a defect or unknown.

    .venv-vllm/bin/python -m ooospec.eval.vllm.numerics --probe-cells CELL.json ... --bound-from NUMERICS.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ooospec.eval.vllm.report import unresolved
from ooospec.runtime.backends.hardware import vllm_dtype

MIN_BOUND = 0.25


def top2_margin(entry) -> float | None:
    """The top-2 margin of one position's logprobs (``{token: Logprob}`` or ``{token: float}``), None without two."""
    if not entry:
        return None
    values = sorted((getattr(v, "logprob", v) for v in entry.values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def swings(decoded: list, scored: list, prompt_len: int) -> list[tuple[float, bool]]:
    """``(|margin decoded - margin scored|, top-1 differs)`` at every output position: ``decoded`` the per-step
    logprobs of the output, ``scored`` the prompt logprobs of prompt + output in one forward."""
    out = []
    for i, step in enumerate(decoded):
        pos = prompt_len + i
        if pos >= len(scored) or scored[pos] is None:
            break
        a, b = top2_margin(step), top2_margin(scored[pos])
        if a is None or b is None:
            continue
        top_a = max(step, key=lambda t: getattr(step[t], "logprob", step[t]))
        top_b = max(scored[pos], key=lambda t: getattr(scored[pos][t], "logprob", scored[pos][t]))
        out.append((abs(a - b), top_a != top_b))
    return out


def summarize(all_swings: list[tuple[float, bool]], min_bound: float = MIN_BOUND) -> dict:
    """Positions, the largest / 99th-percentile / mean swing, top-1 flips and the resulting near-tie bound."""
    values = sorted(s for s, _ in all_swings)
    if not values:
        raise ValueError("no output position had two logprobs in both shapes: nothing measured")
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    return {"positions": len(values), "max_swing": values[-1], "p99_swing": p99, "mean_swing": statistics.fmean(values),
            "top1_flips": sum(f for _, f in all_swings), "bound": max(min_bound, values[-1])}


def measure(llm, prompts: list[list[int]], max_tokens: int) -> list[tuple[float, bool]]:
    """Each prompt (one request at a time, as the bench decodes) decoded one token per step, then prompt + output
    scored in one forward; the swings of every output position."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    decode = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2)
    score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=2)
    out = []
    for p in prompts:
        one = llm.generate([TokensPrompt(prompt_token_ids=p)], decode, use_tqdm=False)[0].outputs[0]
        ids = list(p) + list(one.token_ids)
        scored = llm.generate([TokensPrompt(prompt_token_ids=ids)], score, use_tqdm=False)[0].prompt_logprobs
        out += swings(one.logprobs, scored, len(p))
    return out


def probe(llm, tok, prompt: list[int], plain: list[int], other: list[int], pos: int) -> dict:
    """Plain's choice at ``pos`` (where ``other``, a drafting method's tokens, parts from ``plain``), four ways on
    one engine with no drafter: plain's output scored in one prefill forward, and greedy decoding resumed after
    prefilling the prefix up to 0, 4 and 16 tokens before ``pos``. Each as ``{token text: logprob}`` of its top 2."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def top2(logprobs) -> dict:
        return {tok.decode([k]): round(v.logprob, 4) for k, v in logprobs.items()}

    out = {"position": pos, "plain_token": tok.decode([plain[pos]]), "method_token": tok.decode([other[pos]])}
    scored = llm.generate([TokensPrompt(prompt_token_ids=prompt + plain[:pos + 1])],
                          SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    out["one_forward_at_pos"] = top2(scored.prompt_logprobs[len(prompt) + pos])
    for cut in sorted({max(pos - d, 0) for d in (0, 4, 16)}, reverse=True):
        done = llm.generate([TokensPrompt(prompt_token_ids=prompt + plain[:cut])],
                            SamplingParams(temperature=0, max_tokens=pos - cut + 1, logprobs=2), use_tqdm=False)[0]
        out[f"prefill_to_{cut}_then_decode"] = top2(done.outputs[0].logprobs[-1])
    return out


def run_probes(cells: list[Path], bound: float, threads: int = 2) -> list[Path]:
    """Probe (:func:`probe`) every :func:`unresolved` mismatch of ``cells`` (one vLLM engine per target) that has no
    stored probe yet; each result is written beside its cell as ``probe_TARGET_RECORD_POSITION.json``. Returns the
    files written."""
    from transformers import AutoTokenizer
    from vllm import LLM

    from ooospec.eval.bench.data import load_examples, prompt_ids_of
    from ooospec.runtime.backends.hardware import vllm_cpu_env
    from ooospec.runtime.backends.quantize import target_folder
    from ooospec.runtime.formats import detect_format
    from ooospec.runtime.paths import resolve_benchmark

    vllm_cpu_env(threads, kvcache_gb=2, multiprocessing=False)
    todo: dict[str, list[tuple[Path, dict, str, int, str]]] = {}
    for path in cells:
        cell = json.loads(path.read_text())
        for rid, pos, method in unresolved(cell, bound):
            out = path.with_name(f"probe_{Path(cell['target']).name}_{rid.rsplit('/', 1)[-1]}_{pos}.json")
            if not out.exists():
                todo.setdefault(cell["target"], []).append((out, cell, rid, pos, method))
    written = []
    for target, items in todo.items():
        model = str(target_folder(target, (items[0][1]["env"].get("quantization") or {}).get("scheme")))
        tok = AutoTokenizer.from_pretrained(model)
        fmt = detect_format(tok)
        llm = LLM(model=model, tokenizer=model, dtype=items[0][1]["env"]["dtype"], max_model_len=4096,
                  enable_prefix_caching=False, max_num_seqs=1, seed=0)
        for out, cell, rid, pos, method in items:
            rows = {(e["method"], e["record_id"]): e for e in cell["examples"]}
            record = next(r for r in load_examples(resolve_benchmark(cell["dataset"], None)) if r["id"] == rid)
            result = probe(llm, tok, prompt_ids_of(record, tok, fmt), rows[("vllm", rid)]["tokens"],
                           rows[(method, rid)]["tokens"], pos)
            out.write_text(json.dumps({"record": rid, "method": method, "result": result}, indent=1,
                                      ensure_ascii=False))
            stored = json.loads(out.read_text())
            how = probe_near_tie(stored, bound)
            print(f"{out}: {how or 'no flip'}" + f" (plain leads by {probe_margin(stored)})" * (how != "probe"))
            written.append(out)
        del llm
    return written


def engine_flip(probe: dict) -> tuple[str, int] | None:
    """``(record, position)`` when a mismatch probe (:func:`probe`'s result, as stored: ``{"record": ...,
    "result": {...}}``) shows the engine with no drafter picking the drafting method's token at that position in
    one of its batchings -- the engine's shape numerics chose, not the drafter; None otherwise."""
    r = probe["result"]
    picks = [max(v, key=v.get) for k, v in r.items() if isinstance(v, dict) and v]
    return (probe["record"], r["position"]) if r["method_token"] in picks else None


def probe_margin(probe: dict) -> float | None:
    """How far plain's token leads the drafted one at the probed position: the largest lead over the ways of
    :func:`probe` that scored both tokens (their top 2), None where none did. This is plain's margin there, measured
    along plain's own path -- what the near-tie rule reads -- where plain's logprob re-run took another path before
    the position and so could not measure it."""
    r = probe["result"]
    leads = [v[r["plain_token"]] - v[r["method_token"]] for v in r.values()
             if isinstance(v, dict) and r["plain_token"] in v and r["method_token"] in v]
    return max(leads) if leads else None


def probe_near_tie(probe: dict, bound: float) -> str | None:
    """Why a probed mismatch is a near tie: ``"probe"`` when the engine alone picks the drafted token in one of the
    probe's ways (:func:`engine_flip`), ``"probe margin"`` when plain's lead over it (:func:`probe_margin`) is within
    ``bound`` in every way that scored both; None otherwise (a defect)."""
    if engine_flip(probe):
        return "probe"
    lead = probe_margin(probe)
    return "probe margin" if lead is not None and lead <= bound else None


def same_token(cell: dict, row: dict, probed_method: str | None, position: int) -> bool:
    """Whether ``row`` left plain with the token the probed method did (a probe is stored per record and position, on
    the first method that parted there); True where either row lacks its tokens."""
    other = next((r for r in cell["examples"] if r["method"] == probed_method
                  and r["record_id"] == row["record_id"]), None)
    if other is None or "tokens" not in row or "tokens" not in other:
        return True
    return row["tokens"][position:position + 1] == other["tokens"][position:position + 1]


KIND_COUNTS = {"near_tie": "near_ties", "defect": "defects", "unclassified": "unclassified"}   # a method's counts


def reclassify(cell: dict, bound: float, source: str, flips: dict | None = None) -> dict:
    """``cell`` (a vllm-bench results JSON) with every mismatch's kind against ``bound`` and each method's
    ``near_ties`` / ``defects`` counted again; ``env.tie_margin`` records the bound and where it came from.
    ``flips``: ``{(record, position): (probed method, "probe" | "probe margin")}``, the mismatches a probe made near
    ties (:func:`probe_near_tie`): a row there that left plain with the probed method's token is a near tie whatever
    its recorded margin (``"by"`` says which probe rule); an ``unclassified`` one (no margin) no probe resolved stays
    so."""
    flips = flips or {}
    counts: dict[str, dict[str, int]] = {}
    for row in cell["examples"]:
        m = row.get("mismatch")
        c = counts.setdefault(row["method"], {"near_ties": 0, "defects": 0, "unclassified": 0})
        if m is None:
            continue
        m.pop("by", None)
        key = (row["record_id"], m.get("position"))
        if key in flips and same_token(cell, row, flips[key][0], m["position"]):
            m.update(kind="near_tie", by=flips[key][1])
        elif m.get("kind") != "unclassified":        # unclassified (no margin) and no probe: stays so
            m["kind"] = "near_tie" if m.get("margin") is not None and m["margin"] <= bound else "defect"
        c[KIND_COUNTS[m["kind"]]] += 1
    for method, c in counts.items():
        if method in cell["methods"]:
            cell["methods"][method].update(c)
    records = {row["record_id"] for row in cell["examples"]}
    mine = [k for k in flips if k[0] in records]         # a target's probes cover all its cells: this cell's only
    by_margin = sorted(list(k) for k in mine if flips[k][1] == "probe margin")
    by_flip = sorted(list(k) for k in mine if flips[k][1] == "probe")
    cell["env"]["tie_margin"] = {"value": round(bound, 4), "from": source,
                                 **({"engine_flips": by_flip} if by_flip else {}),
                                 **({"probe_margins": by_margin} if by_margin else {})}
    return cell


def run_measure(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer
    from vllm import LLM

    from ooospec.eval.bench.data import load_examples, prompt_ids_of
    from ooospec.eval.vllm.runs import environment
    from ooospec.runtime.backends.hardware import vllm_cpu_env
    from ooospec.runtime.backends.quantize import target_folder
    from ooospec.runtime.formats import detect_format
    from ooospec.runtime.paths import resolve_benchmark

    vllm_cpu_env(args.threads, kvcache_gb=2, multiprocessing=False)
    args.model_dir = str(target_folder(args.target, args.quantized))
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    fmt = detect_format(tokenizer)
    records = load_examples(resolve_benchmark(args.dataset, None))[args.skip:args.skip + args.limit]
    prompts = [prompt_ids_of(r, tokenizer, fmt) for r in records]
    llm = LLM(model=args.model_dir, tokenizer=args.model_dir, dtype=args.dtype, max_model_len=4096,
              enable_prefix_caching=False, seed=0, max_num_seqs=1)
    stats = summarize(measure(llm, prompts, args.max_new_tokens))
    args.k, args.chain_cost_slope = None, None       # no drafting here
    out = {"target": args.target, "quantized": args.quantized, "dataset": args.dataset, "skip": args.skip,
           "requests": len(prompts),
           **stats, "env": environment(args)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".partial")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(args.out)
    print(json.dumps({k: v for k, v in out.items() if k != "env"}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooospec.eval.vllm.numerics", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="registry name (measure)")
    p.add_argument("--quantized", default=None, help="the cached quantized checkpoint's scheme (measure)")
    p.add_argument("--dataset", default="bfcl-simple-python")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--skip", type=int, default=30,
                   help="requests skipped first (by id): the bench cells' first 30, so the bound is not fit on them")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="auto", type=vllm_dtype, help="the target's dtype in vLLM (auto: see "
                   "ooospec.runtime.backends.hardware.vllm_dtype)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="the numerics JSON (measure)")
    p.add_argument("--reclassify", type=Path, nargs="*", default=[], help="vllm-bench cell JSONs to count again")
    p.add_argument("--bound-from", type=Path, help="the numerics JSON whose bound --reclassify applies")
    p.add_argument("--probe", type=Path, nargs="*", default=[],
                   help="stored mismatch probes (probe_*.json): where one shows the engine alone picking the drafted "
                        "token, that mismatch is a near tie")
    p.add_argument("--probe-cells", type=Path, nargs="*", default=[],
                   help="(needs vLLM) probe every mismatch of these cells that --bound-from's bound leaves a defect "
                        "or unknown, writing probe_*.json beside each cell")
    args = p.parse_args(argv)
    if args.probe_cells:
        if args.bound_from is None:
            p.error("--probe-cells needs --bound-from NUMERICS.json")
        run_probes(args.probe_cells, json.loads(args.bound_from.read_text())["bound"], args.threads)
        return 0
    if args.reclassify:
        if args.bound_from is None:
            p.error("--reclassify needs --bound-from NUMERICS.json")
        bound = json.loads(args.bound_from.read_text())["bound"]
        flips = {}
        for stored in (json.loads(p.read_text()) for p in args.probe):
            if how := probe_near_tie(stored, bound):
                flips[(stored["record"], stored["result"]["position"])] = (stored.get("method"), how)
        from ooospec.eval.vllm.report import render_table

        for path in args.reclassify:
            cell = reclassify(json.loads(path.read_text()), bound, str(args.bound_from), flips)
            tmp = path.with_name(path.name + ".partial")
            tmp.write_text(json.dumps(cell, indent=1))
            tmp.replace(path)
            # the cell's own table, as vllm-bench wrote it: CELL.md, or CELL.json.md for a cell written via .partial
            for table in {path.with_suffix(".md"), path.with_name(path.name + ".md")}:
                if table.exists():
                    table.write_text(render_table(cell) + "\n", encoding="utf-8")
            print(f"{path}: bound {bound:.3f}: " + ", ".join(
                f"{m} {s['near_ties']} near ties / {s['defects']} defects" for m, s in cell["methods"].items()
                if "near_ties" in s and m != "vllm"))
        return 0
    if not (args.target and args.out):
        p.error("measuring needs --target and --out")
    return run_measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
