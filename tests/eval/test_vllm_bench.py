"""``ooospec vllm-bench`` / ``vllm-report`` without vLLM: engine settings per method, request data, exactness
classification, summaries, joining llama.cpp rows, --add, and the report table."""

from __future__ import annotations

import argparse
import json
from typing import ClassVar

import pytest

from ooospec.eval.bench import data as bench_data
from ooospec.eval.vllm import bench as vb
from ooospec.eval.vllm import report as vllm_report
from ooospec.eval.vllm import runs as vllm_runs
from ooospec.eval.vllm import waves as vllm_waves


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
    parted_early = {"d": _row("d", "vllm", [1, 2, 3], margins=[5.0])}   # the untimed re-run parted at 0
    late = [_row("d", "x", [1, 2, 9])]
    vb.compare(late, parted_early, 0.25)
    assert late[0]["mismatch"] == {"position": 2, "margin": None, "kind": "unclassified"}   # not a defect: unknown
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
    with pytest.raises(SystemExit, match="nope.json: no such file"):       # named, not a traceback
        vb.llamacpp_rows(tmp_path / "nope.json", ["a"])


def test_a_missing_llamacpp_bench_stops_the_run_before_any_engine_starts(tmp_path, monkeypatch):
    """A wrong --llamacpp-bench path used to fail after every method had run (13 min of a lost run here)."""
    monkeypatch.setattr(vb, "measure", lambda *a, **k: pytest.fail("measured before checking --llamacpp-bench"))
    monkeypatch.setattr(vb, "vllm_cpu_env", lambda *a, **k: None)
    monkeypatch.setattr(vb, "resolve_benchmark", lambda *a: tmp_path / "x.jsonl")
    monkeypatch.setattr(vb, "load_examples", lambda *a, **k: [{"id": "a", "messages": [], "tools": []}])
    monkeypatch.setattr(vb, "prompt_ids_of", lambda r, tok, fmt: [1, 2, 3])
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr("ooospec.runtime.formats.detect_format", lambda tok: object())
    p = argparse.ArgumentParser()
    vb.add_arguments(p)
    args = p.parse_args(["--target", str(tmp_path), "--dataset", "x", "--out", str(tmp_path / "o.json"),
                         "--methods", "vllm,toolspec", "--llamacpp-bench", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match="missing.json: no such file"):
        vb.run_cli(args)


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


def test_plain_margins_run_only_on_the_requests_a_method_parted_from_and_are_kept(tmp_path, monkeypatch):
    rows = {"vllm": [_row("a", "vllm", [1, 2, 3]), _row("b", "vllm", [1, 2, 3]),
                     _row("c", "vllm", [1, 2, 3], margins=[1.0, 1.0, 1.0])],
            "toolspec": [_row("a", "toolspec", [1, 2, 3]), _row("b", "toolspec", [1, 9, 3]),
                         _row("c", "toolspec", [1, 9, 3])],
            "vllm-prefill": [_row(r, "vllm-prefill", [1]) for r in "abc"]}
    assert vb.unclassified(rows) == [1]       # a matched; c has margins already; prefill rows are no answers
    calls = []

    seen_reference = []

    def worker(args, method, records, prompts, params, reference):
        calls.append((method, prompts))
        seen_reference.append(reference)
        return [[4.0, 0.1, 3.0] for _ in prompts]

    monkeypatch.setattr(vb, "run_worker", worker)
    saved = tmp_path / "cell.json.rows"
    saved.mkdir()
    vb.add_missing_margins(argparse.Namespace(), rows, [[7], [8], [9]], {}, saved)
    assert calls == [(vb.MARGINS_JOB, [[8]])]
    assert seen_reference == [{"1": {"tokens": [1, 2, 3]}}]     # the re-run is checked against plain's tokens
    assert rows["vllm"][1]["margins"] == [4.0, 0.1, 3.0] and "margins" not in rows["vllm"][0]
    assert json.loads((saved / "vllm.json").read_text())[1]["margins"] == [4.0, 0.1, 3.0]
    vb.compare(rows["toolspec"], {r["record_id"]: r for r in rows["vllm"]}, 0.25)
    assert [r.get("mismatch", {}).get("kind") for r in rows["toolspec"]] == [None, "near_tie", "defect"]
    calls.clear()
    vb.add_missing_margins(argparse.Namespace(), rows, [[7], [8], [9]], {}, saved)
    assert calls == []                        # every mismatch has its margins: no engine starts


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
    assert (vllm_report.caching({"warm_tools": True, "block_size": 32})
            == "prefix caching on, 32-token blocks, toolbox warm")
    assert "block_size" not in vllm_runs.engine_kwargs(args, "vllm")       # vLLM's own default unless asked
    args.block_size = 32
    assert vllm_runs.engine_kwargs(args, "toolspec")["block_size"] == 32


def test_dedicated_schedules_refuse_a_sidecar_that_answers_nothing():
    """No wave answered (nothing listens, or another server holds the port): the dedicated row would be toolspec's,
    so the bench stops instead of emulating nothing."""
    from ooospec.runtime.formats import hermes
    from tests.runtime.chat_tiny import TOOLS, USER, trained_chat_model

    record = {"id": "r", "messages": USER, "tools": TOOLS}
    with pytest.raises(SystemExit, match="no wave of the 1 requests"):
        vllm_waves.dedicated_schedules("http://127.0.0.1:9", [record], trained_chat_model()[1], hermes,
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
            vllm_waves.dedicated_schedules(stub.url, records, trained_chat_model()[1], hermes,
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
            vllm_waves.dedicated_schedules(stub.url, [{"id": "r", "messages": USER, "tools": TOOLS}],
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


def _wave_first(url: str, *, warm_tools: bool, gate=None):
    from ooospec.runtime.formats import hermes
    from tests.runtime.chat_tiny import trained_chat_model

    return vllm_waves.WaveFirst(url, trained_chat_model()[1], hermes, wave={"wave": "all", "top_k": 2},
                               warm_tools=warm_tools, gate=gate, timeout=10.0)


def test_wave_first_waits_for_the_wave_inside_the_clock_and_hands_its_call_at_zero():
    """``ooospec-wave-first``: the wave runs in the request's time and its last bank reaches vLLM at 0 s; warm, the
    request's toolbox is prefilled before the clock (untimed)."""
    import time

    from tests.runtime.sidecar_servers import MESSAGES, TOOLS, StandIn

    record = {"id": "r", "messages": MESSAGES, "tools": TOOLS}
    with StandIn("by_query") as server:
        wf = _wave_first(server.url, warm_tools=True)
        wf.prepare(record)
        prefills = len(server.received)
        arrival = time.perf_counter()
        schedule, info = wf.run(record, arrival)
    assert prefills == 1                                     # the toolbox, before the clock
    assert len(server.received) == 2 and server.received[1][0] >= arrival
    assert schedule == [[0.0, [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]]]
    assert info["wave_s"] >= info["banks"][-1] > 0 and info["decision"] is None
    xargs = vllm_runs.request_xargs("ooospec-wave-first", record, None, schedule)
    assert json.loads(xargs["ooospec_hint_schedule"]) == schedule
    with pytest.raises(ValueError, match="hint schedule"):
        vllm_runs.request_xargs("ooospec-wave-first", record, None, None)


def test_wave_first_cold_refuses_a_server_that_keeps_its_blocks_and_a_skipping_gate_sends_nothing():
    from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
    from ooospec.runtime.sidecar.gate import WaveGate
    from tests.runtime.sidecar_servers import MESSAGES, TOOLS, StandIn

    record = {"id": "r", "messages": MESSAGES, "tools": TOOLS}
    stub = _StubSidecar(reset=404)
    try:
        with pytest.raises(SystemExit, match="did not forget its blocks"):
            _wave_first(stub.url, warm_tools=False).prepare(record)
    finally:
        stub.close()
    with StandIn("by_query") as server:       # our engine's wave-first prior: a wave costs its whole latency -> skip
        wf = _wave_first(server.url, warm_tools=True, gate=WaveGate(DEPLOYMENTS["wave-first"].prior))
        wf.target_measured = True
        schedule, info = wf.run(record, __import__("time").perf_counter())
    assert schedule == [] and info["decision"]["decision"] == "skip" and server.received == []
    assert info["decision"]["num_queries"] == 0
    assert vllm_waves.wave_first_gate(argparse.Namespace(sidecar_gate="off")) is None
    gate = vllm_waves.wave_first_gate(argparse.Namespace(sidecar_gate="shared"))
    assert gate.prior.target_waits and gate.prior.marginal == vllm_waves.VLLM_CHAIN_MARGINAL


def test_wave_first_prices_the_target_with_its_first_request_then_gates_and_learns():
    """With a gate the first request runs without a wave (nothing to weigh one against): its seconds per step and
    tokens price the target; the next requests are decided, and each teaches the gate."""
    import time

    from ooospec.runtime.sidecar.gate import tools_key
    from tests.runtime.sidecar_servers import MESSAGES, TOOLS, StandIn

    record = {"id": "r", "messages": MESSAGES, "tools": TOOLS}
    gate = vllm_waves.wave_first_gate(argparse.Namespace(sidecar_gate="shared"))
    assert gate.prior_weight == vllm_waves.WAVE_FIRST_PRIOR_WEIGHT
    with StandIn("by_query") as server:
        wf = _wave_first(server.url, warm_tools=True, gate=gate)
        schedule, info = wf.run(record, time.perf_counter())
        assert schedule == [] and server.received == [] and info["decision"]["decision"] == "skip"
        wf.observe(target_s=10.0, new_tokens=40, forwards=10)          # 1 s a step, against the prior's 0.19 s
        assert wf.target_measured and gate.prior.step_s == 1.0 and gate.prior.call_tokens == 40
        schedule, info = wf.run(record, time.perf_counter())          # a slow target: the wave pays
        assert info["decision"]["decision"] != "skip" and schedule and len(server.received) == 1
        before = gate.estimates(tools_key(TOOLS))
        wf.observe(target_s=3.0, new_tokens=20, forwards=6)   # a faster request, no hint counts read
        after = gate.estimates(tools_key(TOOLS))
        assert after.step_s < before.step_s and after.call_tokens < before.call_tokens
        assert after.accept_rate == before.accept_rate               # nothing counted: the accept rate stands
    assert not gate.calibrate_target(0.0, 10) and not gate.calibrate_target(1.0, 0)


def test_wave_first_learns_the_accept_rate_from_the_hint_tokens_only_its_hints_proposed():
    """Where the proposer's hint counters are read, a sent wave's accept rate is the accepted tokens only its hints
    had proposed per call token: hints that add nothing make a wave worth less and less."""
    import time

    from ooospec.runtime.sidecar.gate import tools_key
    from tests.runtime.sidecar_servers import MESSAGES, TOOLS, StandIn

    record = {"id": "r", "messages": MESSAGES, "tools": TOOLS}
    key = tools_key(TOOLS)
    gate = vllm_waves.wave_first_gate(argparse.Namespace(sidecar_gate="shared"))
    with StandIn("by_query") as server:
        wf = _wave_first(server.url, warm_tools=True, gate=gate)
        wf.run(record, time.perf_counter())
        wf.observe(target_s=10.0, new_tokens=40, forwards=10)          # prices the target: 1 s a step
        _, info = wf.run(record, time.perf_counter())
        kind = info["decision"]["decision"]
        assert kind == "slots"
        prior = gate.estimates(key).accept_rate[kind]
        wf.observe(target_s=4.0, new_tokens=40, forwards=10, hint_only=36)   # forwards alike, yet the hints carried
        high = gate.estimates(key).accept_rate[kind]                         # 36 tokens: counted, not inferred
        assert high > prior
        savings = []
        for _ in range(10):
            _, info = wf.run(record, time.perf_counter())
            savings.append(info["decision"]["options"]["slots"][0])
            assert info["decision"]["decision"] == "slots"
            wf.observe(target_s=1.0, new_tokens=40, forwards=10, hint_only=0)   # hints the FSM had anyway
    assert gate.estimates(key).accept_rate[kind] < min(prior, high / 5)
    assert savings == sorted(savings, reverse=True) and savings[-1] < savings[0] / 5   # what a wave is worth falls


def test_wave_first_teaches_the_gate_the_value_lengths_of_the_calls_the_target_wrote():
    """The target's output (parsed in its format) tells the gate how long each slot's values run, what a wave on
    that toolbox will decode: a request with no wave teaches it as well."""
    import time

    from tests.runtime.sidecar_servers import MESSAGES, TOOLS

    record = {"id": "r", "messages": MESSAGES, "tools": TOOLS}
    gate = vllm_waves.wave_first_gate(argparse.Namespace(sidecar_gate="shared"))
    wf = _wave_first("http://127.0.0.1:9", warm_tools=True, gate=gate)
    wf.run(record, time.perf_counter())                                   # the first request: no wave
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France"}}\n</tool_call>'
    wf.observe(target_s=2.0, new_tokens=20, forwards=10, text=text)
    assert {k: (c.num, c.den) for k, c in gate._values.items()} == {("get_weather", "city"): (13.0, 1.0)}


def test_gate_warmup_teaches_the_gate_on_untimed_requests_and_records_nothing(monkeypatch, fake_vllm):
    """``--gate-warmup``: the warm-up requests run wave and target on the engine and teach the gate, before and
    outside the timed rows; only with a gated wave-first method, and only requests after the timed ones."""
    import types

    seen = []

    class FakeWaveFirst:
        client = types.SimpleNamespace(gate=vllm_waves.wave_first_gate(argparse.Namespace(sidecar_gate="shared")))

        def prepare(self, record):
            seen.append(("prepare", record["id"]))

        def run(self, record, arrival):
            seen.append(("wave", record["id"]))
            return [], {"wave_s": 0.0, "banks": [], "decision": {"decision": "skip"}}

        def observe(self, target_s, new_tokens, forwards, hint_only=None, text=None):
            seen.append(("observe", new_tokens, forwards, hint_only))

    monkeypatch.setattr(vllm_waves.WaveFirst, "for_run", classmethod(lambda cls, args: FakeWaveFirst()))
    records = [{"id": f"r{i}", "messages": [{"role": "user", "content": "hi"}], "tools": []} for i in range(2)]
    warmup = [{"id": f"w{i}", "messages": [{"role": "user", "content": "hi"}], "tools": []} for i in range(3)]
    args = argparse.Namespace(model_dir="m", dtype="bfloat16", max_model_len=4096, k=16, ngram_k=8,
                              chain_cost_slope=0.02, sidecar_url="http://x", warm_tools=True, blocks=[4, 4],
                              paired=False, classify=False,
                              warmup={"records": warmup, "prompts": [[1] * 9] * 3, "blocks": [3, 3, 3]})
    _FakeLLM.instances.clear()
    rows = vllm_runs.run_method(args, "ooospec-wave-first", records, [[1] * 10, [1] * 11], {"max_tokens": 8}, {})
    assert [r["record_id"] for r in rows] == ["r0", "r1"]
    assert [e[1] for e in seen if e[0] == "wave"] == ["w0", "w1", "w2", "r0", "r1"]      # the warm-up first
    assert seen.count(("observe", 3, 3, 0)) == 5             # every request, warm-up included, teaches the gate
    log = _FakeLLM.instances[0].log
    assert [e["cached"] for e in log[1:4]] == [3, 3, 3]                                 # each from its toolbox
    # the warm-up's calls teach a drafter history of their own, not the timed requests'
    assert [e["xargs"].get("ooospec_history") for e in log[1:]] == [vllm_runs.WARMUP_HISTORY] * 3 + [None] * 2


def test_gate_warmup_requests_are_a_seeded_random_slice_of_the_rest_not_the_next_ones():
    # API-Bank sorted by id: each API's requests together; the next N would all be one API's
    rest = [{"id": f"{api}-{i:02d}"} for api in ("AppointmentRegistration", "BookHotel", "Calculator", "Wiki")
            for i in range(10)]
    warm = vb.warmup_records(rest, 12, "apibank-l1")
    ids = [r["id"] for r in warm]
    assert len(set(ids)) == 12 and ids == sorted(ids) and set(ids) <= {r["id"] for r in rest}
    assert len({i.split("-")[0] for i in ids}) >= 3           # several APIs, not the first one's 10 and 2 more
    assert warm == vb.warmup_records(rest, 12, "apibank-l1")  # deterministic
    assert vb.warmup_records(rest, 0) == [] and len(vb.warmup_records(rest, 40)) == 40
    with pytest.raises(SystemExit, match="has 40 requests after the timed ones"):
        vb.warmup_records(rest, 41, "apibank-l1")


@pytest.mark.parametrize("argv, why", [
    (["--gate-warmup", "5"], "needs that method"),
    (["--gate-warmup", "5", "--methods", "ooospec-wave-first"], "needs that method"),
    (["--gate-warmup", "-1", "--methods", "ooospec-wave-first", "--sidecar-gate", "shared"], "N >= 0"),
])
def test_gate_warmup_needs_a_gated_wave_first(argv, why, tmp_path):
    p = argparse.ArgumentParser()
    vb.add_arguments(p)
    args = p.parse_args(["--target", str(tmp_path), "--dataset", "x", "--out", str(tmp_path / "o.json"), *argv])
    with pytest.raises(SystemExit, match=why):
        vb.check_gate_warmup(args, vb.methods_to_run(args.methods))


class _FakeLLM:
    """Enough of vLLM's offline ``LLM`` for :func:`vllm_runs.run_method`: every generate is logged with what the
    prefix cache held (reset, then the toolbox block) and answers the same tokens."""

    instances: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.kwargs, self.log, self.cached = kwargs, [], None
        _FakeLLM.instances.append(self)

    def reset_prefix_cache(self):
        self.cached = None

    def generate(self, prompts, sp, use_tqdm=False):
        from types import SimpleNamespace

        ids = prompts[0]["prompt_token_ids"]
        if sp.kwargs.get("max_tokens") == 1 and sp.extra_args is None:      # a toolbox block, cached
            self.cached = len(ids)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0], text="")])]
        self.log.append({"n": len(ids), "cached": self.cached, "xargs": sp.extra_args})
        self.cached = None          # the request's own blocks are cached now: the next arm must reset
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5, 6, 7], text="abc")])]

    def get_metrics(self):
        return []


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM's offline API as far as :func:`vllm_runs.run_method` uses it: :class:`_FakeLLM`, a ``SamplingParams``
    that keeps its arguments, ``TokensPrompt``."""
    import sys
    import types

    class SamplingParams:
        def __init__(self, extra_args=None, **kwargs):
            self.extra_args, self.kwargs = extra_args, kwargs

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = _FakeLLM, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    _FakeLLM.instances.clear()


def test_paired_wave_first_alternates_the_arms_each_from_the_same_cache_state(monkeypatch, fake_vllm):
    """``--paired``: request by request the wave-first arm and a toolspec arm (no schedule, a history of its own)
    on one engine, the order alternating, each arm starting from only its toolbox block in the cache."""

    class FakeWaveFirst:
        seen: ClassVar[list] = []

        def prepare(self, record):
            self.seen.append(("prepare", record["id"]))

        def run(self, record, arrival):
            self.seen.append(("wave", record["id"]))
            return [[0.0, [{"name": "f", "arguments": {}}]]], {"wave_s": 0.001, "banks": [0.001], "decision": None}

        def observe(self, *a, **kw):
            self.seen.append(("observe",))

    monkeypatch.setattr(vllm_waves.WaveFirst, "for_run", classmethod(lambda cls, args: FakeWaveFirst()))
    records = [{"id": f"r{i}", "messages": [{"role": "user", "content": "hi"}], "tools": []} for i in range(3)]
    prompts = [list(range(10 + i)) for i in range(3)]
    args = argparse.Namespace(model_dir="m", dtype="bfloat16", max_model_len=4096, k=16, ngram_k=8,
                              chain_cost_slope=0.02, sidecar_url="http://x", warm_tools=True, blocks=[4, 4, 4],
                              paired=True, classify=False)
    _FakeLLM.instances.clear()
    rows = vllm_runs.run_method(args, "ooospec-wave-first", records, prompts, {"max_tokens": 8}, {})
    log = _FakeLLM.instances[0].log[1:]                     # [0]: the warm-up request
    arms = ["toolspec" if "ooospec_hint_schedule" not in e["xargs"] else "wave-first" for e in log]
    assert arms == ["wave-first", "toolspec", "toolspec", "wave-first", "wave-first", "toolspec"]
    assert all(e["cached"] == 4 for e in log)               # every arm: the toolbox block only
    assert all(e["xargs"].get("ooospec_history") == vllm_runs.PAIRED_HISTORY for e, a in zip(log, arms)
               if a == "toolspec")
    assert all("ooospec_history" not in e["xargs"] for e, a in zip(log, arms) if a == "wave-first")
    assert [r["paired"]["first"] for r in rows] == ["ooospec-wave-first", "toolspec", "ooospec-wave-first"]
    assert all(r["paired"]["same_tokens"] and r["wave"]["wave_s"] == 0.001 for r in rows)
    assert FakeWaveFirst.seen.count(("observe",)) == 3
    s = vb.summarize(rows, None)
    assert s["waves_sent"] == 3 and s["paired_same_tokens"] == 3 and "paired_vs_toolspec" in s
    notes = "".join(vllm_report.wave_notes({"ooospec-wave-first": s}))
    assert "waves sent 3/3" in notes and "paired with `toolspec`" in notes


def test_hint_worth_counts_per_call_token_and_prices_a_hint_only_token_by_the_paired_forwards(tmp_path):
    """Over the requests that got a wave: hint-covered and hint-only tokens per call token, and with ``--paired``
    the forwards saved against the toolspec arm, per call token and per hint-only token; the folder report shows
    them under its table, computed from the rows even for a file summarized before they existed."""
    rows = [{"new_tokens": 40, "forwards": 6, "hint_accepted": 30, "hint_only_accepted": 10,
             "paired": {"toolspec_accepted": 30}},                   # toolspec: 10 forwards -> 4 saved
            {"new_tokens": 60, "forwards": 20, "hint_accepted": 10, "hint_only_accepted": 0,
             "paired": {"toolspec_accepted": 40}}]                   # 20 forwards -> 0 saved
    w = vb.hint_worth(rows)
    assert w["hint_accepted_per_token"] == 0.4 and w["hint_only_per_token"] == 0.1
    assert w["forwards_saved"] == 4 and w["forwards_saved_per_token"] == 0.04
    assert w["forwards_saved_per_hint_only"] == 0.4
    assert vb.hint_worth([{k: v for k, v in r.items() if k != "paired"} for r in rows]).keys() == {
        "hint_accepted_per_token", "hint_only_per_token", "hint_only_accepted"}
    assert vb.hint_worth([{"new_tokens": 5, "forwards": 5}]) == {}          # rows from before the counters
    examples = [{**r, "method": "ooospec-wave-first", "wave": {"wave_s": 0.5, "banks": [0.5]}} for r in rows]
    cell = {"target": "t", "dataset": "d", "order": ["vllm", "ooospec-wave-first"], "examples": examples,
            "env": {"vllm": "0", "dtype": "bf16", "threads": 2, "k": 16, "ngram_k": 8, "warm_tools": True,
                    "cpu": {"model": "cpu", "cores": 2, "flags": []}},
            "methods": {"vllm": {"n": 2, "mean_s": 2.0, "speedup": 1.0, "mat": 1.0, "accepted_per_step": 0.0,
                                 "exact_rate": 1.0, "near_ties": 0, "defects": 0},
                        "ooospec-wave-first": {"n": 2, "mean_s": 1.0, "speedup": 2.0, "mat": 4.0,
                                               "accepted_per_step": 3.0, "exact_rate": 1.0, "near_ties": 0,
                                               "defects": 0, "waves_sent": 2, "wave_mean_s": 0.5}}}
    (tmp_path / "t_d_warm.json").write_text(json.dumps(cell))
    text = vllm_report.render(tmp_path)
    assert "only the hints had 0.100" in text and "0.40 per hint-only token" in text


def test_the_shared_deployment_counts_the_waves_its_gate_sent_from_the_sidecar_server(monkeypatch, fake_vllm):
    """``ooospec`` sends its waves from inside vLLM's proposer: each row holds how many wave requests reached the
    sidecar server during it (its ``/health`` count), the summary the requests with one; an old server without the
    count leaves the rows without it."""
    from ooospec.eval.vllm import headline
    from ooospec.runtime.sidecar import process

    counts = iter([0, 2, 2, 2, 2, 2])     # before / after each request: a function-first wave (2), then none, none
    monkeypatch.setattr(process, "health", lambda url, timeout=1.0: {"requests": next(counts)})
    monkeypatch.setattr(process, "wait_idle", lambda url, **kw: 0.0)
    monkeypatch.setattr(process, "reset_prefix_cache", lambda url, **kw: True)
    records = [{"id": f"r{i}", "messages": [{"role": "user", "content": "hi"}], "tools": []} for i in range(3)]
    prompts = [list(range(10 + i)) for i in range(3)]
    args = argparse.Namespace(model_dir="m", dtype="bfloat16", max_model_len=4096, k=16, ngram_k=8,
                              chain_cost_slope=0.02, sidecar_url="http://127.0.0.1:9", warm_tools=True,
                              blocks=[4, 4, 4], paired=False, classify=False)
    rows = vllm_runs.run_method(args, "ooospec", records, prompts, {"max_tokens": 8}, {})
    assert [r["sidecar_requests"] for r in rows] == [2, 0, 0]
    s = vb.summarize(rows, None)
    assert s["sidecar_waves"] == 1 and "waves_sent" not in s
    assert "sent waves on 1/3 requests" in "".join(vllm_report.wave_notes({"ooospec": s}))
    assert not headline.no_wave({"ooospec": s}, "ooospec")
    assert headline.no_wave({"ooospec": {**s, "sidecar_waves": 0}}, "ooospec")
    monkeypatch.setattr(process, "health", lambda url, timeout=1.0: {})
    assert all("sidecar_requests" not in r for r in vllm_runs.run_method(args, "ooospec", records, prompts,
                                                                        {"max_tokens": 8}, {}))


def test_plain_margins_stop_where_the_re_run_parts_from_the_timed_tokens(monkeypatch, fake_vllm):
    """A bf16 re-run can take another path than the timed run: margins past that point are another continuation's,
    so the list ends at the first differing position (its margin kept: the tie itself)."""
    import sys
    from types import SimpleNamespace

    def lp(a, b):
        return {1: SimpleNamespace(logprob=a), 2: SimpleNamespace(logprob=b)}

    class MarginLLM(_FakeLLM):
        def generate(self, prompts, sp, use_tqdm=False):
            out = SimpleNamespace(token_ids=[5, 6, 9, 9], logprobs=[lp(0, -1), lp(0, -2), lp(0, -0.1), lp(0, -3)])
            return [SimpleNamespace(outputs=[out])]

    monkeypatch.setattr(sys.modules["vllm"], "LLM", MarginLLM)
    args = argparse.Namespace(model_dir="m", dtype="bfloat16", max_model_len=4096, k=16, ngram_k=8,
                              chain_cost_slope=0.02, sidecar_url=None, warm_tools=False)
    got = vllm_runs.run_margins(args, [[1, 2], [3]], {"max_tokens": 8}, [[5, 6, 7, 8], [5, 6, 9, 9]])
    assert got == [[1.0, 2.0, 0.1], [1.0, 2.0, 0.1, 3.0]]
