"""A benchmark replayed as an agent's traffic through a chat server whose call log is on (the stand-in for a user's
own tool calls in eval/reports/own-calls/).

    # 1. an agent's traffic: replay a toolbox's requests through a chat server that logs them
    ooospec serve --target qwen2.5-coder-1.5b --method toolspec --call-log data/user/apibank-l1.jsonl &
    python -m ooospec.eval.sidecar.own_calls data/dedupe/eval/apibank-l1.jsonl --url http://127.0.0.1:8000 \
        --call-log data/user/apibank-l1.jsonl
    # 2. dvc repro pipelines/own_apibank/dvc.yaml     (ingest the log, tune sidecars on 3 sizes, evaluate)
    # 3. the learning curve report (also a stage of that pipeline): python -m ooospec.eval.sidecar.own_calls_report

``replay`` sends every record's messages and tools (sorted by id) as one OpenAI chat completion each, greedy, the
way an agent would, and skips the records the call log already holds (so a stopped replay resumes). The server's
call log, not this client, records what the target answered. ``report`` reads the runs' ``eval_sidecar`` metrics
(``<run>.json``, each with ``requests_trained``) and writes ``learning_curve.md`` / ``.json`` / ``.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from ooospec.pipelines.records import load_records, read_jsonl
from ooospec.runtime.calls import canonical_json
from ooospec.runtime.formats.messages import openai_messages


def request_key(messages: list[dict], tools: list[dict]) -> str:
    """What identifies one request in a call log: its wire messages and tools."""
    return canonical_json([messages, tools])


def logged_keys(log: Path) -> set[str]:
    """The requests a call log (and its rotated files) already holds."""
    keys = set()
    for f in sorted(log.parent.glob(log.name + "*")):
        for obj in read_jsonl(f):
            keys.add(request_key(obj["messages"][:-1], obj["tools"]))
    return keys


def post(url: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def replay(records: list[dict], url: str, *, model: str | None, max_tokens: int, skip: set[str],
           timeout_s: float = 600.0) -> dict:
    """Send each record not in ``skip`` to the server; returns counts (sent, skipped, with a call, seconds)."""
    counts = {"sent": 0, "skipped": 0, "answered_with_calls": 0, "errors": 0, "seconds": 0.0}
    for rec in tqdm(records, desc="replay", unit="req"):
        messages = openai_messages(rec["messages"])
        if request_key(messages, rec["tools"]) in skip:
            counts["skipped"] += 1
            continue
        body = {"messages": messages, "tools": rec["tools"], "temperature": 0, "max_tokens": max_tokens}
        if model:
            body["model"] = model
        t0 = time.perf_counter()
        try:
            answer = post(url, body, timeout_s)
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            counts["errors"] += 1
            print(f"replay: {rec['id']}: {e}", file=sys.stderr)
            continue
        counts["seconds"] += time.perf_counter() - t0
        counts["sent"] += 1
        counts["answered_with_calls"] += bool(answer["choices"][0]["message"].get("tool_calls"))
    counts["seconds"] = round(counts["seconds"], 1)
    return counts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", type=Path, help="records JSONL (data/dedupe/eval/<benchmark>.jsonl)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the chat server")
    p.add_argument("--model", default=None, help="the served model name (default: the server's)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--call-log", type=Path, default=None,
                   help="the server's call log: requests already in it are not sent again (resume)")
    p.add_argument("--limit", type=int, default=0, help="first N records by id (0 = all)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")


def run_cli(args: argparse.Namespace) -> int:
    records = sorted(load_records(args.dataset, "fail", what="benchmark records").rows, key=lambda r: r["id"])
    if args.limit:
        records = records[:args.limit]
    skip = logged_keys(args.call_log) if args.call_log and args.call_log.exists() else set()
    counts = replay(records, args.url, model=args.model, max_tokens=args.max_tokens, skip=skip,
                    timeout_s=args.timeout)
    print(json.dumps(counts))
    return 1 if counts["errors"] else 0


def main(argv: list[str] | None = None) -> int:
    from ooospec.pipelines.params import module_main
    return module_main("ooospec.eval.sidecar.own_calls", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
