"""``ooospec vllm-load`` without vLLM or a network: options, request bodies, streamed answers put back together,
the concurrency driver on a fake ``send``, summaries, exactness, the proposer's log lines, resuming, the table."""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
import pytest

from ooospec import cli
from ooospec.eval.vllm import load as vl
from ooospec.eval.vllm import runs as vllm_runs
from ooospec.runtime.backends.hardware import vllm_dtype
from ooospec.runtime.formats.messages import openai_messages

RECORD = {"id": "r1", "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
          "messages": [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
                       {"role": "tool", "content": "ok"},
                       {"role": "user", "content": "again"}]}


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    vl.add_arguments(p)
    return p.parse_args(["--target", "m", "--out", "out/x.json", *argv])


def validated(*argv: str) -> argparse.Namespace:
    args = parse(*argv)
    vl.validate(args)
    args.model_dir = "/models/m"
    return args


# --------------------------------------------------------------------------------------------- options


def test_registered_like_vllm_bench():
    assert cli.COMMANDS["vllm-load"][0] == "ooospec.eval.vllm.load"


def test_defaults_and_validation():
    args = validated()
    assert args.order == ["vllm", "toolspec", "vllm-ngram"]
    assert args.levels == [1, 2, 4, 8, 16] and args.streams == [False, True]
    assert (args.limit, args.threads, args.dtype, args.k, args.ngram_k) == (16, 2, vllm_dtype("auto"), 16, 8)
    assert (args.max_new_tokens, args.log_interval, args.chain_cost_slope) == (128, 2.0, 0.02)
    assert (args.prefix_caching, args.dataset, args.stream) == ("on", "apibank-l1", "both")
    assert validated("--methods", "toolspec,vllm", "--stream", "on", "--concurrency", "4,1,4").order == [
        "vllm", "toolspec"]
    assert validated("--concurrency", "4,1,4").levels == [4, 1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--concurrency", "1,x"], "--concurrency"), (["--concurrency", "0,2"], ">= 1"),
    (["--methods", "vllm,ooospec-oracle"], "ooospec-oracle"), (["--methods", "nope"], "nope"),
    (["--limit", "0"], "--limit"), (["--threads", "0"], "--threads"), (["--log-interval", "0"], "--log-interval"),
    (["--chain-cost-slope", "-1"], "--chain-cost-slope"), (["--max-new-tokens", "0"], "--max-new-tokens"),
])
def test_bad_options_stop_with_a_message(argv, message):
    with pytest.raises(SystemExit, match=message):
        validated(*argv)


def test_server_commands_per_method():
    args = validated("--concurrency", "1,8", "--prefix-caching", "off", "--log-interval", "3", "--dtype", "bf16")
    plain = vl.server_command(args, "vllm", 1234)
    assert plain[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag, value in (("--model", "/models/m"), ("--port", "1234"), ("--dtype", "bfloat16"),
                        ("--max-model-len", "4096"), ("--seed", "0"), ("--max-num-seqs", "8"),
                        ("--tool-call-parser", "hermes")):
        assert plain[plain.index(flag) + 1] == value
    assert "--enable-auto-tool-choice" in plain and "--no-enable-prefix-caching" in plain
    assert "--speculative-config" not in plain and "--additional-config" not in plain
    ngram = vl.server_command(args, "vllm-ngram", 1)
    assert json.loads(ngram[ngram.index("--speculative-config") + 1]) == vllm_runs.speculative_config(
        "vllm-ngram", 16, 8)
    ours = vl.server_command(args, "toolspec", 1)
    assert json.loads(ours[ours.index("--speculative-config") + 1])["model"] == vllm_runs.PROPOSER
    extra = json.loads(ours[ours.index("--additional-config") + 1])["ooospec"]
    assert extra == {**vllm_runs.ooospec_options("toolspec", None, 0.02), "log_interval_s": 3.0}
    assert "--no-enable-prefix-caching" not in vl.server_command(validated(), "vllm", 1)


def test_the_kv_block_size_reaches_the_server_and_the_resume_key():
    """``--block-size`` (the prefix cache's unit) is the server's, and a saved run of another size is not reused."""
    assert "--block-size" not in vl.server_command(validated(), "vllm", 1)          # vLLM's default
    for method in ("vllm", "toolspec"):
        cmd = vl.server_command(validated("--block-size", "32"), method, 1)
        assert cmd[cmd.index("--block-size") + 1] == "32"
    records = [{"id": "r0"}]
    default, b32 = (vl.settings_of(validated(*argv), records) for argv in ([], ["--block-size", "32"]))
    assert "block_size" not in default and b32["block_size"] == 32 and default != b32
    assert vl.settings_of(validated("--quantized", "w8a8-rtn"), records)["quantized"] == "w8a8-rtn"


# --------------------------------------------------------------------------------------------- requests


def test_request_bodies_are_openai_chat_completions():
    body = vl.request_body(RECORD, "/models/m", 64, stream=False)
    assert (body["model"], body["temperature"], body["max_tokens"], body["stream"]) == ("/models/m", 0.0, 64, False)
    assert body["tools"] == RECORD["tools"] and "stream_options" not in body
    assert body["return_token_ids"] is True          # every method alike: what classifies a difference
    call = body["messages"][1]["tool_calls"][0]
    assert call["type"] == "function" and call["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert body["messages"][2]["tool_call_id"] == call["id"]
    assert RECORD["messages"][1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}    # the record is untouched
    streamed = vl.request_body(RECORD, "/models/m", 64, stream=True)
    assert streamed["stream"] and streamed["stream_options"] == {"include_usage": True}


def test_a_bare_call_becomes_an_openai_call():
    msgs = openai_messages([{"role": "assistant", "content": "", "tool_calls": [{"name": "g", "arguments": {}}]}])
    assert msgs[0]["tool_calls"][0]["function"] == {"name": "g", "arguments": "{}"}


def sse(*chunks: dict) -> list[str]:
    return [f"data: {json.dumps(c)}" for c in chunks] + ["", "data: [DONE]"]


STREAM = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
             {"choices": [{"index": 0, "delta": {"tool_calls": [
                 {"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": ""}}]}}]},
             {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}}]},
             {"choices": [{"index": 0, "delta": {"tool_calls": [
                 {"index": 1, "id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}}]},
             {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]},
                           "finish_reason": "tool_calls"}]},
             {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}})


def test_a_stream_is_put_back_together():
    acc = vl.StreamAccumulator(10.0)
    for i, line in enumerate(STREAM):
        acc.feed_line(line, 11.0 + i)
    row = acc.result(20.0)
    assert row["tool_calls"] == [{"name": "f", "arguments": '{"a": 1}'}, {"name": "g", "arguments": "{}"}]
    assert row["ttft_s"] == 2.0          # the role-only first chunk does not count
    assert (row["latency_s"], row["completion_tokens"], row["finish_reason"], row["content"]) == (
        10.0, 7, "tool_calls", "")


def test_content_streams_and_a_silent_stream_has_ttft_latency():
    acc = vl.StreamAccumulator(0.0)
    for i, line in enumerate(sse(*({"choices": [{"delta": {"content": t}}]} for t in ("", "He", "llo")))):
        acc.feed_line(line, 1.0 + i)
    assert acc.result(5.0)["content"] == "Hello" and acc.result(5.0)["ttft_s"] == 2.0
    assert vl.StreamAccumulator(0.0).result(3.0)["ttft_s"] == 3.0


def test_a_whole_answer_is_a_row():
    data = {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        "finish_reason": "tool_calls", "token_ids": [7, 8]}], "usage": {"completion_tokens": 5},
        "prompt_token_ids": [1, 2]}
    row = vl.parse_response(data, 1.5)
    assert row == {"latency_s": 1.5, "ttft_s": 1.5, "completion_tokens": 5, "content": "",
                   "tool_calls": [{"name": "f", "arguments": "{}"}], "finish_reason": "tool_calls",
                   "prompt_token_ids": [1, 2], "token_ids": [7, 8]}


def test_a_stream_keeps_its_token_ids():
    acc = vl.StreamAccumulator(0.0)
    chunks = ({"prompt_token_ids": [1, 2], "choices": [{"delta": {"role": "assistant"}, "token_ids": []}]},
              {"choices": [{"delta": {"content": "a"}, "token_ids": [5, 6]}]},
              {"choices": [{"delta": {}, "token_ids": [7]}]},           # a token the parser held back
              {"choices": [{"delta": {"content": "b"}, "token_ids": [8], "finish_reason": "stop"}]})
    for i, line in enumerate(sse(*chunks)):
        acc.feed_line(line, float(i))
    row = acc.result(9.0)
    assert (row["prompt_token_ids"], row["token_ids"], row["content"]) == ([1, 2], [5, 6, 7, 8], "ab")


def test_send_chat_against_a_mock_transport():
    whole = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        if json.loads(request.content)["stream"]:
            return httpx.Response(200, text="\n".join(STREAM) + "\n", headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=whole)

    async def go(stream: bool) -> dict:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await vl.send_chat(client, "http://test", vl.request_body(RECORD, "m", 8, stream))

    assert asyncio.run(go(False))["content"] == "hi"
    streamed = asyncio.run(go(True))
    assert streamed["completion_tokens"] == 7 and [c["name"] for c in streamed["tool_calls"]] == ["f", "g"]


@pytest.mark.parametrize("concurrency", [1, 3, 16])
def test_the_driver_keeps_at_most_c_in_flight_and_the_order(concurrency):
    live, peak = 0, 0

    async def send(body: dict) -> dict:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.001 * (body["n"] % 3))
        live -= 1
        return {"n": body["n"]}

    rows, wall = asyncio.run(vl.drive([{"n": i} for i in range(10)], send, concurrency))
    assert [r["n"] for r in rows] == list(range(10)) and wall > 0
    assert peak == min(concurrency, 10)


# --------------------------------------------------------------------------------------------- summaries


def test_percentiles_interpolate():
    assert vl.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
    assert vl.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9) == pytest.approx(9.1)
    assert vl.percentile([7.0], 0.9) == 7.0


def test_summary_of_a_level():
    rows = [{"latency_s": x, "ttft_s": x / 2, "completion_tokens": 10} for x in (1.0, 2.0, 3.0, 4.0)]
    s = vl.summarize(rows, wall=5.0)
    assert (s["n"], s["requests_per_s"], s["output_tokens_per_s"]) == (4, 0.8, 8.0)
    assert (s["p50_s"], s["ttft_p50_s"]) == (2.5, 1.25) and s["p90_s"] == pytest.approx(3.7)


def metrics_line(steps: int, mean_chain: float, batch: int, price: float, mean_batch: float | None = None) -> str:
    window = {"steps": steps, "mean_chain": mean_chain, "mean_accepted": 1.0, "chain_lengths": {}}
    if mean_batch is not None:
        window |= {"mean_batch": mean_batch, "max_batch": round(mean_batch + 0.5)}
    m = {"totals": {"steps": 1}, "window": window,
         "pricing": {"mode": "batch", "batch": batch, "slope": 0.01, "price": price}}
    return (f"(EngineCore_DP0 pid=7) INFO 01-02 03:04:05 [proposer.py:402] {vl.METRICS_MARK}"
            f"{json.dumps(m, sort_keys=True)}")


def test_the_proposer_log_lines_of_a_level():
    log = "\n".join(["INFO 01-02 started", metrics_line(10, 8.0, 1, 0.01), "ooo-spec proposer metrics {broken",
                     metrics_line(30, 4.0, 8, 0.05), "WARNING something else"])
    metrics = vl.parse_metrics(log)
    assert [m["pricing"]["batch"] for m in metrics] == [1, 8]
    s = vl.proposer_summary(metrics)
    assert (s["lines"], s["steps"], s["mean_chain"], s["mean_accepted"]) == (2, 40, 5.0, 1.0)
    assert s["pricing"] == {"mode": "batch", "batch": 8, "slope": 0.01, "price": 0.05}
    assert vl.proposer_summary([]) is None
    assert vl.proposer_summary(vl.parse_metrics(metrics_line(0, 0.0, 1, 0.0)))["mean_chain"] is None
    # logs older than the batch count: unknown, never the last line's batch
    assert s["mean_batch"] is None and vl.batch_cell(s) == "-"


def test_the_batch_column_is_the_levels_not_the_last_lines():
    # the level ran 16 wide; its last line came when one request was left (pricing batch 1)
    log = "\n".join([metrics_line(30, 4.0, 16, 0.05, mean_batch=14.0), metrics_line(10, 8.0, 1, 0.01, mean_batch=2.0)])
    s = vl.proposer_summary(vl.parse_metrics(log))
    assert s["mean_batch"] == pytest.approx(11.0) and s["max_batch"] == 14
    assert vl.batch_cell(s) == "11.0 (14)"


# --------------------------------------------------------------------------------------------- results


def level(c: int, stream: bool, wall: float, latency: float, texts: list[str], proposer=None) -> dict:
    rows = [{"id": f"r{i}", "latency_s": latency, "ttft_s": latency / 2, "completion_tokens": 4, "content": t,
             "tool_calls": []} for i, t in enumerate(texts)]
    return {"concurrency": c, "stream": stream, "wall_s": wall, "rows": rows, "proposer": proposer}


def test_levels_compare_with_plain_at_the_same_level_and_render():
    prop = vl.proposer_summary(vl.parse_metrics(metrics_line(10, 6.0, 1, 0.03, mean_batch=3.6)))
    runs = {"vllm": {"load_s": 1.0, "levels": [level(1, False, 4.0, 1.0, ["a", "b"]),
                                               level(4, False, 2.0, 2.0, ["a", "b"])]},
            "toolspec": {"load_s": 1.0, "levels": [level(1, False, 2.0, 0.5, ["a", "b"]),
                                                   level(4, False, 4.0, 3.0, ["a", "x"], prop)]}}
    table = vl.level_table(runs)
    ours = {lv["concurrency"]: lv for lv in table if lv["method"] == "toolspec"}
    assert (ours[1]["throughput_x"], ours[1]["p50_x"], ours[1]["identical"]) == (2.0, 0.5, 1.0)
    assert (ours[4]["throughput_x"], ours[4]["p50_x"], ours[4]["differ"]) == (0.5, 1.5, ["r1"])
    args = validated("--concurrency", "1,4", "--stream", "off", "--dtype", "bf16")
    results = vl.build_results(args, [{"id": "r0"}, {"id": "r1"}], runs)
    assert results["env"]["prefix_caching"] and results["env"]["concurrency"] == [1, 4]
    md = vl.render_table(results)
    lines = md.splitlines()
    assert lines[0].startswith("### vllm-load: m on apibank-l1 (2 requests, 2 threads, bfloat16, prefix caching on)")
    results["env"]["block_size"] = 32
    assert vl.render_table(results).startswith("### vllm-load: m on apibank-l1 (2 requests, 2 threads, bfloat16, "
                                               "prefix caching on, 32-token KV blocks)")
    row = next(ln for ln in lines if ln.startswith("| toolspec | 4 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:] == ["off", "0.50", "2.0", "3.00", "3.00", "1.50", "0.50x", "1.50x", "50.0%", "0", "0",
                         "6.00", "3.6 (4)", "0.0300"]
    plain = next(ln for ln in lines if ln.startswith("| vllm | 1 |"))
    assert plain.rstrip().endswith("| 100.0% | 0 | 0 | - | - | - |")


def test_the_results_keep_a_prompts_length_not_its_ids():
    lv = level(1, False, 1.0, 1.0, ["a"])
    lv["rows"][0].update(prompt_token_ids=[1, 2, 3], token_ids=[7])
    row = vl.slim([lv])[0]["rows"][0]
    assert (row["prompt_tokens"], row["token_ids"], "prompt_token_ids" in row) == (3, [7], False)
    assert lv["rows"][0]["prompt_token_ids"] == [1, 2, 3]          # the measured runs are not changed


def test_a_rerun_keeps_finished_methods(tmp_path, monkeypatch):
    ran = []

    def fake_run(args, method, records, key=None):
        ran.append(method)
        return {"load_s": 1.0, "levels": [level(1, False, 1.0, 1.0, ["a"])]}

    monkeypatch.setattr(vl, "run_method", fake_run)
    records = [{"id": "r0"}]
    args = validated("--methods", "vllm,toolspec", "--concurrency", "1", "--stream", "off")
    first = vl.measure(args, records, tmp_path / "x.rows")
    assert ran == ["vllm", "toolspec"] and set(first) == {"vllm", "toolspec"}
    (tmp_path / "x.rows" / "toolspec.json").unlink()          # as if the run stopped during toolspec
    again = vl.measure(args, records, tmp_path / "x.rows")
    assert ran == ["vllm", "toolspec", "toolspec"] and again["vllm"]["levels"] == first["vllm"]["levels"]
    args.max_new_tokens = 64                                  # other settings: nothing is kept
    vl.measure(args, records, tmp_path / "x.rows")
    assert ran[3:] == ["vllm", "toolspec"]


def test_a_level_gets_its_own_drafter_history_and_plain_gets_none():
    body = vl.request_body(RECORD, "m", 8, False, history="c4-whole")
    assert body["vllm_xargs"] == {"ooospec_history": "c4-whole"}
    assert "vllm_xargs" not in vl.request_body(RECORD, "m", 8, False)
