"""The quantized-target table: per target, benchmark and weight format, vLLM plain and ``toolspec`` against llama.cpp's
greedy on the registry GGUF, with each format's own tool-call quality.

    python -m ooospec.eval.substrate.quantized eval/reports/cpu/quantized/<cpu>

reads what ``bash eval/vllm/cpu_quantized.sh`` leaves in that folder -- ``<format>/<target>_<bench>.json``
(``ooospec vllm-bench``, one folder per weight format) and ``<target>_<bench>.llamacpp.json`` (``ooospec bench``
with llama.cpp) -- and writes ``formats.md``. ``toolspec x llama.cpp`` is llama.cpp's mean seconds over toolspec's on
the same requests; ``identical`` compares toolspec with vLLM plain on the SAME weights (a drafter cannot change the
text). Where the llama.cpp cell also ran the bindings' own speculation (``llama.cpp-pld``, prompt lookup), it gets a
row of its own: its seconds in the drafted column, ``x plain`` against llama.cpp greedy, ``identical`` against
llama.cpp greedy's tokens on the same request. Quality
(:mod:`ooospec.eval.substrate.call_quality`) scores each format's plain greedy output against the gold calls.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ooospec.eval.substrate.call_quality import gold_calls, quality, rows_of
from ooospec.reporting import md_table

HEAD = ["target", "benchmark", "weights", "n", "llama.cpp s", "vLLM plain s", "toolspec s", "toolspec x llama.cpp",
        "toolspec x plain", "#MAT", "identical / near ties / defects", "function", "arguments", "whole call"]
PLD = "llama.cpp-pld"
TOOLSPEC = "toolspec"


def _quality_cells(rows: list[dict], gold: dict) -> list[str]:
    q = quality(rows, gold)
    return [f"{q['function']:.0%}", f"{q['arguments']:.0%}" if q["arguments"] is not None else "-", f"{q['call']:.0%}"]


def cells(folder: Path) -> list[tuple[str, str, str, dict]]:
    """``(format, target, benchmark, results)`` of every vllm-bench result under ``folder/<format>/``."""
    out = []
    for path in sorted(folder.glob("*/*.json")):
        if path.name.endswith(".llamacpp.json") or path.parent.name.startswith("load"):
            continue
        data = json.loads(path.read_text())
        if "methods" in data and "env" in data:
            out.append((path.parent.name, Path(data["target"]).name, data["dataset"], data))
    return out


def _mean_s(rows: list[dict]) -> float:
    return sum(r["time_s"] for r in rows) / len(rows)


def llamacpp_rows(path: Path, target: str, bench: str, gold: dict) -> list[list]:
    """The llama.cpp cell's rows: its greedy, its prompt-lookup speculation where the cell ran it (against greedy on
    the same requests: seconds ratio, identical tokens, mean tokens per forward), and ``toolspec`` on ooo-spec's own
    llama.cpp backend where it ran (against llama.cpp greedy's seconds; identical / near ties / defects against
    ooo-spec's greedy ``ar`` on that backend, the bench's own classification)."""
    greedy = rows_of(path, "llama.cpp")
    base = _mean_s(greedy)
    out = [[target, bench, "Q4_K_M GGUF (llama.cpp greedy)", len(greedy), f"{base:.3f}", "", "", "", "",
            "", "", *_quality_cells(greedy, gold)]]
    methods = json.loads(path.read_text()).get("methods", {})
    if PLD in methods:
        pld = rows_of(path, PLD)
        ref = {r["id"]: r["tokens"] for r in greedy}
        same, mat = sum(r["tokens"] == ref.get(r["id"]) for r in pld), methods[PLD]["mat"]
        out.append([target, bench, "Q4_K_M GGUF (llama.cpp prompt lookup)", len(pld), f"{base:.3f}", "",
                    f"{_mean_s(pld):.3f}", "-", f"{base / _mean_s(pld):.2f}x", f"{mat:.2f}",
                    f"{same}/{len(pld)} identical to greedy", *_quality_cells(pld, gold)])
    if TOOLSPEC in methods and "ar" in methods:
        spec, s = rows_of(path, TOOLSPEC), methods[TOOLSPEC]
        mean = _mean_s(spec)
        out.append([target, bench, "Q4_K_M GGUF (toolspec on ooo-spec's llama.cpp backend; x plain: its greedy)",
                    len(spec), f"{base:.3f}", f"{_mean_s(rows_of(path, 'ar')):.3f}", f"{mean:.3f}",
                    f"**{base / mean:.2f}x**", f"{_mean_s(rows_of(path, 'ar')) / mean:.2f}x", f"{s['mat']:.2f}",
                    f"{round(s['exact_rate'] * len(spec))}/{len(spec)} / {s['near_ties']} / {s['defects']}",
                    *_quality_cells(spec, gold)])
    return out


def rows(folder: Path, benchmark_dir: Path | None = None) -> list[list]:
    table, golds, llama_done = [], {}, set()
    dense_first = lambda c: (c[1], c[2], c[0] not in ("bf16", "fp32"), c[0])      # per target and benchmark
    for fmt, target, bench, data in sorted(cells(folder), key=dense_first):
        gold = golds.setdefault(bench, gold_calls(bench, benchmark_dir))
        llama_path = folder / f"{target}_{bench}.llamacpp.json"
        if (target, bench) not in llama_done and llama_path.is_file():
            llama_done.add((target, bench))
            table += llamacpp_rows(llama_path, target, bench, gold)
        m = data["methods"]
        plain, spec = m["vllm"], m.get("toolspec")
        q = data["env"].get("quantization")
        llama_s = m.get("llama.cpp", {}).get("mean_s")
        timing = ["-"] * 5 if spec is None else [
            f"{spec['mean_s']:.3f}", f"**{spec['vs_llamacpp']:.2f}x**" if "vs_llamacpp" in spec else "-",
            f"{spec['speedup']:.2f}x", f"{spec['mat']:.2f}",
            f"{round(spec['exact_rate'] * spec['n'])}/{spec['n']} / {spec['near_ties']} / {spec['defects']}"]
        weights = (q["scheme"] if q else data["env"]["dtype"]) + (
            f", {data['env']['block_size']}-token KV blocks" if data["env"].get("block_size") else "")
        table.append([target, bench, weights, plain["n"],
                      f"{llama_s:.3f}" if llama_s else "-", f"{plain['mean_s']:.3f}", *timing,
                      *_quality_cells(rows_of_results(data, "vllm"), gold)])
    for path in sorted(folder.glob("*.llamacpp.json")):           # llama.cpp cells without a vLLM cell beside them
        target, bench = path.name[:-len(".llamacpp.json")].rsplit("_", 1)
        if (target, bench) not in llama_done:
            table += llamacpp_rows(path, target, bench, golds.setdefault(bench, gold_calls(bench, benchmark_dir)))
    return table


def rows_of_results(data: dict, method: str) -> list[dict]:
    return [r for r in data["examples"] if r.get("method") == method]


def render(folder: Path, benchmark_dir: Path | None = None) -> str:
    found, llama = cells(folder), sorted(folder.glob("*.llamacpp.json"))
    if not found and not llama:
        raise SystemExit(f"{folder}: no vllm-bench results in <format>/ subfolders and no *.llamacpp.json cells")
    regenerate = f"regenerate: `python -m ooospec.eval.substrate.quantized {folder}`"
    if found:
        env = found[0][3]["env"]
        cpu = env["cpu"]
        blocks = f", {env['block_size']}-token blocks" if env.get("block_size") else ""
        warm = f"toolbox warm (prefix caching on{blocks})" if env.get("warm_tools") else "cold"
        if len({c[3]["env"].get("block_size") for c in found}) > 1:
            warm += ", KV blocks of vLLM's default size (128 on the CPU) where a row names none"
        head = (f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {' '.join(cpu['flags'])}; vLLM {env['vllm']}, "
                f"{env['threads']} threads, batch 1, {warm}, up to {env.get('max_new_tokens')} new tokens; "
                + regenerate)
    else:                                                          # llama.cpp cells only (`ooospec bench`)
        data = json.loads(llama[0].read_text())
        env, config = data["env"], data["config"]
        warm = "toolbox warm" if config.get("warm_tools") else "cold"
        head = (f"CPU: {env['cpu']}, {env['cpu_count']} cores, flags {' '.join(env['cpu_flags'])}; llama.cpp "
                f"(llama-cpp-python {env.get('llama_cpp')}), {env['threads']} threads, {warm}, up to "
                f"{config.get('max_new_tokens')} new tokens; {regenerate}")
    return head + "\n\n" + md_table(HEAD, rows(folder, benchmark_dir), align="lllr" + "r" * (len(HEAD) - 4)) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ooospec.runtime.paths import BENCHMARK_DIR_FLAG

    p = argparse.ArgumentParser(prog="python -m ooospec.eval.substrate.quantized", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument(BENCHMARK_DIR_FLAG, type=Path, default=None)
    args = p.parse_args(argv)
    text = render(args.folder, args.benchmark_dir)
    (args.folder / "formats.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
