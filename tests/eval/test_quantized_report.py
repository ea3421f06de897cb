"""The quantized-target table from a folder shaped as eval/vllm/cpu_quantized.sh leaves it."""

from __future__ import annotations

import json

import pytest

from ooospec.eval.substrate import quantized as quantized_report

CALL = {"name": "f", "arguments": {"x": 1}}
GOOD = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def _cell(scheme, mean, spec_mean, text):
    env = {"cpu": {"model": "Test CPU", "cores": 2, "flags": ["avx2"]}, "vllm": "0.32.0", "threads": 2,
           "dtype": "bfloat16", "warm_tools": True, "max_new_tokens": 128,
           "quantization": {"scheme": scheme} if scheme != "bf16" else None}
    methods = {"vllm": {"n": 2, "mean_s": mean},
               "toolspec": {"n": 2, "mean_s": spec_mean, "speedup": mean / spec_mean, "vs_llamacpp": 3.0 / spec_mean,
                            "mat": 4.0, "exact_rate": 1.0, "near_ties": 0, "defects": 0},
               "llama.cpp": {"mean_s": 3.0}}
    examples = [{"method": "vllm", "record_id": rid, "text": text} for rid in ("a", "b")]
    return {"target": "/cache/qwen", "dataset": "bench", "methods": methods, "examples": examples, "env": env}


def _benchmark_dir(tmp_path):
    """A benchmark ``bench`` of two records, ``a`` and ``b``, whose gold is :data:`CALL`."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "bench.jsonl").write_text("".join(json.dumps(
        {"id": rid, "source": "s", "split": "test", "messages": [{"role": "user", "content": "hi"}],
         "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
         "calls": [CALL]}) + "\n" for rid in ("a", "b")))
    return bench


def test_formats_table(tmp_path):
    bench = _benchmark_dir(tmp_path)
    folder = tmp_path / "cpu"
    for scheme, mean, spec, text in (("bf16", 4.0, 2.0, GOOD), ("w8a8", 3.0, 1.0, "no call")):
        (folder / scheme).mkdir(parents=True)
        (folder / scheme / "qwen_bench.json").write_text(json.dumps(_cell(scheme, mean, spec, text)))
    (folder / "qwen_bench.llamacpp.json").write_text(json.dumps({"examples": [
        {"method": "llama.cpp", "id": rid, "time_s": 3.0, "text": GOOD} for rid in ("a", "b")]}))
    text = quantized_report.render(folder, bench)
    lines = [line for line in text.splitlines() if line.startswith("| qwen")]
    assert [line.split(" | ")[2] for line in lines] == ["Q4_K_M GGUF (llama.cpp greedy)", "bfloat16", "w8a8"]
    assert "| **1.50x** | 2.00x |" in lines[1] and "| **3.00x** | 3.00x |" in lines[2]
    assert lines[0].endswith("| 100% | 100% | 100% |") and lines[2].endswith("| 0% | 0% | 0% |")
    assert "Test CPU" in text and "toolbox warm" in text


def test_a_cell_with_its_own_kv_block_size_says_so(tmp_path):
    """``BLOCK_SIZE=32 bash eval/vllm/cpu_quantized.sh``: the cells sit in ``<format>-b32/`` beside the default
    blocks' cells, and their row names the block size (the prefix cache serves whole blocks)."""
    bench = _benchmark_dir(tmp_path)
    folder = tmp_path / "cpu"
    for sub, block in (("w8a8", None), ("w8a8-b32", 32)):
        cell = _cell("w8a8", 3.0, 1.0, GOOD)
        cell["env"]["block_size"] = block
        (folder / sub).mkdir(parents=True)
        (folder / sub / "qwen_bench.json").write_text(json.dumps(cell))
    lines = [x for x in quantized_report.render(folder, bench).splitlines() if x.startswith("| qwen")]
    assert [line.split(" | ")[2] for line in lines] == ["w8a8", "w8a8, 32-token KV blocks"]


def test_a_plain_only_cell_keeps_its_quality_row(tmp_path):
    bench = _benchmark_dir(tmp_path)
    cell = _cell("bf16", 4.0, 2.0, GOOD)
    del cell["methods"]["toolspec"]
    (tmp_path / "cpu" / "bf16").mkdir(parents=True)
    (tmp_path / "cpu" / "bf16" / "qwen_bench.json").write_text(json.dumps(cell))
    [line] = [x for x in quantized_report.render(tmp_path / "cpu", bench).splitlines() if x.startswith("| qwen")]
    assert line == "| qwen | bench | bfloat16 | 2 | 3.000 | 4.000 | - | - | - | - | - | 100% | 100% | 100% |"


def test_the_bindings_prompt_lookup_gets_its_own_row(tmp_path):
    bench = _benchmark_dir(tmp_path)
    (tmp_path / "cpu" / "bf16").mkdir(parents=True)
    (tmp_path / "cpu" / "bf16" / "qwen_bench.json").write_text(json.dumps(_cell("bf16", 4.0, 2.0, GOOD)))
    greedy = [{"method": "llama.cpp", "id": rid, "time_s": 3.0, "text": GOOD, "tokens": [1, 2]} for rid in "ab"]
    pld = [{"method": "llama.cpp-pld", "id": "a", "time_s": 1.0, "text": GOOD, "tokens": [1, 2]},
           {"method": "llama.cpp-pld", "id": "b", "time_s": 2.0, "text": "no call", "tokens": [1, 3]}]
    (tmp_path / "cpu" / "qwen_bench.llamacpp.json").write_text(json.dumps(
        {"examples": greedy + pld, "methods": {"llama.cpp": {"mean_s": 3.0}, "llama.cpp-pld": {"mat": 1.75}}}))
    lines = [x for x in quantized_report.render(tmp_path / "cpu", bench).splitlines() if x.startswith("| qwen")]
    assert [line.split(" | ")[2] for line in lines] == [
        "Q4_K_M GGUF (llama.cpp greedy)", "Q4_K_M GGUF (llama.cpp prompt lookup)", "bfloat16"]
    assert lines[1] == ("| qwen | bench | Q4_K_M GGUF (llama.cpp prompt lookup) | 2 | 3.000 |  | 1.500 | - | 2.00x | "
                        "1.75 | 1/2 identical to greedy | 50% | 50% | 50% |")


def test_toolspec_on_the_llamacpp_backend_gets_its_own_row(tmp_path):
    bench = _benchmark_dir(tmp_path)
    greedy = [{"method": "llama.cpp", "id": rid, "time_s": 3.0, "text": GOOD, "tokens": [1, 2]} for rid in "ab"]
    ours = [{"method": "ar", "id": rid, "time_s": 3.2, "text": GOOD, "tokens": [1, 2]} for rid in "ab"]
    spec = [{"method": "toolspec", "id": rid, "time_s": t, "text": GOOD, "tokens": [1, 2]} for rid, t in
            (("a", 1.0), ("b", 1.0))]
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "qwen_bench.llamacpp.json").write_text(json.dumps(
        {"examples": greedy + ours + spec, "methods": {"llama.cpp": {"mean_s": 3.0}, "ar": {"mean_s": 3.2},
                                                      "toolspec": {"mat": 3.5, "exact_rate": 0.5, "near_ties": 1,
                                                                   "defects": 0}}}))
    rows = quantized_report.llamacpp_rows(tmp_path / "cpu" / "qwen_bench.llamacpp.json", "qwen", "bench",
                                          quantized_report.gold_calls("bench", bench))
    assert len(rows) == 2 and rows[1][2].startswith("Q4_K_M GGUF (toolspec on ooo-spec's llama.cpp backend")
    assert rows[1][3:11] == [2, "3.000", "3.200", "1.000", "**3.00x**", "3.20x", "3.50", "1/2 / 1 / 0"]


def test_a_folder_of_llamacpp_cells_only_renders(tmp_path):
    """A folder holding only ``ooospec bench`` llama.cpp cells (a pricing rerun, no vLLM cells) gets its table,
    one llama.cpp block per cell; an empty folder is a clear error."""
    bench = _benchmark_dir(tmp_path)
    folder = tmp_path / "cpu"
    folder.mkdir()
    greedy = [{"method": "llama.cpp", "id": rid, "time_s": 3.0, "text": GOOD, "tokens": [1, 2]} for rid in "ab"]
    ours = [{"method": "ar", "id": rid, "time_s": 3.2, "text": GOOD, "tokens": [1, 2]} for rid in "ab"]
    spec = [{"method": "toolspec", "id": rid, "time_s": 2.0, "text": GOOD, "tokens": [1, 2]} for rid in "ab"]
    cell = {"examples": greedy + ours + spec,
            "methods": {"llama.cpp": {"mean_s": 3.0}, "ar": {"mean_s": 3.2},
                        "toolspec": {"mat": 2.0, "exact_rate": 1.0, "near_ties": 0, "defects": 0}},
            "env": {"cpu": "Test CPU", "cpu_count": 2, "cpu_flags": ["avx2", "fma"], "threads": 2,
                    "llama_cpp": "0.3.36"},
            "config": {"warm_tools": True, "max_new_tokens": 128}}
    (folder / "qwen-small_bench.llamacpp.json").write_text(json.dumps(cell))
    text = quantized_report.render(folder, bench)
    assert text.startswith("CPU: Test CPU, 2 cores, flags avx2 fma; llama.cpp (llama-cpp-python 0.3.36)")
    assert "| qwen-small | bench | Q4_K_M GGUF (llama.cpp greedy) |" in text and "**1.50x**" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match=r"no \*\.llamacpp\.json cells"):
        quantized_report.render(empty, bench)
