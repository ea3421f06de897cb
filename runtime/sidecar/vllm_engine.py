"""The sidecar on vLLM: the adapter merged into its base, a wave as requests that share the block in the prefix cache.

vLLM (an in-process engine, offline API) loads the adapter merged into its base once
(:func:`~ooospec.runtime.sidecar.lora.merged_checkpoint`: the weights the transformers sidecar runs, not vLLM's
LoRA path). A wave (one block, N short queries) is N requests ``block + query_i``, greedy, stopped at EOS or
``max_new_tokens``. vLLM shares KV through its prefix cache, and a block becomes shareable once a request has
computed it, so the first query goes alone until its first token (its prefill computes and caches the block's full
KV blocks); the others then start from the cached block and recompute only its last partial KV block and their own
tokens, and every live query then advances one token per engine step (:class:`VllmWaves`). KV blocks are
:data:`DEFAULT_BLOCK_SIZE` tokens, not vLLM's CPU default of 128: each query recomputes the block's partial tail,
and a warm toolbox is cached only up to its last full KV block (measured: a function-first wave alone 18% faster at
the median on 30 ``bfcl-simple-python`` requests, ``eval/reports/sidecar/engines/`` section 4). The cache keeps
earlier blocks, so a wave whose toolbox an earlier wave saw prefills only its conversation (tools-first layout).

Answers are greedy decoding of ``block + query`` on vLLM in the sidecar's dtype: equal to the transformers
engine's where the two backends' kernels agree, a bf16 near-tie apart elsewhere (measured:
``eval/reports/sidecar/engines/``). Drafts are vLLM's own n-gram speculation (:data:`DEFAULT_NGRAM_TOKENS`: an
argument value is mostly a span of the conversation), verified greedily, so they change the steps, not the answers.

    sidecar = VllmSidecar.from_adapter("adapters/sidecar", threads=2, dtype="bf16")   # or engines.load_sidecar
    call, result = sidecar.predict(messages, tools)
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence

from ooospec.runtime.sidecar.wave import Sidecar, WaveCancelled, check_wave_args, measure_wave_cost

logger = logging.getLogger(__name__)

ENGINE = "vllm"
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "auto": "auto"}
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_NGRAM_TOKENS = 4   # n-gram drafts per query and step (0: none): same answers, waves 5-10% faster (p50)
DEFAULT_KV_GIB = 2          # VLLM_CPU_KVCACHE_SPACE when unset: the sidecar's blocks, not a target's batch
DEFAULT_BLOCK_SIZE = 32     # KV block, tokens (vLLM's CPU default: 128; its CPU attention takes multiples of 32)


def _first_tokens(outputs, ids: set[str]) -> set[str]:
    """The ids among ``outputs`` (one engine step's) that have produced a token."""
    return {o.request_id for o in outputs if o.request_id in ids and o.outputs and o.outputs[0].token_ids}


def top_k_logprobs(step, k: int) -> dict[int, float]:
    """vLLM's logprobs of one token (``{id: Logprob}``, the sampled token added when outside the top-k) as the
    top ``k`` ``{id: logprob}``, what the other engines return."""
    items = sorted(((int(i), float(lp.logprob)) for i, lp in step.items()), key=lambda x: -x[1])
    return dict(items[:k])


class VllmWaves:
    """Answers waves on one vLLM ``LLM`` (see the module docstring). Not thread-safe: one wave at a time, and the
    engine runs nothing else (its steps are this wave's)."""

    def __init__(self, llm):
        self.llm = llm
        self._ids = itertools.count()
        self.block: list[int] | None = None     # the last wave's block: its KV blocks are in the prefix cache

    def forget(self) -> None:
        """Drop every cached block (vLLM's prefix cache)."""
        self.llm.reset_prefix_cache()
        self.block = None

    @property
    def engine(self):
        return self.llm.llm_engine

    def _params(self, max_new_tokens: int, eos_token_ids: Sequence[int], logprobs: int):
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=list(eos_token_ids),
                              logprobs=logprobs or None, detokenize=False, skip_special_tokens=False)

    def _add(self, prompt: Sequence[int], params) -> str:
        from vllm.inputs import TokensPrompt

        rid = f"wave-{next(self._ids)}"
        self.engine.add_request(rid, TokensPrompt(prompt_token_ids=[int(t) for t in prompt]), params)
        return rid

    def _run(self, ids: set[str], until: Callable[[dict], bool], finished: dict, should_stop, when: str) -> int:
        """Step the engine until ``until(finished)``; outputs of ``ids`` land in ``finished`` (id -> last output;
        the finished ones flagged by vLLM). Returns the steps taken. On ``should_stop`` (WaveCancelled) or any error
        the wave's requests are aborted first."""
        steps = 0
        try:
            while not until(finished):
                if should_stop is not None and should_stop():
                    raise WaveCancelled(f"wave cancelled {when} after {steps} engine steps")
                outs = self.engine.step()
                steps += 1
                for o in outs:
                    if o.request_id in ids:
                        finished[o.request_id] = o
                if not outs and not self.engine.has_unfinished_requests():
                    raise RuntimeError("vLLM has no request left but the wave is not answered")
        except BaseException:            # cancelled or failed: none of the wave's requests stays in the engine
            self.engine.abort_request(list(ids))
            raise
        return steps

    def prefill(self, tokens: Sequence[int]) -> int:
        """Cache ``tokens``' KV (one request, one token, discarded); returns how many were already cached."""
        if not tokens:
            return 0
        rid = self._add(tokens, self._params(1, (), 0))
        seen: dict = {}
        self._run({rid}, lambda f: rid in f and f[rid].finished, seen, None, "in a prefill")
        return int(seen[rid].num_cached_tokens or 0)

    def decode(self, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
               eos_token_ids: Sequence[int] = (), should_stop: Callable[[], bool] | None = None,
               logprobs: int = 0) -> tuple[list[list[int]], dict]:
        """Greedy answers of ``block + query_i`` for every i (identical queries answered once): the tokens (EOS
        included when an answer ended on it) and :func:`~ooospec.runtime.sidecar.wave.decode_branches`'s stats;
        ``prefill_s`` is the first query's steps up to its first token (the block's prefill; none when the block is
        the last wave's, e.g. a function-first wave's second stage: every query starts at once), ``n_forwards`` the
        engine steps after it (the other queries' own tokens, then one token per live query and step)."""
        check_wave_args(block_ids, query_ids, max_new_tokens, 0)
        distinct = list(dict.fromkeys(tuple(int(t) for t in q) for q in query_ids))
        params = self._params(max_new_tokens, eos_token_ids, logprobs)
        block = [int(t) for t in block_ids]
        t0 = time.perf_counter()
        outs: dict = {}
        rids, prefill_steps = [], 0
        if block != self.block:      # a new block: the first query computes it alone, then it is shared
            rids.append(self._add(block + list(distinct[0]), params))
            prefill_steps = self._run(set(rids), lambda f: bool(_first_tokens(f.values(), set(rids))), outs,
                                      should_stop, "during the prefill")
        t1 = time.perf_counter()
        rids += [self._add(block + list(q), params) for q in distinct[len(rids):]]
        self.block = block
        n_forwards = self._run(set(rids), lambda f: all(r in f and f[r].finished for r in rids), outs, should_stop,
                               "while decoding")
        t2 = time.perf_counter()
        answers = {q: outs[r].outputs[0] for q, r in zip(distinct, rids)}
        tokens = [list(answers[tuple(int(t) for t in q)].token_ids) for q in query_ids]
        logger.debug("wave: %d prefill steps, %d decode steps", prefill_steps, n_forwards)
        stats = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_forwards": n_forwards,
                 "block_tokens": len(block), "query_tokens": sum(len(q) for q in distinct), "drafted": 0,
                 "accepted": 0, "cached_tokens": int(outs[rids[0]].num_cached_tokens or 0)}
        if logprobs:
            stats["top_logprobs"] = [[top_k_logprobs(step, logprobs) for step in answers[tuple(q)].logprobs or []]
                                     for q in query_ids]
        return tokens, stats


class EngineThread:
    """Runs every call on one thread, the one that built the engine: vLLM's CPU worker binds the OpenMP threads of
    the thread that initialises it to the cores, and a forward from another thread (a server's worker pool) may run
    on an unbound team instead. One thread also serialises the engine's users."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-sidecar")

    def __call__(self, fn, *args, **kwargs):
        return self.pool.submit(fn, *args, **kwargs).result()


class VllmSidecar(Sidecar):
    """A :class:`~ooospec.runtime.sidecar.wave.Sidecar` whose waves run on vLLM (``engine = "vllm"``); ``run``: the
    :class:`EngineThread` its engine lives on (None: the caller's thread)."""

    engine = ENGINE

    def __init__(self, llm, tokenizer, *, dtype: str = "auto", threads: int | None = None,
                 run: EngineThread | None = None, **kwargs):
        kwargs["max_draft_nodes"] = 0          # vLLM's own n-gram drafts, not the AnswerDrafter's trees
        super().__init__(llm, tokenizer, **kwargs)
        self.waves = VllmWaves(llm)
        self._dtype = dtype
        self._threads = threads
        self.on_engine = run or (lambda fn, *a, **k: fn(*a, **k))   # call(fn, ...) on the engine's thread

    @classmethod
    def from_adapter(cls, adapter_dir=None, *, threads: int | None = None, dtype: str = "auto",
                     max_new_tokens: int = 48, max_model_len: int = DEFAULT_MAX_MODEL_LEN,
                     ngram_tokens: int = DEFAULT_NGRAM_TOKENS, block_size: int = DEFAULT_BLOCK_SIZE,
                     gpu_memory: float | None = None, **_ignored) -> VllmSidecar:
        """The adapter merged into its base (made once), on an in-process vLLM engine with prefix caching on;
        ``ngram_tokens`` (0: off) drafts by vLLM's n-gram speculation (values copied from the conversation), which
        changes the steps, never the answers; ``block_size``: tokens per KV block (a multiple of 32 on CPU);
        ``gpu_memory``: on a GPU, the share of its memory the engine takes (None: vLLM's default)."""
        from transformers import AutoTokenizer
        from vllm import LLM

        from ooospec.runtime.backends.hardware import available_cores, vllm_cpu_env
        from ooospec.runtime.paths import sidecar_adapter_dir
        from ooospec.runtime.sidecar import prompts as sp
        from ooospec.runtime.sidecar.lora import merged_checkpoint

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        adapter_dir = sidecar_adapter_dir(adapter_dir)
        meta = sp.read_metadata(adapter_dir)
        model = merged_checkpoint(adapter_dir)
        vllm_cpu_env(threads or available_cores(), kvcache_gb=DEFAULT_KV_GIB)
        spec = ({"method": "ngram", "num_speculative_tokens": ngram_tokens, "prompt_lookup_max": 4,
                 "prompt_lookup_min": 2} if ngram_tokens > 0 else None)
        llm = LLM(model=str(model), tokenizer=str(model), dtype=DTYPES[dtype], max_model_len=max_model_len,
                  enable_prefix_caching=True, seed=0, speculative_config=spec, block_size=block_size,
                  **({} if gpu_memory is None else {"gpu_memory_utilization": gpu_memory}))
        tok = AutoTokenizer.from_pretrained(str(adapter_dir))
        return cls(llm, tok, dtype=dtype, threads=threads, max_new_tokens=max_new_tokens, metadata=meta)

    @property
    def vocab_size(self) -> int:
        return int(self.model.llm_engine.model_config.get_vocab_size())

    @property
    def threads(self) -> int:
        from ooospec.runtime.backends.hardware import available_cores

        return int(self._threads or available_cores())

    @property
    def weights(self) -> str:
        return str(self.model.llm_engine.model_config.dtype).removeprefix("torch.")

    def decode(self, block, queries, *, max_new_tokens: int, should_stop=None, logprobs: int = 0):
        return self.on_engine(self.waves.decode, block, queries, max_new_tokens=max_new_tokens,
                         eos_token_ids=self.eos_token_ids, should_stop=should_stop, logprobs=logprobs)

    def prefill(self, block: str) -> int:
        ids = self.tokenizer(block, add_special_tokens=False)["input_ids"]
        return max(len(ids) - 1 - self.on_engine(self.waves.prefill, ids[:-1]), 0)

    def cache_info(self) -> dict:
        return {"kind": "vLLM prefix cache"}

    def reset_cache(self) -> None:
        self.on_engine(self.waves.forget)

    def calibrate(self, **wave) -> dict:
        def cold(block, queries, *, max_new_tokens, **_drafts):   # every run prefills its block
            self.waves.forget()
            return self.waves.decode(block, queries, max_new_tokens=max_new_tokens)

        return self.on_engine(measure_wave_cost, None, vocab_size=self.vocab_size, max_draft_nodes=0, decode=cold,
                              **wave)
