"""The sidecar server: an OpenAI-compatible ``POST /v1/completions`` that answers a wave in ONE pass.

Run it with ``ooospec sidecar serve [--adapter DIR] [--host 127.0.0.1] [--port 8765] [--threads T] [--cpus 1]``
(loopback by default; the server has no authentication). Endpoints: ``POST /v1/completions``,
``GET /v1/models``, ``GET /health``, ``POST /reset_prefix_cache`` (forget every earlier block, as vLLM's
endpoint of that name: a bench's cold start).

A request is a list of prompts (or one string), decoded greedily: ``max_tokens``, ``stop`` (strings cut from the
text), ``model`` (must be the served name, ``sidecar``). The response has the usual shape, ``{"id", "object":
"text_completion", "created", "model", "choices": [{"index", "text", "finish_reason", "logprobs": null}],
"usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}``, plus an ``ooospec`` object with the wave's
timings (``prefill_s``, ``decode_s``, ``n_forwards``, ``block_tokens``, ``query_tokens``, ``shared_block``,
``queue_s``, ``tokenize_s``) and its draft counts (``drafted``, ``accepted``: see
:class:`~ooospec.runtime.sidecar.wave.AnswerDrafter`).

A wave's prompts (:func:`~ooospec.runtime.sidecar.prompts.build_wave`) are one shared block followed by a short
query line each. The server finds that block -- the prompts' common text prefix, cut back to its last ``"\\n"``
(:func:`split_shared_block`) -- tokenizes the block once and each query apart, and decodes every answer as a
branch of one pass (:func:`~ooospec.runtime.sidecar.wave.decode_branches`): one prefill of the block instead of one
per prompt. Prompts without such a block (or whose split tokenization disagrees with tokenizing the whole
prompt, see below) are tokenized whole and still answered exactly, sharing their common token prefix.

Tokenization, and running the same client against vLLM: vLLM tokenizes each full prompt, this server tokenizes
block and query apart (as training does, :func:`~ooospec.runtime.sidecar.prompts.encode_wave`). For the
sidecar's prompts (every layout: the block ends with ``"\\n"``, the query starts with ``Query:``) the two agree on
byte-level BPE tokenizers (GPT-2, SmolLM2, Qwen2/2.5/3, Llama 3): their pre-tokenizers always split between a
newline and a following letter, and BPE merges never cross a split. The server checks this per request on the
first prompt and for queries starting with whitespace, and tokenizes whole prompts when it fails (e.g.
SentencePiece tokenizers that add a prefix space to the query). ``tests/runtime/serve/test_sidecar_app.py`` tests
the claim on byte-level BPE tokenizers trained in the test. The GPU deployment of the paper serves the same
adapter with vLLM::

    vllm serve BASE --enable-lora --lora-modules sidecar=DIR --enable-prefix-caching

(``BASE`` = the adapter's base model, ``DIR`` = the adapter folder); the client
(:mod:`ooospec.runtime.sidecar.client`) sends ``temperature: 0`` and ``add_special_tokens: false`` so that both
servers see the prompts as training did.

Limits (:class:`Limits`, checked by :mod:`~ooospec.runtime.serve.admission` before any forward, all answered with
4xx and an OpenAI-style ``{"error": {...}}`` body): request body size (413) and the time it may take to arrive
(408), prompt count, prompt length in tokens, the wave's prompt and query tokens, ``max_tokens`` and ``max_tokens``
x prompts, the logits one forward holds (400), waiting requests (429). Unsupported sampling options
(``temperature > 0``, ``n > 1``, ``stream``, ``echo``, ``logprobs``) are refused with 400: this server decodes
greedily only. One wave runs at a time (the model is not shared between threads); ``/health`` answers while a
wave runs. A wave stops at its next forward when its client disconnects, or when a shutdown's grace period
(``shutdown_grace_s``) is over.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import anyio
from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict

from ooospec.runtime.agent.session import PrefixCache
from ooospec.runtime.serve.admission import TransportLimits, admitted, at_most, read_request, watched
from ooospec.runtime.serve.http import RequestError, add_error_handlers, is_loopback, server_config
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.engines import load_sidecar
from ooospec.runtime.sidecar.wave import Sidecar, WaveCancelled, by_text

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8765
DEFAULT_PREFIX_CACHE_TOKENS = 16384   # ~400 MB of fp32 KV for a 0.5B Qwen2.5 sidecar (24 KB per token)
MODEL_NAME = sp.SERVED_NAME
MAX_LOGPROBS = 5                # OpenAI's bound on a completions request's ``logprobs``


@dataclass(frozen=True)
class Limits(TransportLimits):
    """Per-request limits (the transport ones, body / queue / connection, from :class:`TransportLimits`); a
    request over any of them gets a 4xx answer, never a partial one."""

    max_body_bytes: int = 16 << 20      # 413 (a wave repeats its block in every prompt: 40 x 20 KB = 0.8 MB)
    max_prompts: int = 1024             # 400
    max_stops: int = 16                 # 400, stop strings
    max_prompt_tokens: int = 8192       # 400, per prompt (block + query)
    max_wave_query_tokens: int = 4096   # 400, the query tokens (after the shared block) of all prompts together
    max_wave_tokens: int = 65536        # 400, every token the wave prefills (each pass's block once + its queries)
    max_forward_logits: int = 1 << 27   # 400, logits one forward keeps: nodes x vocab (512 MiB in fp32)
    max_tokens: int = 512               # 400, the request's max_tokens
    max_wave_new_tokens: int = 32768    # 400, max_tokens x prompts


class CompletionRequest(BaseModel):
    """The subset of OpenAI's completions request this server honours; other fields are ignored."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    prompt: str | list[str]
    model: str | None = None
    max_tokens: int = 16                # OpenAI's and vLLM's default
    stop: str | list[str] | None = None
    temperature: float | None = None
    n: int = 1
    best_of: int | None = None
    stream: bool = False
    echo: bool = False
    logprobs: int | None = None
    add_special_tokens: bool = True     # vLLM's extension; the client sends False (prompts as in training)


# ------------------------------------------------------------------------------------------ pure parts


def split_shared_block(prompts: Sequence[str]) -> tuple[str, list[str]] | None:
    """The prompts' shared block and the query after it in each; None when they share no line.

    The block is the common text prefix cut back to its last ``"\\n"``, short enough that every query keeps at
    least one character::

        >>> split_shared_block(["Conv\\nTools\\nQuery: a\\n", "Conv\\nTools\\nQuery: b\\n"])
        ('Conv\\nTools\\n', ['Query: a\\n', 'Query: b\\n'])
        >>> split_shared_block(["x\\nQuery: a\\n"])          # one prompt: its last line is the query
        ('x\\n', ['Query: a\\n'])
        >>> split_shared_block(["abc", "abd"]) is None
        True
    """
    if not prompts:
        return None
    common = os.path.commonprefix(list(prompts))
    shortest = min(len(p) for p in prompts)
    cut = common.rfind("\n", 0, min(len(common), shortest - 1)) + 1
    if cut == 0:
        return None
    return common[:cut], [p[cut:] for p in prompts]


def common_token_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix all of ``seqs`` share: ``[[1, 2, 3], [1, 2, 4]] -> 2``."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != first[i] for s in seqs):
            return i
    return n


@dataclass
class Group:
    """Prompts answered by one ``decode_branches`` pass: a shared block and each prompt's rest."""

    block: list[int]
    queries: list[list[int]]
    members: list[int]          # prompt indices, one per query


def tokenize_prompts(tokenizer, prompts: Sequence[str], add_special_tokens: bool) -> tuple[list[Group], bool]:
    """Tokenize ``prompts`` into passes; returns ``(groups, shared_block)``.

    Fast path (``shared_block=True``): a text block (:func:`split_shared_block`) tokenized once, every query
    apart, one group -- taken only when no query starts with whitespace and the first prompt tokenized whole
    gives the same ids. Otherwise every prompt is tokenized whole; prompts sharing a token prefix form one group
    (the longest common prefix of all, at least one token, each prompt keeping at least one token after it), and
    without any common prefix each prompt is its own group. Either way ``block + query`` are a prompt's ids.
    """
    split = split_shared_block(prompts)
    if split is not None and not any(q[0].isspace() for q in split[1]):
        block_text, query_texts = split
        block = list(tokenizer(block_text, add_special_tokens=add_special_tokens)["input_ids"])
        queries = [list(q) for q in tokenizer(query_texts, add_special_tokens=False)["input_ids"]]
        whole = list(tokenizer(prompts[0], add_special_tokens=add_special_tokens)["input_ids"])
        if block and all(queries) and whole == block + queries[0]:
            return [Group(block, queries, list(range(len(prompts))))], True
    ids = [list(x) for x in tokenizer(list(prompts), add_special_tokens=add_special_tokens)["input_ids"]]
    for i, x in enumerate(ids):
        if len(x) < 2:
            raise RequestError(400, f"prompt {i} is {len(x)} token(s); this server needs at least 2", "prompt")
    n = min(common_token_prefix(ids), min(len(x) for x in ids) - 1)
    if n >= 1:
        return [Group(ids[0][:n], [x[n:] for x in ids], list(range(len(ids))))], False
    return [Group(x[:-1], [x[-1:]], [i]) for i, x in enumerate(ids)], False


def finish_text(text: str, tokens: Sequence[int], eos_token_ids: Sequence[int],
                stop: Sequence[str]) -> tuple[str, str]:
    """``(text, finish_reason)``: cut at the first stop string (``"stop"``), else ``"stop"`` after EOS and
    ``"length"`` at the token cap. ``finish_text("ab;c", [..], [], [";"]) -> ("ab", "stop")``."""
    cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if cuts:
        return text[:min(cuts)], "stop"
    return text, "stop" if tokens and tokens[-1] in eos_token_ids else "length"


def check_wave(groups: Sequence[Group], limits: Limits, *, vocab_size: int, max_draft_nodes: int) -> None:
    """Refuse (400) a tokenized wave whose passes would be too much work, before any forward.

    A pass prefills its block, then runs the block's last token and all its query tokens in one forward, then one
    draft tree (at most ``1 + max_draft_nodes`` nodes) per distinct answer per forward; each forward keeps
    ``nodes x vocab`` logits.
    """
    for g in groups:
        for q, i in zip(g.queries, g.members):
            if len(g.block) + len(q) > limits.max_prompt_tokens:
                raise RequestError(400, f"prompt {i} is {len(g.block) + len(q)} tokens, over the limit "
                                        f"{limits.max_prompt_tokens}", "prompt")
    num_query = sum(len(q) for g in groups for q in g.queries)
    at_most(num_query, limits.max_wave_query_tokens, "the wave's query tokens (after the shared block)", "prompt")
    at_most(sum(len(g.block) for g in groups) + num_query, limits.max_wave_tokens, "the wave's prompt tokens",
            "prompt")
    nodes = max(max(1 + sum(len(q) for q in g.queries), len(g.queries) * (1 + max_draft_nodes)) for g in groups)
    at_most(nodes * vocab_size, limits.max_forward_logits, f"the logits of one forward ({nodes} nodes x "
                                                           f"{vocab_size} vocab)", "prompt")


def complete(sidecar: Sidecar, prompts: Sequence[str], *, max_tokens: int, stop: Sequence[str] = (),
             add_special_tokens: bool = True, limits: Limits = Limits(),
             should_stop: Callable[[], bool] | None = None, logprobs: int = 0) -> dict:
    """Greedy completions of ``prompts``: ``{"choices", "usage", "ooospec"}`` (no id/model; see :func:`create_app`).

    Each choice's text equals greedy decoding of its prompt alone, cut after EOS, at ``max_tokens`` or at the
    first stop string. ``should_stop`` (polled before every forward) abandons the work with
    :class:`~ooospec.runtime.sidecar.wave.WaveCancelled`. ``logprobs`` (k > 0): each choice carries OpenAI's legacy
    ``logprobs`` object for its tokens (:func:`openai_logprobs`).
    """
    tok = sidecar.tokenizer
    t0 = time.perf_counter()
    groups, shared = tokenize_prompts(tok, prompts, add_special_tokens)
    t1 = time.perf_counter()
    check_wave(groups, limits, vocab_size=sidecar.vocab_size, max_draft_nodes=sidecar.max_draft_nodes)
    eos = list(sidecar.eos_token_ids)
    out: list[list[int]] = [[] for _ in prompts]
    stats = {"prefill_s": 0.0, "decode_s": 0.0, "n_forwards": 0, "block_tokens": 0, "query_tokens": 0,
             "drafted": 0, "accepted": 0, "cached_tokens": 0}
    top: list[list[dict[int, float]]] = [[] for _ in prompts]
    for g in groups:
        toks, st = sidecar.decode(g.block, g.queries, max_new_tokens=max_tokens, should_stop=should_stop,
                                  logprobs=logprobs)
        for j, (i, t) in enumerate(zip(g.members, toks)):
            out[i] = t
            if logprobs:
                top[i] = st["top_logprobs"][j]
        for k in stats:
            stats[k] += st[k]
    choices = []
    for i, (text, toks) in enumerate(zip(tok.batch_decode(out, skip_special_tokens=True), out)):
        text, reason = finish_text(text, toks, eos, stop)
        choices.append({"index": i, "text": text, "finish_reason": reason,
                        "logprobs": openai_logprobs(tok, toks, top[i]) if logprobs else None})
    prompt_tokens = sum(len(g.block) + len(q) for g in groups for q in g.queries)
    completion_tokens = sum(len(t) for t in out)
    return {"choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "ooospec": {**stats, "tokenize_s": t1 - t0, "shared_block": shared, "num_passes": len(groups)}}


def openai_logprobs(tokenizer, tokens: Sequence[int], top: Sequence[Mapping[int, float]]) -> dict:
    """OpenAI's legacy completions ``logprobs`` object (vLLM's too) for one choice: ``tokens``, ``token_logprobs``
    (None where the token is not among the top-k), ``top_logprobs`` (text -> logprob) and ``text_offset``."""
    texts = [tokenizer.decode([t]) for t in tokens]
    offsets, at = [], 0
    for t in texts:
        offsets.append(at)
        at += len(t)
    return {"tokens": texts, "token_logprobs": [step.get(t) for t, step in zip(tokens, top)],
            "top_logprobs": [by_text(tokenizer, step) for step in top],
            "text_offset": offsets}


def check_request(req: CompletionRequest, served: str, limits: Limits) -> tuple[list[str], list[str]]:
    """``(prompts, stops)`` of a valid request; raises :class:`RequestError` (4xx) otherwise."""
    if req.model is not None and req.model != served:
        raise RequestError(404, f"The model `{req.model}` does not exist (served: {served!r}).", "model")
    if req.stream or req.echo or req.n != 1 or (req.best_of or 1) != 1:
        raise RequestError(400, "stream, echo, n > 1 and best_of > 1 are not supported: this server returns one "
                                "greedy completion per prompt")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise RequestError(400, f"logprobs={req.logprobs} outside [0, {MAX_LOGPROBS}]", "logprobs")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise RequestError(400, f"temperature={req.temperature} outside [0, 2]", "temperature")
    if req.temperature:
        raise RequestError(400, f"temperature={req.temperature}: this server decodes greedily only; send 0",
                           "temperature")
    if not 1 <= req.max_tokens <= limits.max_tokens:
        raise RequestError(400, f"max_tokens={req.max_tokens} outside [1, {limits.max_tokens}]", "max_tokens")
    prompts = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)
    if not 1 <= len(prompts) <= limits.max_prompts:
        raise RequestError(400, f"{len(prompts)} prompts; send between 1 and {limits.max_prompts}", "prompt")
    if any(not p for p in prompts):
        raise RequestError(400, "empty prompt", "prompt")
    at_most(len(prompts) * req.max_tokens, limits.max_wave_new_tokens, "max_tokens x prompts", "max_tokens")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > limits.max_stops:
        raise RequestError(400, f"{len(stops)} stop strings; at most {limits.max_stops}", "stop")
    return prompts, [s for s in stops if s]


# ------------------------------------------------------------------------------------------ the app


def create_app(sidecar: Sidecar, *, model_name: str = MODEL_NAME, limits: Limits = Limits()) -> FastAPI:
    """The FastAPI app serving ``sidecar`` (any object with ``model``, ``tokenizer``, ``eos_token_ids``)."""
    app = FastAPI(title="ooo-spec sidecar", docs_url=None, redoc_url=None)
    worker = anyio.CapacityLimiter(1)        # one wave at a time: the model and tokenizer are not shared
    state = {"waiting": 0, "running": 0, "requests": 0}     # requests: every valid wave request since start

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "layout_version": getattr(sidecar, "layout", None),
                "running": state["running"], "waiting": state["waiting"], "cancelled": state.get("cancelled", 0),
                "requests": state["requests"],
                "threads": sidecar.threads,
                "cpus": sorted(os.sched_getaffinity(0)), "engine": sidecar.engine, "dtype": sidecar.weights,
                "prefix_cache": sidecar.cache_info(),
                "calibration": getattr(sidecar, "calibration", None)}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "ooospec"}]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        async with worker:                     # after the running wave: the cache is the worker's
            await anyio.to_thread.run_sync(sidecar.reset_cache)
        return {"status": "ok", "prefix_cache": sidecar.cache_info()}

    @app.post("/v1/completions")
    async def completions(request: Request):
        t_arrival = time.perf_counter()
        req = await read_request(request, CompletionRequest, limits,
                                 max_items={"prompt": limits.max_prompts, "stop": limits.max_stops})
        prompts, stops = check_request(req, model_name, limits)
        state["requests"] += 1

        async def wave(stop) -> tuple[dict, float]:
            async with admitted(state, worker, limits):
                t_start = time.perf_counter()
                try:
                    return await anyio.to_thread.run_sync(
                        lambda: complete(sidecar, prompts, max_tokens=req.max_tokens, stop=stops,
                                         add_special_tokens=req.add_special_tokens, limits=limits,
                                         should_stop=stop.is_set, logprobs=req.logprobs or 0)), t_start
                except WaveCancelled:
                    state["cancelled"] = state.get("cancelled", 0) + 1
                    raise RequestError(499, "the client closed the request; its wave was abandoned") from None

        result, t_start = await watched(request, wave)
        result["ooospec"]["queue_s"] = t_start - t_arrival
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": model_name, **result}

    add_error_handlers(app)
    return app


def serve(adapter_dir: str | os.PathLike | None = None, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          threads: int | None = None, cpus: Sequence[int] | None = None, dtype: str = "fp32",
          limits: Limits = Limits(), prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS,
          calibrate: bool = True, engine: str = "transformers", gpu_memory: float | None = None) -> None:
    """Load the adapter (default: the shipped one) and serve it until SIGINT/SIGTERM.

    ``engine``: what answers the waves (:data:`~ooospec.runtime.sidecar.engines.ENGINES`): ``transformers`` (the base
    dequantized, ``dtype``), ``llama.cpp`` (the base's registry GGUF + the adapter as a llama.cpp LoRA; it keeps
    the last block in its KV instead of a prefix cache, so ``prefix_cache_tokens`` does not apply) or ``vllm``
    (the adapter merged into its base, vLLM's own prefix cache; ``prefix_cache_tokens`` does not apply either;
    ``gpu_memory``: on a GPU, the share of its memory that engine takes, leaving the rest to a target beside it).

    ``cpus`` pins this process (and so every thread torch starts) to those cores before anything is loaded.
    ``prefix_cache_tokens``: the block KV kept for later waves (:class:`~ooospec.runtime.agent.session.PrefixCache`,
    LRU; 0 = none): a tools-first adapter's wave then prefills only what follows the longest block prefix an
    earlier wave computed -- its conversation, once its toolbox has been seen.
    ``calibrate``: before serving, time one synthetic wave (:func:`~ooospec.runtime.sidecar.wave.measure_wave_cost`,
    a few seconds) and report it in ``/health`` as ``calibration``: clients' wave gates price waves with it.
    """
    import uvicorn

    if cpus:
        os.sched_setaffinity(0, set(cpus))
    if not is_loopback(host):
        logger.warning("serving on %s: the sidecar server has no authentication; keep it on loopback "
                       "(127.0.0.1) unless the network is yours", host)
    sidecar = load_sidecar(adapter_dir, threads=threads, dtype=dtype, engine=engine, gpu_memory=gpu_memory)
    if prefix_cache_tokens > 0 and sidecar.engine == "transformers":
        sidecar.prefix_cache = PrefixCache(max_tokens=prefix_cache_tokens)
    if calibrate:
        sidecar.calibration = sidecar.calibrate()
        logger.info("wave cost on this machine: %.2f ms per prefill token, %.1f ms per decode forward of %d "
                    "queries (calibration took %.1f s)", 1e3 * sidecar.calibration["prefill_per_token"],
                    1e3 * sidecar.calibration["decode_forward_s"], sidecar.calibration["num_queries"],
                    sidecar.calibration["seconds"])
    app = create_app(sidecar, limits=limits)
    logger.info("sidecar serving on http://%s:%d (engine=%s, threads=%s, cpus=%s)", host, port, sidecar.engine,
                threads, cpus)
    uvicorn.Server(server_config(app, host=host, port=port, keep_alive_s=limits.keep_alive_s,
                                 grace_s=limits.shutdown_grace_s)).run()
