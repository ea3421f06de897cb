"""``ooospec vllm-bench`` / ``vllm-report`` without vLLM: engine settings per method, request data, exactness
classification, summaries, joining llama.cpp rows, --add, and the report table."""

from __future__ import annotations

import argparse
import json

import pytest

from ooospec.eval import bench_data, vllm_report, vllm_runs
from ooospec.eval import vllm_bench as vb


def test_each_method_gets_its_speculative_config():
    assert vllm_runs.speculative_config("vllm", 16, 8) is None
    assert vllm_runs.speculative_config("vllm-ngram", 16, 8)["method"] == "ngram"
    assert vllm_runs.speculative_config("vllm-ngram", 16, 8)["num_speculative_tokens"] == 8
    ours = vllm_runs.speculative_config("toolspec", 16, 8)
    assert ours == {"method": "custom_class", "model": vllm_runs.PROPOSER, "num_speculative_tokens": 16}
    assert vllm_runs.ooospec_options("toolspec", None, 0.02)["method"] == "toolspec"
    assert vllm_runs.ooospec_options("ooospec-oracle", "http://x:1", 0.0)["method"] == "ooospec"
    assert "sidecar_url" not in vllm_runs.ooospec_options("ooospec-oracle", "http://x:1", 0.0)
    assert vllm_runs.ooospec_options("ooospec", "http://x:1", 0.0)["sidecar_url"] == "http://x:1"


def test_the_proposer_class_path_resolves():
    import importlib

    module, name = vllm_runs.PROPOSER.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name).__name__ == name


def test_request_xargs_carry_tools_and_the_oracles_hint():
    record = {"id": "r1", "tools": [{"type": "function", "function": {"name": "f"}}],
              "messages": [{"role": "user", "content": "hi"}]}
    assert vllm_runs.request_xargs("vllm", record, None) == {}
    x = vllm_runs.request_xargs("toolspec", record, None)
    assert json.loads(x["ooospec_tools"]) == record["tools"] and "ooospec_hint" not in x
    assert vllm_runs.request_xargs("ooospec-oracle", record, "<tool_call>")["ooospec_hint"] == "<tool_call>"
    with pytest.raises(ValueError, match="needs the 'vllm' output"):
        vllm_runs.request_xargs("ooospec-oracle", record, None)


def _row(rid, method, tokens, time_s=1.0, accepted=0, drafts=0, **kw):
    return {"record_id": rid, "method": method, "prompt_len": 10, "time_s": time_s, "tokens": tokens, "text": "",
            "new_tokens": len(tokens), "accepted": accepted, "drafts": drafts, "draft_tokens": drafts * 4,
            "forwards": max(len(tokens) - accepted, 1), **kw}


def test_mismatches_are_near_ties_only_under_the_margin():
    ref = {"a": _row("a", "vllm", [1, 2, 3], margins=[5.0, 0.1, 4.0]),
           "b": _row("b", "vllm", [1, 2, 3], margins=[5.0, 3.0, 4.0]),
           "c": _row("c", "vllm", [1, 2, 3], margins=[5.0, 3.0, 4.0])}
    rows = [_row("a", "x", [1, 9, 3]), _row("b", "x", [1, 9]), _row("c", "x", [1, 2])]
    vb.compare(rows, ref, 0.25)
    assert rows[0]["mismatch"] == {"position": 1, "margin": 0.1, "kind": "near_tie"}
    assert rows[1]["mismatch"]["kind"] == "defect"          # a wide margin flipped: a defect
    assert rows[2]["mismatch"]["kind"] == "defect"          # stopped early: never a rounding effect
    same = [_row("a", "y", [1, 2, 3])]
    vb.compare(same, ref, 0.25)
    assert same[0]["exact"] and "mismatch" not in same[0]


def test_summary_counts_forwards_and_accepted_per_step():
    rows = [_row("a", "x", list(range(20)), time_s=1.0, accepted=15, drafts=4),
            _row("b", "x", list(range(10)), time_s=3.0, accepted=0, drafts=0)]
    for r in rows:
        r["exact"] = True
    s = vb.summarize(rows, ref_mean=4.0)
    assert s["mat"] == pytest.approx(30 / 15)                 # 30 tokens in 5 + 10 forwards
    assert s["accepted_per_step"] == pytest.approx(15 / 4)
    assert s["speedup"] == pytest.approx(2.0)
    assert s["exact_rate"] == 1.0 and s["defects"] == 0


def _results(tmp_path, with_llama: bool):
    llama = tmp_path / "l.json"
    llama.write_text(json.dumps({"examples": [{"id": "a", "method": "llama.cpp", "time_s": 2.0, "new_tokens": 3,
                                               "prompt_tokens": 10},
                                              {"id": "a", "method": "ar", "time_s": 9.0, "new_tokens": 3}]}))
    args = argparse.Namespace(target="t", dataset="d", threads=2, dtype="bfloat16", k=16, ngram_k=8,
                              max_model_len=4096, max_new_tokens=64, chain_cost_slope=0.02)
    rows = {"vllm": [_row("a", "vllm", [1, 2, 3], time_s=4.0)],
            "toolspec": [_row("a", "toolspec", [1, 2, 3], time_s=1.0, accepted=2, drafts=1)]}
    ref = {"a": rows["vllm"][0]}
    for method_rows in rows.values():
        vb.compare(method_rows, ref, 0.25)
    joined = vb.llamacpp_rows(llama, ["a"]) if with_llama else {}
    return vb.build_results(args, ["vllm", "toolspec"], rows, joined, "hermes")


def test_results_join_llamacpp_and_render(tmp_path):
    res = _results(tmp_path, with_llama=True)
    assert res["methods"]["toolspec"]["speedup"] == pytest.approx(4.0)
    assert res["methods"]["toolspec"]["vs_llamacpp"] == pytest.approx(2.0)
    assert res["methods"]["llama.cpp"]["mean_s"] == pytest.approx(2.0)
    table = vllm_report.render_table(res)
    assert "| toolspec | 1 |" in table and "2.00x" in table
    with pytest.raises(SystemExit, match="no llama.cpp row"):
        vb.llamacpp_rows(tmp_path / "l.json", ["a", "b"])


def test_add_reuses_the_earlier_reference_and_checks_the_requests(tmp_path):
    out = tmp_path / "cell.json"
    vb.write_results(out, _results(tmp_path, with_llama=False))
    assert (tmp_path / "cell.md").is_file()
    rows = vb.previous_rows(out, [{"id": "a"}], [list(range(10))])
    assert [r["method"] for r in rows["vllm"]] == ["vllm"] and "toolspec" in rows
    with pytest.raises(SystemExit, match="other requests"):
        vb.previous_rows(out, [{"id": "zzz"}], [list(range(10))])
    with pytest.raises(SystemExit, match="does not exist"):
        vb.previous_rows(tmp_path / "nope.json", [], [])


def test_report_table_over_cells(tmp_path):
    vb.write_results(tmp_path / "t_d.json", _results(tmp_path, with_llama=True))
    (tmp_path / "t_d.llamacpp.json").write_text("{}")          # the joined bench files are not cells
    text = vllm_report.render(tmp_path)
    assert "| t | d | 1 | 2.00 | 4.00 |  | toolspec | 1.00 | 4.00x |  | 2.00x |" in text
    with pytest.raises(SystemExit, match="no vllm-bench results"):
        vllm_report.render(tmp_path / "empty")


def test_report_names_each_row_s_caching_when_cold_and_warm_cells_mix_and_prices_against_toolspec(tmp_path):
    """A folder with a cold and a warm run of one cell: one row each, the caching in the benchmark label (the
    header says so); a method's ratio to the cell's ``toolspec`` (blank on toolspec's own row)."""
    cold = _results(tmp_path, with_llama=False)
    cold["methods"]["ooospec"] = {**cold["methods"]["toolspec"], "mean_s": 0.5}
    cold["order"] = cold["order"] + ["ooospec"]
    warm = json.loads(json.dumps(cold))
    warm["env"]["warm_tools"] = True
    vb.write_results(tmp_path / "t_d_warm.json", warm)
    vb.write_results(tmp_path / "t_d_cold.json", cold)
    text = vllm_report.render(tmp_path)
    assert "caching per row" in text.split("\n", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("| t |")]
    assert [line.split(" | ")[1] for line in lines] == ["d (prefix caching off)"] * 2 + \
        ["d (prefix caching on, toolbox warm)"] * 2
    assert [line.split(" | ")[11] for line in lines] == ["", "2.00x"] * 2     # vs toolspec
    vb.write_results(tmp_path / "t_d_cold.json", warm)                          # one caching: in the header only
    assert "(prefix caching" not in vllm_report.render(tmp_path).split("\n", 1)[1]


def test_a_reference_without_margins_leaves_mismatches_unclassified():
    ref = {"a": _row("a", "vllm", [1, 2, 3])}          # a served run: no logprobs kept
    rows = [_row("a", "x", [1, 9, 3])]
    vb.compare(rows, ref, 0.25)
    assert rows[0]["mismatch"]["kind"] == "unclassified"
    assert vb.summarize(rows, None)["unclassified"] == 1 and vb.summarize(rows, None)["defects"] == 0


def test_prefill_rows_give_decode_speedups_and_are_no_method_row(tmp_path):
    """``vllm-prefill`` (one new token on the plain engine) times the prompt's forward: decode speedups leave it out."""
    assert vllm_runs.speculative_config("vllm-prefill", 16, 8) is None
    args = argparse.Namespace(target="t", dataset="d", threads=2, dtype="bfloat16", k=16, ngram_k=8,
                              max_model_len=4096, max_new_tokens=64, chain_cost_slope=0.02)
    rows = {"vllm": [_row("a", "vllm", [1, 2, 3], time_s=4.0), _row("b", "vllm", [1, 2], time_s=6.0)],
            "toolspec": [_row("a", "toolspec", [1, 2, 3], time_s=2.0, accepted=2, drafts=1),
                         _row("b", "toolspec", [1, 2], time_s=2.0, accepted=1, drafts=1)],
            "vllm-prefill": [_row("a", "vllm-prefill", [1], time_s=1.0), _row("b", "vllm-prefill", [1], time_s=2.0)]}
    ref = {r["record_id"]: r for r in rows["vllm"]}
    vb.compare(rows["vllm"], ref, 0.25)
    vb.compare(rows["toolspec"], ref, 0.25)
    res = vb.build_results(args, ["vllm", "toolspec", "vllm-prefill"], rows, {}, "hermes")
    m = res["methods"]
    prefill = m["vllm-prefill"]
    assert prefill["mean_s"] == pytest.approx(1.5) and prefill["share_of_reference"] == pytest.approx(0.3)
    assert m["toolspec"]["speedup"] == pytest.approx(2.5)
    assert m["toolspec"]["decode_speedup"] == pytest.approx((5.0 - 1.5) / (2.0 - 1.5))
    assert m["vllm"]["decode_speedup"] == pytest.approx(1.0)
    vb.write_results(tmp_path / "t_d.json", res)
    text = vllm_report.render(tmp_path)
    assert "| t | d | 2 |  | 5.00 | 1.50 | toolspec | 2.00 | 2.50x | 7.00x |" in text
    assert "vllm-prefill" not in text.split("\n", 2)[2]          # a column, not a row


def test_warm_tools_caches_the_toolbox_block_only(tmp_path):
    """``--warm-tools``: prefix caching on; the block is the prompt's system + tools prefix, as ``ooospec bench``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ooospec.runtime import formats

    vocab = {c: i for i, c in enumerate(sorted(set(pre_tokenizers.ByteLevel.alphabet())))}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                         "{% if tools %}<tools>{{ tools | tojson }}{% endif %}<go>")
    fmt = formats.get_format("json")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    recs = [{"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": q}], "tools": tools}
            for q in ("alpha", "beta")]
    prompts = [tok(fmt.render_prompt(tok, r["messages"], r["tools"]), add_special_tokens=False)["input_ids"]
               for r in recs]
    blocks = bench_data.toolbox_blocks(recs, prompts, tok, fmt)
    assert blocks[0] == blocks[1] and 0 < blocks[0] < min(map(len, prompts))
    assert prompts[0][:blocks[0]] == prompts[1][:blocks[1]]          # the shared system block, not the question
    args = argparse.Namespace(model_dir="m", dtype="bfloat16", max_model_len=4096, k=16, ngram_k=8,
                              chain_cost_slope=0.02, sidecar_url=None, warm_tools=True)
    assert vllm_runs.engine_kwargs(args, "toolspec")["enable_prefix_caching"] is True
    args.warm_tools = False
    assert vllm_runs.engine_kwargs(args, "vllm")["enable_prefix_caching"] is False
    assert vllm_report.caching({"warm_tools": True}) == "prefix caching on, toolbox warm"


def test_dedicated_schedules_refuse_a_sidecar_that_answers_nothing():
    """No wave answered (nothing listens, or another server holds the port): the dedicated row would be toolspec's,
    so the bench stops instead of emulating nothing."""
    from ooospec.runtime.formats import hermes
    from tests.runtime.chat_tiny import TOOLS, USER, trained_chat_model

    record = {"id": "r", "messages": USER, "tools": TOOLS}
    with pytest.raises(SystemExit, match="no wave of the 1 requests"):
        vllm_runs.dedicated_schedules("http://127.0.0.1:9", [record], trained_chat_model()[1], hermes,
                                      wave={"wave": "all", "top_k": 2}, warm_tools=True, timeout=5.0)


class _StubSidecar:
    """An HTTP server that records each request's method and path; ``/reset_prefix_cache`` answers ``reset``,
    a wave 500 (so no wave is answered), ``/health`` an idle server."""

    def __init__(self, reset: int = 200):
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes = b"{}"):
                seen.append((self.command, self.path))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer(200, b'{"status": "ok", "layout_version": 3, "running": 0, "waiting": 0}')

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(reset if self.path == "/reset_prefix_cache" else 500)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("warm_tools", [False, True])
def test_dedicated_schedules_cold_forget_every_earlier_block(warm_tools):
    """Cold toolbox: before each request's wave the server forgets every earlier block (an earlier request with the
    same toolbox would make the wave warm); warm: the request's toolbox is prefilled instead, never reset."""
    from ooospec.runtime.formats import hermes
    from tests.runtime.chat_tiny import TOOLS, USER, trained_chat_model

    records = [{"id": f"r{i}", "messages": USER, "tools": TOOLS} for i in range(2)]
    stub = _StubSidecar()
    try:
        with pytest.raises(SystemExit, match="no wave of the 2 requests"):
            vllm_runs.dedicated_schedules(stub.url, records, trained_chat_model()[1], hermes,
                                          wave={"wave": "all", "top_k": 2}, warm_tools=warm_tools, timeout=5.0)
    finally:
        stub.close()
    posts = [path for method, path in stub.seen if method == "POST"]
    if warm_tools:
        assert "/reset_prefix_cache" not in posts
        assert posts == ["/v1/completions"] * 4         # each request: its toolbox prefill, then its wave
    else:
        assert posts == ["/reset_prefix_cache", "/v1/completions"] * 2


def test_dedicated_schedules_cold_refuse_a_server_that_keeps_its_blocks():
    """A server without ``/reset_prefix_cache`` would time cold waves warm: the bench stops, naming it."""
    from ooospec.runtime.formats import hermes
    from tests.runtime.chat_tiny import TOOLS, USER, trained_chat_model

    stub = _StubSidecar(reset=404)
    try:
        with pytest.raises(SystemExit, match="did not forget its blocks"):
            vllm_runs.dedicated_schedules(stub.url, [{"id": "r", "messages": USER, "tools": TOOLS}],
                                          trained_chat_model()[1], hermes, wave={"wave": "all", "top_k": 2},
                                          warm_tools=False, timeout=5.0)
    finally:
        stub.close()


def test_a_gpu_share_reaches_the_target_engine_only_when_given():
    """``--gpu-memory-utilization``: the target's engine leaves the rest of a GPU to a sidecar beside it."""
    args = argparse.Namespace(model_dir="m", dtype="bfloat16", max_model_len=4096, k=16, ngram_k=8,
                              chain_cost_slope=0.02, sidecar_url=None, warm_tools=False)
    assert "gpu_memory_utilization" not in vllm_runs.engine_kwargs(args, "toolspec")
    args.gpu_memory_utilization = 0.7
    assert vllm_runs.engine_kwargs(args, "toolspec")["gpu_memory_utilization"] == 0.7
