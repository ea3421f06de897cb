"""The OpenAI-server side of the load benches: a vLLM server of a method, its health, chat requests sent with at most
c in flight (streamed or not) and put back together, and the proposer's metrics lines in its log. Used by
:mod:`ooospec.eval.vllm.load` (``ooospec vllm-load``) and :mod:`ooospec.eval.vllm.load_probe`; ``args`` are theirs
(``model_dir``, ``dtype``, ``levels``, ``prefix_caching``, ``block_size``, ``k``, ``ngram_k``, ``chain_cost_slope``,
``log_interval``, ``streams``, ``rounds``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from ooospec.eval.vllm.runs import ooospec_options, speculative_config
from ooospec.runtime.formats.messages import openai_messages
from ooospec.runtime.methods import get_method

METRICS_MARK = "ooo-spec proposer metrics "
MAX_MODEL_LEN = 4096
KVCACHE_GB = 2
HEALTH_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0


def request_body(record: dict, model: str, max_new_tokens: int, stream: bool, history: str | None = None) -> dict:
    """One chat completion request of ``record``: greedy, its messages and tools, ``max_new_tokens``; ``history``:
    the ooo-spec proposer's drafter history for it (``ooospec_history``), so that a level never retrieves the
    calls an earlier level of the same requests produced."""
    body = {"model": model, "messages": openai_messages(record["messages"]), "tools": record["tools"],
            "temperature": 0.0, "max_tokens": max_new_tokens, "stream": stream, "return_token_ids": True}
    if history is not None:
        body["vllm_xargs"] = {"ooospec_history": history}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def parse_response(data: dict, latency: float) -> dict:
    """A non-streamed chat completion as a request row (TTFT = latency: the answer comes whole)."""
    choice = data["choices"][0]
    msg = choice.get("message") or {}
    calls = [{"name": tc["function"]["name"], "arguments": tc["function"].get("arguments") or ""}
             for tc in msg.get("tool_calls") or []]
    return {"latency_s": latency, "ttft_s": latency, "completion_tokens": (data.get("usage") or {})
            .get("completion_tokens"), "content": msg.get("content") or "", "tool_calls": calls,
            "finish_reason": choice.get("finish_reason"), "prompt_token_ids": data.get("prompt_token_ids"),
            "token_ids": choice.get("token_ids")}


class StreamAccumulator:
    """A streamed chat completion put back together: content deltas joined, tool-call deltas merged by ``index``
    (OpenAI's rule: the first delta of a call brings its id and name, later ones append to ``arguments``), the
    first content or tool-call delta's time (TTFT), the finish reason, the final chunk's ``usage`` and the token
    ids (vLLM's ``return_token_ids``: the prompt's in the first chunk, each chunk's delta tokens)."""

    def __init__(self, t0: float):
        self.t0, self.first, self.content, self.finish_reason, self.usage = t0, None, [], None, None
        self.calls: dict[int, dict] = {}
        self.prompt_token_ids, self.token_ids = None, []

    def feed_line(self, line: str, now: float) -> None:
        """One line of the server-sent events (``data: {...}``; others, ``[DONE]`` and blank lines ignored)."""
        payload = line[5:].strip() if line.startswith("data:") else ""
        if payload and payload != "[DONE]":
            self.feed(json.loads(payload), now)

    def feed(self, chunk: dict, now: float) -> None:
        self.usage = chunk.get("usage") or self.usage
        self.prompt_token_ids = self.prompt_token_ids or chunk.get("prompt_token_ids")
        for choice in chunk.get("choices") or []:
            self.token_ids += choice.get("token_ids") or []
            delta = choice.get("delta") or {}
            if (delta.get("content") or delta.get("tool_calls")) and self.first is None:
                self.first = now
            self.content.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                call = self.calls.setdefault(tc.get("index", len(self.calls)), {"name": "", "arguments": ""})
                fn = tc.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def result(self, now: float) -> dict:
        latency = now - self.t0
        return {"latency_s": latency, "ttft_s": latency if self.first is None else self.first - self.t0,
                "completion_tokens": (self.usage or {}).get("completion_tokens"), "content": "".join(self.content),
                "tool_calls": [self.calls[i] for i in sorted(self.calls)], "finish_reason": self.finish_reason,
                "prompt_token_ids": self.prompt_token_ids, "token_ids": self.token_ids}


async def send_chat(client, url: str, body: dict) -> dict:
    """POST one chat completion (streamed or not, as ``body`` says) with an ``httpx.AsyncClient``; its row."""
    t0 = time.perf_counter()
    if not body["stream"]:
        r = await client.post(url + "/v1/chat/completions", json=body)
        r.raise_for_status()
        return parse_response(r.json(), time.perf_counter() - t0)
    acc = StreamAccumulator(t0)
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            acc.feed_line(line, time.perf_counter())
    return acc.result(time.perf_counter())


async def drive(bodies: list[dict], send, concurrency: int) -> tuple[list[dict], float]:
    """Every body through ``send`` (an async callable: body -> row) with at most ``concurrency`` in flight, sent in
    order as slots free up; the rows in body order and the wall time from the first send to the last answer."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict) -> dict:
        async with gate:
            return await send(body)

    t0 = time.perf_counter()
    rows = await asyncio.gather(*(one(b) for b in bodies))
    return list(rows), time.perf_counter() - t0


def parse_metrics(text: str) -> list[dict]:
    """The proposer's metrics dicts in log ``text`` (lines ``... ooo-spec proposer metrics {json}``, any prefix:
    vLLM's engine process prefixes its own); a line whose JSON does not parse is skipped."""
    out, decoder = [], json.JSONDecoder()
    for line in text.splitlines():
        at = line.find(METRICS_MARK)
        try:
            value = decoder.raw_decode(line, at + len(METRICS_MARK))[0] if at >= 0 else None
        except ValueError:
            value = None
        out += [value] if isinstance(value, dict) else []
    return out


def proposer_summary(metrics: list[dict]) -> dict | None:
    """A level's chains from its metrics lines: steps, mean chain length and mean accepted drafts per step (each
    window weighted by its steps), the batch its steps decoded in (mean over the requests' steps, and the
    largest), and the last line's pricing (batch at that line, slope, price). None without lines."""
    if not metrics:
        return None
    windows = [m.get("window") or {} for m in metrics]
    steps = sum(w.get("steps", 0) for w in windows)
    weighted = {k: sum(w.get(k, 0.0) * w.get("steps", 0) for w in windows) / steps if steps else None
                for k in ("mean_chain", "mean_accepted", "mean_batch")}
    if not all("mean_batch" in w for w in windows if w.get("steps")):
        weighted["mean_batch"] = None          # a proposer older than the batch count: unknown, not 1
    pricing = metrics[-1].get("pricing") or {}
    return {"lines": len(metrics), "steps": steps, **weighted,
            "max_batch": max((w.get("max_batch") or 0 for w in windows), default=0) or None,
            "pricing": {k: pricing.get(k) for k in ("mode", "batch", "slope", "price")}}


def server_command(args, method: str, port: int) -> list[str]:
    """The OpenAI server of ``method`` (loopback only), its batch as large as the highest concurrency."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model_dir,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", args.dtype,
           "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0", "--max-num-seqs", str(max(args.levels)),
           "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    if args.prefix_caching == "off":
        cmd.append("--no-enable-prefix-caching")
    for flag in ("block_size", "gpu_memory_utilization"):   # vLLM's defaults where not given
        if getattr(args, flag, None):
            cmd += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    spec = speculative_config(method, args.k, args.ngram_k)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    if get_method(method).is_engine:
        options = {**ooospec_options(method, None, args.chain_cost_slope), "log_interval_s": args.log_interval}
        cmd += ["--additional-config", json.dumps({"ooospec": options})]
    return cmd


def wait_healthy(url: str, proc, log: Path, method: str, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
    """Until ``url/health`` answers; SystemExit naming ``log`` when the server exits or ``timeout_s`` passes."""
    from ooospec.runtime.sidecar.process import health

    deadline = time.time() + timeout_s
    while health(url) is None:
        if proc.poll() is not None:
            raise SystemExit(f"vllm-load: the {method} server exited ({proc.returncode}) before it was healthy; "
                             f"see {log}")
        if time.time() > deadline:
            raise SystemExit(f"vllm-load: the {method} server was not healthy after {timeout_s:.0f}s; see {log}")
        time.sleep(1)


def run_level(url: str, bodies: list[dict], ids: list[str], concurrency: int) -> tuple[list[dict], float]:
    """One level's requests (:func:`drive` over :func:`send_chat`, as many connections), rows with record ids."""
    import httpx

    async def go():
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
            return await drive(bodies, lambda b: send_chat(client, url, b), concurrency)

    rows, wall = asyncio.run(go())
    return [{"id": i, **r} for i, r in zip(ids, rows)], wall


def settle(url: str, body: dict, interval: float) -> None:
    """Wait ``interval``, send an untimed 2-token request: at its first step the proposer logs the window before."""
    time.sleep(interval)
    run_level(url, [{**body, "max_tokens": 2, "stream": False}], ["settle"], 1)


def environment_of(args) -> dict:
    """What the run ran on: ``vllm-bench``'s environment block (:func:`~ooospec.eval.vllm.runs.environment`) with
    this bench's settings (prefix caching, concurrency levels, stream modes)."""
    from ooospec.eval.vllm.runs import environment

    return {**environment(args), "max_model_len": MAX_MODEL_LEN, "prefix_caching": args.prefix_caching == "on",
            "warm_tools": False, "batch": max(args.levels), "served": True, "concurrency": args.levels,
            "stream": args.streams, "log_interval_s": args.log_interval, "rounds": args.rounds}
