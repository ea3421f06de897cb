"""The sidecar on vLLM (runtime/sidecar/vllm_engine.py) against a stand-in engine, and the LoRA merge it loads
(runtime/sidecar/lora.py) against PEFT's own merge. The real engine: the integration test at the end."""

from __future__ import annotations

import json
import os
import random
import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from ooospec.runtime.sidecar.lora import lora_pairs, lora_scale, merge_into, merge_weights
from ooospec.runtime.sidecar.vllm_engine import VllmWaves, top_k_logprobs
from ooospec.runtime.sidecar.wave import WaveCancelled

V, EOS, CACHE_BLOCK = 50, 0, 4


# ------------------------------------------------------------------------------------------ a stand-in vLLM


def next_token(seq) -> int:
    """The stand-in model's greedy choice: a fixed function of the last three tokens (EOS now and then)."""
    return (7 * seq[-1] + 3 * seq[-2] + seq[-3]) % V


@dataclass
class _Lp:
    logprob: float


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: object
    out: list[int] = field(default_factory=list)
    cached: int = 0
    finished: bool = False


class FakeEngine:
    """vLLM's ``LLMEngine`` surface the waves use: requests advance one token per step, a prompt's first step
    computes it (reusing cached blocks of ``CACHE_BLOCK`` tokens that an earlier step computed)."""

    def __init__(self):
        self.reqs: dict[str, _Req] = {}
        self.cached: set[tuple[int, ...]] = set()
        self.steps: list[list[tuple[str, int]]] = []     # per step: (request, tokens computed)
        self.aborted: list[str] = []

    def add_request(self, rid, prompt, params):
        self.reqs[rid] = _Req(rid, list(prompt["prompt_token_ids"]), params)

    def has_unfinished_requests(self):
        return any(not r.finished for r in self.reqs.values())

    def abort_request(self, ids):
        for rid in ids:
            self.aborted.append(rid)
            self.reqs.pop(rid, None)

    def _prefix_hit(self, prompt) -> int:
        n = 0
        while n + CACHE_BLOCK <= len(prompt) - 1 and tuple(prompt[:n + CACHE_BLOCK]) in self.cached:
            n += CACHE_BLOCK
        return n

    def step(self):
        live = [r for r in self.reqs.values() if not r.finished]
        computed = []
        for r in live:
            if not r.out:
                r.cached = self._prefix_hit(r.prompt)
                computed.append((r.rid, len(r.prompt) - r.cached))
            else:
                computed.append((r.rid, 1))
        for r in live:                 # blocks computed in this step are cached after it
            for n in range(CACHE_BLOCK, len(r.prompt) + 1, CACHE_BLOCK):
                self.cached.add(tuple(r.prompt[:n]))
            tok = next_token(r.prompt + r.out)
            r.out.append(tok)
            p = r.params
            r.finished = tok in p.stop_token_ids or len(r.out) >= p.max_tokens
        self.steps.append(computed)
        return [self._output(r) for r in live]

    def _output(self, r: _Req):
        k = r.params.logprobs
        lps = None
        if k:
            lps = []
            for i, tok in enumerate(r.out):
                seq = r.prompt + r.out[:i]
                best = next_token(seq)
                lps.append({best: _Lp(-0.1), (best + 1) % V: _Lp(-2.5), (best + 2) % V: _Lp(-3.0),
                            (best + 3) % V: _Lp(-9.0)})
        comp = types.SimpleNamespace(token_ids=list(r.out), logprobs=lps)
        return types.SimpleNamespace(request_id=r.rid, outputs=[comp], finished=r.finished,
                                     num_cached_tokens=r.cached)


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm.SamplingParams`` / ``vllm.inputs.TokensPrompt`` as plain records (no vLLM needed)."""
    vllm = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")

    def sampling_params(**kw):
        return types.SimpleNamespace(**kw)

    vllm.SamplingParams = sampling_params
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    engine = FakeEngine()
    return engine, VllmWaves(types.SimpleNamespace(llm_engine=engine, reset_prefix_cache=engine.cached.clear))


def greedy(prompt, max_new_tokens) -> list[int]:
    out = []
    while len(out) < max_new_tokens:
        out.append(next_token(prompt + out))
        if out[-1] == EOS:
            break
    return out


def _ids(rng, n):
    return [rng.randrange(1, V) for _ in range(n)]


# ------------------------------------------------------------------------------------------ waves


def test_every_answer_is_the_lone_greedy_decode_of_block_plus_query(fake_vllm):
    engine, waves = fake_vllm
    rng = random.Random(0)
    for trial in range(20):
        block = _ids(rng, rng.randrange(2, 30))
        queries = [_ids(rng, rng.randrange(1, 5)) for _ in range(rng.randrange(1, 6))]
        got, stats = waves.decode(block, queries, max_new_tokens=6, eos_token_ids=[EOS])
        assert got == [greedy(block + q, 6) for q in queries], trial
        assert stats["block_tokens"] == len(block) and stats["n_forwards"] >= 0
    assert not engine.has_unfinished_requests()


def test_the_first_query_prefills_the_block_alone_and_the_rest_reuse_it(fake_vllm):
    engine, waves = fake_vllm
    block, queries = list(range(1, 23)), [[30, 31], [32], [33, 34, 35]]
    waves.decode(block, queries, max_new_tokens=3, eos_token_ids=[])
    first, second = engine.steps[0], engine.steps[1]
    assert [n for _, n in first] == [len(block) + 2]                      # alone: block + its query
    assert len(second) == 3                                               # then the others join
    tail = len(block) % CACHE_BLOCK                                       # the block's last partial cache block
    others = sorted(n for rid, n in second if rid != first[0][0])
    assert others == [tail + 1, tail + 3]


def test_a_wave_on_the_last_waves_block_starts_every_query_at_once(fake_vllm):
    """A function-first wave's second stage: the block is cached, so no query waits for another."""
    engine, waves = fake_vllm
    block = list(range(1, 23))
    waves.decode(block, [[30]], max_new_tokens=2, eos_token_ids=[])
    engine.steps.clear()
    got, stats = waves.decode(block, [[31, 32], [33]], max_new_tokens=3, eos_token_ids=[EOS])
    assert got == [greedy(block + [31, 32], 3), greedy(block + [33], 3)]
    tail = len(block) % CACHE_BLOCK
    assert sorted(n for _, n in engine.steps[0]) == [tail + 1, tail + 2] and stats["prefill_s"] < 1.0
    waves.forget()                                # a forgotten block is computed by one query first again
    engine.steps.clear()
    waves.decode(block, [[31, 32], [33]], max_new_tokens=3, eos_token_ids=[])
    assert [n for _, n in engine.steps[0]] == [len(block) + 2]


def test_identical_queries_are_answered_once(fake_vllm):
    engine, waves = fake_vllm
    got, stats = waves.decode([5, 6, 7], [[1, 2], [3], [1, 2]], max_new_tokens=4, eos_token_ids=[EOS])
    assert got[0] == got[2] and len(engine.reqs) == 2 and stats["query_tokens"] == 3


def test_logprobs_are_the_top_k_of_each_answer_token(fake_vllm):
    _, waves = fake_vllm
    got, stats = waves.decode([5, 6, 7, 8], [[1], [2, 3]], max_new_tokens=4, eos_token_ids=[EOS], logprobs=2)
    for toks, steps in zip(got, stats["top_logprobs"]):
        assert len(steps) == len(toks)
        assert all(len(s) == 2 and max(s, key=s.get) == t for t, s in zip(toks, steps))


def test_top_k_logprobs_drops_the_sampled_token_outside_the_top_k():
    step = {4: _Lp(-0.5), 9: _Lp(-1.0), 2: _Lp(-7.0)}     # vLLM adds the sampled token (2) to its top-2
    assert top_k_logprobs(step, 2) == {4: -0.5, 9: -1.0}


def test_a_cancelled_wave_aborts_its_requests(fake_vllm):
    engine, waves = fake_vllm
    calls = []
    with pytest.raises(WaveCancelled):
        waves.decode([5, 6, 7, 8], [[1], [2]], max_new_tokens=8, eos_token_ids=[],
                     should_stop=lambda: calls.append(1) or len(calls) > 2)
    assert engine.aborted and not engine.has_unfinished_requests()
    got, _ = waves.decode([5, 6, 7, 8], [[1], [2]], max_new_tokens=3, eos_token_ids=[])
    assert got == [greedy([5, 6, 7, 8, 1], 3)[:3], greedy([5, 6, 7, 8, 2], 3)[:3]]


def test_prefill_reports_what_was_already_cached(fake_vllm):
    _, waves = fake_vllm
    block = list(range(1, 14))
    assert waves.prefill(block) == 0
    assert waves.prefill(block) == 12          # every full cache block below the last token


def test_bad_waves_are_refused(fake_vllm):
    _, waves = fake_vllm
    with pytest.raises(ValueError, match="empty"):
        waves.decode([], [[1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="at least one token"):
        waves.decode([1, 2], [[]], max_new_tokens=2)


# ------------------------------------------------------------------------------------------ the merge


def _tiny_lora(tmp_path, dtype):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    base = LlamaForCausalLM(cfg).to(dtype)
    base.save_pretrained(tmp_path / "base")
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"]))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.2)
    peft.save_pretrained(tmp_path / "adapter")
    return peft


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_merged_checkpoint_is_peft_merge_and_unload(tmp_path, dtype):
    """Bit for bit what PEFT's merge writes (in float32, rounded once to the base's dtype): the vLLM sidecar then
    runs the transformers sidecar's weights."""
    from safetensors.torch import load_file

    peft = _tiny_lora(tmp_path, dtype)
    want = {k: v for k, v in peft.merge_and_unload().state_dict().items()}
    out = merge_into(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged")
    got = load_file(str(out / "model.safetensors"))
    changed = [k for k in got if "proj" in k]
    assert changed and all(torch.equal(got[k], want[k]) for k in got if k in want), \
        [k for k in got if k in want and not torch.equal(got[k], want[k])][:3]
    assert (out / "config.json").is_file() and not (tmp_path / "merged.partial").exists()


def test_merge_errors_name_the_problem(tmp_path):
    _tiny_lora(tmp_path, torch.float32)
    pairs, config = lora_pairs(tmp_path / "adapter")
    assert lora_scale(config) == 2.0
    weights = {"model.layers.0.self_attn.q_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="does not match the base"):
        merge_weights(weights, pairs, 2.0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        merge_into(tmp_path / "empty", tmp_path / "adapter", tmp_path / "m")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        lora_pairs(tmp_path / "adapter")


# ------------------------------------------------------------------------------------------ the real engine


@pytest.mark.integration
@pytest.mark.slow
def test_real_vllm_waves_equal_each_querys_lone_greedy_decode(monkeypatch):
    """The shipped adapter merged and run on vLLM (fp32): every answer of a wave equals vLLM's greedy decoding of
    its block + query alone, warm or cold, and the joined call names the tool. Needs vLLM (``.venv-vllm``) and the
    base in the user's model cache (``ooospec models fetch qwen2.5-coder-0.5b``)."""
    pytest.importorskip("vllm")
    from pathlib import Path

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from ooospec.runtime.sidecar import prompts as sp
    from ooospec.runtime.sidecar.vllm_engine import VllmSidecar

    home = Path.home() / ".cache/ooospec"
    if not (home / "models/qwen2.5-coder-0.5b/hf/config.json").is_file():
        pytest.skip("no qwen2.5-coder-0.5b in ~/.cache/ooospec (ooospec models fetch qwen2.5-coder-0.5b)")
    monkeypatch.setenv("OOOSPEC_CACHE", str(home))
    sidecar = VllmSidecar.from_adapter(threads=min(2, os.cpu_count() or 1), dtype="fp32", max_new_tokens=24)
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["c", "f"]}},
                       "required": ["city"]}}},
             {"type": "function", "function": {"name": "get_time", "description": "Local time in a city.",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    lone = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=sidecar.eos_token_ids, detokenize=False)
    for content in ("What is the weather in Paris, in celsius?", "Time in Oslo please", "Weather in Rome?"):
        messages = [{"role": "user", "content": content}]
        wave = sp.build_wave(messages, tools, (), False, sidecar.layout)
        block, queries = sp.encode_wave(sidecar.tokenizer, wave)
        got, _ = sidecar.decode(block, queries, max_new_tokens=24)
        want = [list(sidecar.on_engine(sidecar.model.generate, [TokensPrompt(prompt_token_ids=list(block) + list(q))],
                                       lone, use_tqdm=False)[0].outputs[0].token_ids) for q in queries]
        assert got == want, content
    call, result = sidecar.predict([{"role": "user", "content": "What is the weather in Paris?"}], tools)
    assert call is not None and call["name"] == "get_weather" and result.n_forwards > 0


def test_the_engine_thread_runs_every_call_on_one_thread_and_raises_what_it_raises():
    import threading

    from ooospec.runtime.sidecar.vllm_engine import EngineThread

    run = EngineThread()
    names = {run(lambda: threading.current_thread().name) for _ in range(5)}
    assert len(names) == 1 and names != {threading.current_thread().name}
    with pytest.raises(WaveCancelled):
        run(lambda: (_ for _ in ()).throw(WaveCancelled("stop")))
    assert run(lambda a, b=0: a + b, 2, b=3) == 5
