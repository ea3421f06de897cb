"""The substrate report: what one target forward costs on each backend and weight format, next to llama.cpp.

    python -m ooospec.eval.substrate --target qwen2.5-coder-0.5b --formats registry,Q8_0,Q4_0 \\
        --threads 2 --out eval/reports/substrate/qwen2.5-coder-0.5b.json

Per GGUF (the registry's file, and llama.cpp requantizations of it made with ``llama_model_quantize``, cached
next to it), on the llama.cpp backend:

* ``T(n)``: seconds of one verification forward of ``n`` tree nodes (logits for every node) on a 400-token
  context, n = 1, 2, 4, 8, 16, 32; the fastest of ``--repeats``.
* prefill tokens/s of a 400-token prompt; decode tokens/s of 64 greedy tokens, for our engine (``ar``: one-token
  trees through :class:`~ooospec.runtime.backends.llamacpp_kv.LlamaCppKV`) and for llama-cpp-python's stock
  ``Llama.generate`` (the peer users run), same file, same threads, alternating, median of ``--repeats``.
* batch-shape numerics (:func:`ooospec.runtime.backends.llamacpp.batch_shape_diff` on a 400-token prompt): 16 tokens
scored
  in one forward vs one at a time on the same cache; the largest absolute logit difference and whether any argmax
  differs. llama.cpp's kernels depend on the batch size, so a token verified inside a tree can get other logits
  than the same token decoded alone; the engine's tie margin (:data:`ooospec.runtime.backends.llamacpp.TIE_MARGIN`, or
  twice this difference) has to cover it.

Everything runs in this process, one measurement at a time; start it on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from ooospec.reporting import md_table
from ooospec.runtime.tree import chain_tree

SIZES = (1, 2, 4, 8, 16, 32)
CONTEXT = 400
DECODE = 64
FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15, "Q5_0": 8, "F16": 1}


@contextlib.contextmanager
def _quiet_fd(fd: int = 2):
    """llama.cpp's quantizer prints every tensor on the C stdio streams: silence them for the call."""
    saved = os.dup(fd)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)


def requantized(src: Path, fmt: str) -> Path:
    """``src`` requantized to ``fmt`` by llama.cpp (``allow_requantize``), cached as ``<stem>.<fmt>.gguf``."""
    import llama_cpp

    dst = src.with_name(f"{src.stem}.{fmt}.gguf")
    if dst.is_file():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[fmt]
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    tmp = dst.with_name(dst.name + ".partial")
    with _quiet_fd(1), _quiet_fd(2):
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {fmt} failed ({rc})")
    tmp.replace(dst)
    return dst


def forward_times(target, prompt: list[int], repeats: int, rng: random.Random,
                  sizes: tuple[int, ...] = SIZES) -> dict[int, float]:
    """``{n: ms}``: the fastest of ``repeats`` timed forwards of an ``n``-node chain on top of ``prompt`` (after one
    untimed round), interleaved across ``sizes``."""
    vocab = min(target.vocab_size, 32000)
    kv = target.new_kv_cache()
    kv.reset()
    kv.prefill(prompt)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats + 1):
        for n in sizes:
            tree = chain_tree([rng.randrange(100, vocab) for _ in range(n)])
            t0 = time.perf_counter()
            kv.forward_tree(tree).argmax(dim=-1)
            times[n].append(time.perf_counter() - t0)
            kv.commit([])
    return {n: round(1000 * min(ts[1:]), 2) for n, ts in times.items()}


def prefill_and_decode(target, gguf: Path, threads: int, prompt: list[int], repeats: int) -> dict:
    """Prefill and decode tokens/s, ours (the engine's ``ar``: one-token trees) vs the stock bindings, alternating;
    medians of ``repeats``."""
    from ooospec.eval.bench.llamacpp_peers import LlamaCppPeer
    from ooospec.runtime.decoding import build_engine
    from ooospec.runtime.methods import BASELINE

    peer = LlamaCppPeer(gguf, threads=threads, n_ctx=2048)
    ours_pf, ours_dec, peer_pf, peer_dec = [], [], [], []

    class _Ctx:   # what LlamaCppPeer reads of a BenchContext
        eos_token_ids: tuple[int, ...] = ()
        max_new_tokens = DECODE

        @staticmethod
        def stop(_):
            return False

    engine = build_engine(BASELINE, target)
    for _ in range(repeats):
        r = engine.generate(prompt, DECODE)
        ours_pf.append(CONTEXT / r.prefill_s)
        ours_dec.append(len(r.tokens) / r.decode_s)
        p = peer(prompt, _Ctx())
        peer_pf.append(CONTEXT / p.prefill_s)
        peer_dec.append((len(p.tokens) - 1) / p.decode_s)   # its first token comes with the prefill
    peer.close()
    return {"prefill_tok_s": {"ours": statistics.median(ours_pf), "llama.cpp": statistics.median(peer_pf)},
            "decode_tok_s": {"ours": statistics.median(ours_dec), "llama.cpp": statistics.median(peer_dec)}}


def measure_file(gguf: Path, threads: int, repeats: int, seed: int = 0, forward_only: bool = False,
                 sizes: tuple[int, ...] = SIZES) -> dict:
    """One row of the report: forward times, batch-shape numerics, and prefill / decode next to llama.cpp
    (``forward_only``: the forward times alone)."""
    from ooospec.runtime.backends.llamacpp import LlamaCppTarget, batch_shape_diff

    target = LlamaCppTarget(gguf, threads=threads, n_ctx=2048)
    rng = random.Random(seed)
    vocab = min(target.vocab_size, 32000)
    prompt = [rng.randrange(100, vocab) for _ in range(CONTEXT)]
    out: dict = {"file": gguf.name, "weights": target.weight_type, "bytes": gguf.stat().st_size}
    out["T_ms"] = forward_times(target, prompt, repeats, rng, sizes)
    if forward_only:
        target.close()
        return out
    # 16 tokens (the model's own continuation) in one forward vs one at a time, on a CONTEXT-token prompt
    out["batch_vs_single"] = dataclasses.asdict(batch_shape_diff(target, context=CONTEXT, chain=16, seed=seed))
    out.update(prefill_and_decode(target, gguf, threads, prompt, repeats))
    target.close()
    out["decode_vs_llamacpp"] = out["decode_tok_s"]["ours"] / out["decode_tok_s"]["llama.cpp"]
    return out


def markdown(rows: list[dict]) -> str:
    head = ["file", "weights", "T(1) ms", *(f"T({n})/T(1)" for n in SIZES[1:]), "prefill tok/s (ours / llama.cpp)",
            "decode tok/s (ours / llama.cpp)", "ours / llama.cpp decode", "batch-vs-single max logit diff"]
    table = []
    for r in rows:
        t = r["T_ms"]
        t1 = t[1] if 1 in t else t["1"]
        rel = [f"{t[n] / t1:.2f}" if n in t else f"{t[str(n)] / t1:.2f}" if str(n) in t else "-" for n in SIZES[1:]]
        flips = " (argmax flips)" if r["batch_vs_single"]["argmax_differs"] else ""
        table.append([r["file"], r["weights"], f"{t1:.1f}", *rel,
                      f"{r['prefill_tok_s']['ours']:.0f} / {r['prefill_tok_s']['llama.cpp']:.0f}",
                      f"{r['decode_tok_s']['ours']:.1f} / {r['decode_tok_s']['llama.cpp']:.1f}",
                      f"{r['decode_vs_llamacpp']:.2f}x",
                      f"{r['batch_vs_single']['max_abs_logit_diff']:.3f}{flips}"])
    return md_table(head, table, align="l" * len(head)) + "\n"


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; ``"every"`` -> the llama.cpp target's ``cost_sizes``."""
    if text == "every":
        from ooospec.runtime.backends.llamacpp import LlamaCppTarget

        return tuple(LlamaCppTarget.cost_sizes)
    try:
        sizes = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated integers or 'every', got {text!r}") from None
    if not sizes or sizes[0] != 1:
        raise argparse.ArgumentTypeError(f"sizes must include 1 (T(1) is the unit), got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    from ooospec.runtime.backends import hardware
    from ooospec.runtime.backends.models import gguf_path_of

    p = argparse.ArgumentParser(prog="python -m ooospec.eval.substrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="registry name or .gguf file")
    p.add_argument("--formats", default="registry", help="comma-separated: registry (the file as shipped) and/or "
                                                          f"requantizations from {sorted(FTYPES)}")
    p.add_argument("--threads", default="auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--forward-only", action="store_true",
                   help="only T(n) (the roofline table's input), no numerics or prefill / decode rows")
    p.add_argument("--out", type=Path, required=True, help="results JSON (a .md table is written beside it)")
    p.add_argument("--sizes", type=parse_sizes, default=SIZES,
                   help="query lengths timed: comma-separated, or 'every' (each size up to 16, then 24, 32, 64: "
                        "the sizes the engine's cost model times on llama.cpp, whose T(n) is step-shaped)")
    p.add_argument("--cache", default=None)
    args = p.parse_args(argv)
    threads = hardware.resolve_threads(args.threads)[0]
    src = gguf_path_of(args.target, args.cache)
    rows = []
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        path = src if fmt == "registry" else requantized(src, fmt)
        print(f"measuring {path.name} ({threads} threads) ...", file=sys.stderr, flush=True)
        rows.append(measure_file(path, threads, args.repeats, forward_only=args.forward_only, sizes=args.sizes))
    info = hardware.cpu_info()
    result = {"target": args.target, "threads": threads, "cpu": info["model"], "cpu_flags": info["flags"],
              "context": CONTEXT, "decode_tokens": DECODE, "rows": rows,
              "command": "python -m ooospec.eval.substrate " + " ".join(sys.argv[1:] if argv is None else argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)
    table = (f"{args.target}, {threads} threads, {info['model']} ({' '.join(info['flags'])}); "
             f"T(n) on a {CONTEXT}-token context; regenerate: `{result['command']}`\n\n"
             + (json.dumps({r["file"]: r["T_ms"] for r in rows}) if args.forward_only else markdown(rows)))
    args.out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
