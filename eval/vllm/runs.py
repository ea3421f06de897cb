"""One vLLM bench method's timed requests: its engine settings, run offline (``LLM.generate``) or through ``vllm
serve`` (``--serve-lora``), batch 1, one request after the other (the command line is :mod:`ooospec.eval.vllm.bench`).

    rows = run_method(args, method, records, prompts, sampling, reference)   # one row per request, in order

An ooo-spec method runs as vLLM's ``custom_class`` proposer (:data:`PROPOSER`); vLLM's own by what they draft with
(:func:`speculative_config`). Per request a row holds the wall time, the new tokens and text, and vLLM's spec-decode
counters over the call (:data:`COUNTERS`: drafts, draft tokens, accepted tokens).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ooospec.eval.vllm.waves import WAVE_FIRST, WaveFirst, sidecar_wave
from ooospec.runtime.backends.hardware import vllm_dtype
from ooospec.runtime.backends.quantize import SCHEMES as QUANT_SCHEMES
from ooospec.runtime.backends.quantize import quantization_of
from ooospec.runtime.methods import OOOSPEC, ORACLE, TOOLSPEC, VLLM_REFERENCE, get_method
from ooospec.runtime.sidecar.process import wave_requests
from ooospec.runtime.sidecar.prompts import SERVED_NAME
from ooospec.runtime.tokens import common_prefix_len
from ooospec.runtime.vllm.proposer import HINT_COUNTERS

PROPOSER = "ooospec.runtime.vllm.OoOSpecProposer"
PAIRED_HISTORY = "paired-toolspec"           # --paired: the toolspec arm's drafter history (apart from the method's)
WARMUP_HISTORY = "gate-warmup"               # --gate-warmup: its requests' drafter history (apart from the timed arms')
SCHEDULED = ("dedicated", WAVE_FIRST)        # deployments whose hints reach vLLM as a schedule in the request
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")


def speculative_config(method: str, k: int, ngram_k: int) -> dict | None:
    """The engine's ``speculative_config`` for ``method`` (None: plain decoding): ours as vLLM's ``custom_class``
    proposer, vLLM's own by what they draft with (prompt lookup: ``ngram``; ``suffix``)."""
    m = get_method(method)
    if m.is_engine:
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    if "pld" in m.drafters:
        return {"method": "ngram", "num_speculative_tokens": ngram_k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
    if "suffix" in m.drafters:
        return {"method": "suffix", "num_speculative_tokens": k}
    return None


def ooospec_options(method: str, sidecar_url: str | None, slope: float, wave: dict | None = None) -> dict:
    """``additional_config["ooospec"]`` of an ooo-spec method: the served method the proposer runs (a ceiling runs as
    the method that takes hints, its hints coming with each request)."""
    m = get_method(method)
    options = {"method": OOOSPEC if m.takes_hints else TOOLSPEC, "chain_cost_slope": slope}
    if m.uses_sidecar and sidecar_url and m.deployment is None:   # dedicated: the bench replays a measured wave
        options["sidecar_url"] = sidecar_url
        if wave:
            options.update(sidecar_wave=wave["wave"], sidecar_top_k=wave["top_k"],
                           sidecar_gate=wave.get("gate", "off"))
    return options


def add_engine_arguments(p) -> None:
    """The vLLM engine options every vLLM bench takes (``p``: an argparse parser)."""
    p.add_argument("--threads", type=int, default=2, help="CPU threads (VLLM_CPU_OMP_THREADS_BIND=0-(N-1))")
    p.add_argument("--dtype", default="auto", type=vllm_dtype, help="auto: float32 without native bf16, else bfloat16")
    p.add_argument("--quantized", default=None, choices=sorted(QUANT_SCHEMES), metavar="SCHEME",
                   help=f"a cached quantized checkpoint (`ooospec models quantize`; {', '.join(QUANT_SCHEMES)})")
    p.add_argument("--k", type=int, default=16, help="num_speculative_tokens of the ooo-spec methods")
    p.add_argument("--ngram-k", type=int, default=8, help="num_speculative_tokens of vllm-ngram")
    p.add_argument("--chain-cost-slope", type=float, default=0.02)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--block-size", type=int, default=None, help="KV cache block tokens: the prefix cache's unit")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="on a GPU: the share of its memory the target's engine takes (vLLM's default 0.9; less when "
                        "a sidecar server runs on the same GPU)")


def request_xargs(method: str, record: dict, reference_text: str | None, schedule: list | None = None) -> dict:
    """A request's ``extra_args``: its tools and messages (JSON text), the oracle's hint, and the dedicated
    emulation's hint schedule (``[[after_s, calls], ...]`` of the wave timed alone, :func:`dedicated_schedules`)."""
    m = get_method(method)
    if not m.is_engine:
        return {}
    xargs = {"ooospec_tools": json.dumps(record["tools"]), "ooospec_messages": json.dumps(record["messages"])}
    if m.hints == ORACLE:
        if reference_text is None:
            raise ValueError(f"{method} needs the {VLLM_REFERENCE!r} output of {record['id']!r} first")
        xargs["ooospec_hint"] = reference_text
    if m.deployment in SCHEDULED:
        if schedule is None:
            raise ValueError(f"{method} needs the hint schedule of {record['id']!r} (its wave) first")
        xargs["ooospec_hint_schedule"] = json.dumps(schedule)
    return xargs


def counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters and the proposer's hint counters now (zeros for plain decoding)."""
    out = dict.fromkeys(COUNTERS + HINT_COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in out:
            out[metric.name] += float(getattr(metric, "value", 0.0) or 0.0)
    return out


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where ``a`` and ``b`` first differ (the shorter's length if one prefixes the other); None if equal."""
    n = common_prefix_len(a, b)
    return None if n == len(a) == len(b) else n


def margin_at(logprobs, position: int) -> float | None:
    """The top-2 logprob margin behind the reference token at ``position`` (vLLM ``logprobs=2``)."""
    if logprobs is None or position >= len(logprobs) or not logprobs[position]:
        return None
    values = sorted((lp.logprob for lp in logprobs[position].values()), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def next_token_margins(llm, prompts: Sequence[Sequence[int]], extra_args: dict | None = None) -> list[float | None]:
    """The top-2 logprob margin of the next token after each prompt (token ids), by ``llm`` (a vLLM ``LLM``) in one
    untimed greedy batch; ``extra_args`` e.g. ``{"ooospec": "off"}`` for an engine that drafts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=2, extra_args=extra_args)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [margin_at(o.outputs[0].logprobs, 0) for o in outs]


def engine_kwargs(args, method: str) -> dict:
    kw = {"model": args.model_dir, "tokenizer": args.model_dir, "dtype": args.dtype,
          "max_model_len": args.max_model_len, "enable_prefix_caching": bool(getattr(args, "warm_tools", False)),
          "seed": 0, "disable_log_stats": False, "max_num_seqs": 1}
    kw.update({k: getattr(args, k) for k in ("gpu_memory_utilization", "block_size") if getattr(args, k, None)})
    spec = speculative_config(method, args.k, args.ngram_k)
    if spec is not None:
        kw["speculative_config"] = spec
    if get_method(method).is_engine:
        kw["additional_config"] = {"ooospec": ooospec_options(method, args.sidecar_url, args.chain_cost_slope,
                                                              sidecar_wave(args))}
    return kw


def warm_block(llm, ids: Sequence[int], block: int | None) -> None:
    """``--warm-tools``: the engine's prefix cache holds exactly the request's first ``block`` tokens (its system +
    tools block) and nothing else; no-op without a block (cold)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    if block:
        llm.reset_prefix_cache()
        llm.generate([TokensPrompt(prompt_token_ids=list(ids[:block]))], SamplingParams(temperature=0.0, max_tokens=1),
                     use_tqdm=False)


def toolspec_arm(llm, params: dict, record: dict, ids: Sequence[int], block: int | None) -> dict:
    """``--paired``: the request again on the same engine as ``toolspec`` (no hints: no schedule and no sidecar; a
    drafter history of its own, :data:`PAIRED_HISTORY`), from the same cache state; its seconds, tokens, accepted."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    warm_block(llm, ids, block)
    sp = SamplingParams(**params, extra_args={**request_xargs(TOOLSPEC, record, None),
                                              "ooospec_history": PAIRED_HISTORY})
    before = counters(llm)
    t = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0].outputs[0]
    wall = time.perf_counter() - t
    after = counters(llm)
    return {"toolspec_s": wall, "tokens": list(out.token_ids),
            "accepted": int(after[COUNTERS[2]] - before[COUNTERS[2]])}


def warm_gate(llm, wave_first: WaveFirst, method: str, params: dict, warmup: dict) -> None:
    """``--gate-warmup``: each of ``warmup``'s requests (``{"records", "prompts", "blocks"}``: requests that are not
    timed) run as a timed one would (the same cache state, the wave if the gate sends it, then the target) and teach
    the gate; nothing is recorded. A deployed gate has seen earlier traffic on its machine; these are that traffic.
    The target's drafters learn from them in a history of their own (:data:`WARMUP_HISTORY`): the timed arms (this
    method's and ``--paired``'s toolspec) start from the same drafter state, else the method would retrieve from the
    warm-up's calls and its pair would not."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    blocks = warmup.get("blocks")
    for i, (record, ids) in enumerate(zip(warmup["records"], warmup["prompts"])):
        warm_block(llm, ids, blocks[i] if blocks else None)
        wave_first.prepare(record)
        before = counters(llm)
        t = time.perf_counter()
        schedule, wave = wave_first.run(record, t)
        sp = SamplingParams(**params, extra_args={**request_xargs(method, record, None, schedule),
                                                  "ooospec_history": WARMUP_HISTORY})
        out = llm.generate([TokensPrompt(prompt_token_ids=list(ids))], sp, use_tqdm=False)[0].outputs[0]
        wall = time.perf_counter() - t
        after = counters(llm)
        accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
        tokens = len(out.token_ids)
        wave_first.observe(wall - wave["wave_s"], tokens, max(tokens - accepted, 1),
                           hint_only=int(after[HINT_COUNTERS[1]] - before[HINT_COUNTERS[1]]), text=out.text)
        decision = (wave["decision"] or {}).get("decision", "-")
        print(f"[vllm-bench] gate warm-up {record['id']}: {decision}, {wall:.2f}s", file=sys.stderr)
    gate = wave_first.client.gate
    print(f"[vllm-bench] gate after {len(warmup['records'])} warm-up requests: {gate.summary()['decisions']}, "
          f"accept {gate.estimates().accept_rate}", file=sys.stderr)


def run_method(args, method: str, records: list[dict], prompts: list[list[int]], params,
               reference: dict[str, dict]) -> list[dict]:
    """Build the method's engine, warm it up, time every request; rows in record order."""
    from vllm import LLM

    if get_method(method).prefill_only:        # time to the first token: the prompt's forward
        params = {**params, "max_tokens": 1}
    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(args, method))
    run = MethodRun(args, method, params, reference, load_s=time.perf_counter() - t0)
    try:
        run.warm_up(llm, records[0], prompts[0])
        rows = [run.timed(llm, i, record, ids) for i, (record, ids) in enumerate(zip(records, prompts))]
    finally:
        del llm
        gc.collect()
    return rows


class MethodRun:
    """One method's timed requests on one engine: the hint schedules, the wave-first deployment and its gate, the
    paired ``toolspec`` arm, and the row each request leaves (:meth:`timed`)."""

    def __init__(self, args, method: str, params: dict, reference: dict[str, dict], *, load_s: float):
        self.args, self.method, self.params, self.reference, self.load_s = args, method, params, reference, load_s
        self.schedules = dict(getattr(args, "hint_schedules", None) or {})
        self.wave_first = WaveFirst.for_run(args) if get_method(method).deployment == WAVE_FIRST else None
        self.sidecar = engine_kwargs(args, method).get("additional_config", {}).get("ooospec", {}).get("sidecar_url")
        self.blocks = getattr(args, "blocks", None)
        self.paired = self.wave_first is not None and bool(getattr(args, "paired", False))
        self.requests_before: int | None = None

    def warm_up(self, llm, record: dict, ids: list[int]) -> None:
        """The engine's untimed first request (16 tokens of the first record; no wave), then ``--gate-warmup``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.wave_first is not None:
            self.schedules[record["id"]] = []          # the warm-up request: no wave
        xargs = request_xargs(self.method, record, self.reference.get(record["id"], {}).get("text"),
                              self.schedules.get(record["id"])) or None
        if self.wave_first is not None and xargs is not None:    # its history stays the paired arm's alike
            xargs = {**xargs, "ooospec_history": WARMUP_HISTORY}
        warm = SamplingParams(**{**self.params, "max_tokens": 16}, extra_args=xargs)
        llm.generate([TokensPrompt(prompt_token_ids=ids)], warm, use_tqdm=False)
        if self.wave_first is not None and (getattr(self.args, "warmup", None) or {}).get("records") \
                and self.wave_first.client.gate is not None:
            warm_gate(llm, self.wave_first, self.method, self.params, self.args.warmup)

    def prepare(self, llm, record: dict, ids: list[int], block: int | None) -> None:
        """Untimed, before the request's clock: the engine's cache state, the sidecar idle (and cold when the
        toolbox is), the wave-first server holding the request's toolbox."""
        warm_block(llm, ids, block)
        if self.sidecar:       # the previous request's wave may still run: untimed, let it finish
            from ooospec.runtime.sidecar.process import reset_prefix_cache, wait_idle

            wait_idle(self.sidecar)
            if not self.blocks:    # a cold toolbox: the sidecar holds no earlier block either
                reset_prefix_cache(self.sidecar)
            self.requests_before = wave_requests(self.sidecar)
        if self.wave_first is not None:
            self.wave_first.prepare(record)

    def timed(self, llm, i: int, record: dict, ids: list[int]) -> dict:
        """Request ``i``, timed from its arrival (the wave-first wave inside the clock), as a row."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        block = self.blocks[i] if self.blocks else None
        pair = toolspec_arm(llm, self.params, record, ids, block) if self.paired and i % 2 else None   # odd: first
        self.prepare(llm, record, ids, block)
        sp = None if self.wave_first is not None else SamplingParams(     # wave-first: once its wave is in
            **self.params, extra_args=request_xargs(self.method, record, self.reference.get(record["id"], {}).get(
                "text"), self.schedules.get(record["id"])) or None)
        before = counters(llm)
        t = time.perf_counter()
        wave = None
        if self.wave_first is not None:       # inside the clock: the wave, waited for, then the target
            self.schedules[record["id"]], wave = self.wave_first.run(record, t)
            sp = SamplingParams(**self.params, extra_args=request_xargs(self.method, record, None,
                                                                        self.schedules[record["id"]]))
        result = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t
        out = result.outputs[0]
        row = self.row(record, ids, out, wall, before, counters(llm))
        row["cached_tokens"] = getattr(result, "num_cached_tokens", None)   # prompt tokens the prefix cache served
        if self.sidecar and self.requests_before is not None:   # the shared deployment's waves, as its server saw
            after = wave_requests(self.sidecar, settle=True)
            row.update({} if after is None else {"sidecar_requests": after - self.requests_before})
        if wave is not None:
            row["wave"] = wave
            self.wave_first.observe(wall - wave["wave_s"], row["new_tokens"], row["forwards"],
                                    hint_only=row["hint_only_accepted"], text=out.text)
        if self.paired:
            first = "toolspec" if pair is not None else self.method
            pair = pair or toolspec_arm(llm, self.params, record, ids, block)
            row["paired"] = {"toolspec_s": pair["toolspec_s"], "toolspec_accepted": pair["accepted"],
                             "same_tokens": pair["tokens"] == row["tokens"], "first": first}
        print(f"[vllm-bench] {self.method} {record['id']}: {wall:.2f}s, {row['new_tokens']} tokens, "
              f"{row['accepted']} accepted", file=sys.stderr)
        return row

    def row(self, record: dict, ids: list[int], out, wall: float, before: dict, after: dict) -> dict:
        """The request's row: seconds, tokens, text and vLLM's counters over the call (and the hint counters of a
        method that takes hints, the schedule's release times where it had one)."""
        tokens = list(out.token_ids)
        accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
        extra = {"released_s": [s for s, _ in self.schedules[record["id"]]]} if record["id"] in self.schedules else {}
        if get_method(self.method).takes_hints or self.wave_first is not None:
            extra.update(hint_accepted=int(after[HINT_COUNTERS[0]] - before[HINT_COUNTERS[0]]),
                         hint_only_accepted=int(after[HINT_COUNTERS[1]] - before[HINT_COUNTERS[1]]))
        return {**extra, "record_id": record["id"], "method": self.method, "prompt_len": len(ids), "time_s": wall,
                "new_tokens": len(tokens), "tokens": tokens, "text": out.text,
                "drafts": int(after[COUNTERS[0]] - before[COUNTERS[0]]),
                "draft_tokens": int(after[COUNTERS[1]] - before[COUNTERS[1]]),
                "accepted": accepted, "forwards": max(len(tokens) - accepted, 1), "load_s": self.load_s}


def run_margins(args, prompts: list[list[int]], params: dict, outputs: list[list[int]]) -> list[list[float | None]]:
    """``--classify``: vLLM plain's top-2 logprob margin at each output position of each prompt (what the near-tie
    classification reads), on a fresh plain engine of the run's settings, untimed greedy requests one at a time.
    Each list stops at the first position where this re-run parts from the timed run's tokens (``outputs``): beyond
    it the margins would be another continuation's."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**engine_kwargs(args, VLLM_REFERENCE))
    try:
        margins_for = SamplingParams(**params, logprobs=2)
        out = []
        for ids, output in zip(prompts, outputs):
            lp = llm.generate([TokensPrompt(prompt_token_ids=ids)], margins_for, use_tqdm=False)[0].outputs[0]
            margins = [margin_at(lp.logprobs, i) for i in range(len(lp.token_ids))]
            parted = first_divergence(lp.token_ids, output)
            out.append(margins if parted is None else margins[:parted + 1])
    finally:
        del llm
        gc.collect()
    return out


def server_command(args, method: str, port: int) -> list[str]:
    """``--serve-lora``: the OpenAI server of one method; the sidecar adapter is a LoRA module of the same engine,
    and ``ooospec`` sends its waves to that same server, so they are batched with the target's steps."""
    kw = engine_kwargs(args, method)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kw["model"], "--port", str(port),
           "--dtype", kw["dtype"], "--max-model-len", str(kw["max_model_len"]), "--no-enable-prefix-caching",
           "--seed", "0", "--max-num-seqs", str(args.server_max_seqs), "--enable-lora", "--max-lora-rank", "64",
           "--lora-modules", f"{SERVED_NAME}={args.serve_lora}"]
    if "gpu_memory_utilization" in kw:
        cmd += ["--gpu-memory-utilization", str(kw["gpu_memory_utilization"])]
    if "speculative_config" in kw:
        cmd += ["--speculative-config", json.dumps(kw["speculative_config"])]
    if "additional_config" in kw:
        options = dict(kw["additional_config"]["ooospec"])
        if get_method(method).uses_sidecar:
            options.update(sidecar_url=f"http://127.0.0.1:{port}", sidecar_model=SERVED_NAME)
        cmd += ["--additional-config", json.dumps({"ooospec": options})]
    return cmd


def stop_server(proc, timeout_s: float = 60.0) -> None:
    """Terminate a server process; kill it when it has not exited after ``timeout_s``, and whatever it started
    (vLLM's engine core) that still runs."""
    from ooospec.runtime.sidecar.process import stop_tree

    stop_tree(proc, timeout_s)


def scrape_counters(url: str) -> dict[str, float]:
    """The spec-decode counters of a server's ``/metrics`` (Prometheus text)."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        for name in COUNTERS:
            if line.startswith(name + "_total"):
                out[name] += float(line.split()[-1])
    return out


def wait_idle(url: str, timeout_s: float = 120.0) -> None:
    """Until the server runs and queues no request (its ``/metrics`` gauges), at most ``timeout_s``."""
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        busy = sum(float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
        if busy == 0:
            return
        time.sleep(0.05)


def run_server_method(args, method: str, records: list[dict], prompts: list[list[int]], params: dict,
                      reference: dict[str, dict]) -> list[dict]:
    """:func:`run_method` against ``vllm serve`` (``--serve-lora``), timed at the client, one request at a time."""
    import subprocess
    import urllib.request

    from ooospec.runtime.sidecar.process import free_port, health

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(Path(args.out).with_suffix(f".{method}.server.log"), "w")   # noqa: SIM115 - closed below
    proc = subprocess.Popen(server_command(args, method, port), stdout=log, stderr=subprocess.STDOUT)

    def post(ids: list[int], record: dict, max_tokens: int) -> dict:
        ref = reference.get(record["id"], {})
        body = {"model": args.model_dir, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                "stop": params["stop"], "stop_token_ids": params["stop_token_ids"],
                "include_stop_str_in_output": True, "skip_special_tokens": False, "return_token_ids": True,
                "vllm_xargs": request_xargs(method, record, ref.get("text")) or None}
        req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=600).read())["choices"][0]

    rows = []
    try:
        deadline = time.time() + 900
        while health(url) is None:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"vllm-bench: the {method} server did not start; see {log.name}")
            time.sleep(1)
        post(prompts[0], records[0], 16)
        for record, ids in zip(records, prompts):
            before = scrape_counters(url)
            t = time.perf_counter()
            choice = post(ids, record, params["max_tokens"])
            wall = time.perf_counter() - t
            wait_idle(url)        # the sidecar's wave (ooospec) may still run: let it finish, untimed
            after = scrape_counters(url)
            tokens = list(choice.get("token_ids") or [])
            accepted = int(after[COUNTERS[2]] - before[COUNTERS[2]])
            rows.append({"record_id": record["id"], "method": method, "prompt_len": len(ids), "time_s": wall,
                         "new_tokens": len(tokens), "tokens": tokens, "text": choice["text"],
                         "drafts": int(after[COUNTERS[0]] - before[COUNTERS[0]]),
                         "draft_tokens": int(after[COUNTERS[1]] - before[COUNTERS[1]]),
                         "accepted": accepted, "forwards": max(len(tokens) - accepted, 1), "served": True})
            print(f"[vllm-bench] served {method} {record['id']}: {wall:.2f}s, {len(tokens)} tokens, "
                  f"{accepted} accepted", file=sys.stderr)
    finally:
        stop_server(proc)
        log.close()
    return rows

def sampling_params(model_dir: str, tokenizer, fmt, max_new_tokens: int) -> dict:
    """Greedy, batch 1, the same stop rule for every method: the target's EOS ids and the format's closing tag."""
    eos = sorted({t for t in (tokenizer.eos_token_id, *_gen_eos(model_dir)) if t is not None})
    stop = fmt.call_suffix.strip()
    return {"temperature": 0.0, "max_tokens": max_new_tokens, "stop_token_ids": eos,
            "stop": [stop] if stop else None, "include_stop_str_in_output": True, "skip_special_tokens": False}


def _gen_eos(model_dir: str) -> list[int]:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def environment(args) -> dict:
    """A vLLM run's ``env`` block: vLLM's version, the CPU and its flags, threads, dtype, the drafting settings and
    the vLLM CPU env; a bench adds or overrides its own keys."""
    from importlib.metadata import PackageNotFoundError, version

    from ooospec.runtime.backends.hardware import cpu_info

    vllm_version = "not installed"
    for dist in ("vllm", "vllm-cpu"):         # vLLM's CPU build is its own distribution
        try:
            vllm_version = f"{version(dist)} ({dist})"
            break
        except PackageNotFoundError:
            continue
    return {"vllm": vllm_version, "python": platform.python_version(), "cpu": cpu_info(),
            "threads": args.threads, "dtype": args.dtype,
            "quantization": quantization_of(args.model_dir) if getattr(args, "model_dir", None) else None,
            "k": args.k, "ngram_k": getattr(args, "ngram_k", None),
            "max_model_len": getattr(args, "max_model_len", None), "max_new_tokens": args.max_new_tokens,
            "prefix_caching": bool(getattr(args, "warm_tools", False)), "block_size": getattr(args, "block_size", None),
            "warm_tools": bool(getattr(args, "warm_tools", False)), "batch": 1,
            "chain_cost_slope": args.chain_cost_slope, "argv": sys.argv[1:],
            "served": bool(getattr(args, "serve_lora", None)),
            "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                                   "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_AOT_COMPILE")}}
