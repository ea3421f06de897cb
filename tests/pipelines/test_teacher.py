"""teacher stage: gold / transformers (tiny random model) / openai backends, selection, resume byte-identity."""

import dataclasses
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from ooospec.pipelines import teacher
from ooospec.pipelines.records import read_jsonl
from ooospec.runtime import formats

FIXTURE = Path(__file__).parents[1] / "fixtures" / "train_records.jsonl"
RECORDS = list(read_jsonl(FIXTURE))
GOLD = teacher.TeacherParams(backend="gold")


def _run(params, tmp_path, name="traces.jsonl"):
    out = tmp_path / name
    stats = teacher.run(params, FIXTURE, out, metrics_path=tmp_path / "teacher.json",
                        timings_path=tmp_path / "timings.jsonl")
    return out, stats


def test_gold_traces_parse_back_to_the_gold_calls(tmp_path):
    out, stats = _run(GOLD, tmp_path)
    rows = list(read_jsonl(out))
    assert [r["id"] for r in rows] == sorted(r["id"] for r in RECORDS)
    by_id = {r["id"]: r for r in RECORDS}
    for row in rows:
        assert row["format"] == "hermes" and row["finish"] == "stop" and "seconds" not in row
        assert formats.get_format("hermes").parse_calls(row["text"]) == by_id[row["id"]]["calls"]
    multi = next(r for r in rows if r["id"] == "sealtools/train/12045")
    assert multi["text"].count("<tool_call>") == 2
    assert stats["num_traces"] == len(RECORDS) and stats["num_decoded"] == len(RECORDS)
    assert json.loads((tmp_path / "teacher.json").read_text())["params"]["backend"] == "gold"
    assert [json.loads(x)["id"] for x in (tmp_path / "timings.jsonl").read_text().splitlines()] == \
        [r["id"] for r in rows]
    assert not teacher.partial_path(out).exists()


def test_limit_selects_a_seeded_sorted_subset():
    ids = [r["id"] for r in RECORDS]
    a = teacher.select_ids(ids, 3, seed=0)
    assert a == sorted(a) and len(a) == 3 and a == teacher.select_ids(ids[::-1], 3, seed=0)
    assert teacher.select_ids(ids, None, seed=0) == sorted(ids)
    assert any(teacher.select_ids(ids, 3, seed=s) != a for s in range(1, 6))


class _Interrupt:
    """Wrap a backend factory so that decoding raises KeyboardInterrupt once ``after`` records are done."""

    def __init__(self, factory, after):
        self.factory, self.after, self.count = factory, after, 0

    def __call__(self, params):
        backend = self.factory(params)
        inner = backend.decode

        def decode(records):
            if self.count >= self.after:
                raise KeyboardInterrupt
            self.count += len(records)
            return inner(records)

        backend.decode = decode
        return backend


def _interrupted_then_resumed(monkeypatch, params, tmp_path, after):
    out = tmp_path / "resumed" / "traces.jsonl"
    with monkeypatch.context() as m:
        m.setitem(teacher.BACKENDS, params.backend, _Interrupt(teacher.BACKENDS[params.backend], after))
        with pytest.raises(KeyboardInterrupt):
            teacher.run(params, FIXTURE, out, metrics_path=None)
    part = teacher.partial_path(out)
    assert not out.exists() and len(part.read_text().splitlines()) == 1 + after  # header + finished traces
    stats = teacher.run(params, FIXTURE, out, metrics_path=None)
    assert stats["num_resumed"] == after
    return out, stats


def test_gold_resume_after_interrupt_is_byte_identical(monkeypatch, tmp_path):
    full, _ = _run(GOLD, tmp_path)
    resumed, stats = _interrupted_then_resumed(monkeypatch, GOLD, tmp_path, after=3)
    assert stats["num_decoded"] == len(RECORDS) - 3
    assert resumed.read_bytes() == full.read_bytes()


def test_torn_last_line_is_dropped_and_redone(tmp_path):
    full, _ = _run(GOLD, tmp_path)
    out = tmp_path / "torn" / "traces.jsonl"
    part = teacher.partial_path(out)
    part.parent.mkdir()
    rows = list(read_jsonl(full))
    header = json.dumps({"fingerprint": teacher.fingerprint(GOLD)})
    part.write_text(header + "\n" + json.dumps({**rows[0], "seconds": 0.0}) + "\n" + '{"id": "apib')
    stats = teacher.run(GOLD, FIXTURE, out, metrics_path=None)
    assert stats["num_resumed"] == 1 and out.read_bytes() == full.read_bytes()


def test_partial_from_other_params_is_refused(monkeypatch, tmp_path):
    out = tmp_path / "traces.jsonl"
    with monkeypatch.context() as m:
        m.setitem(teacher.BACKENDS, "gold", _Interrupt(teacher.BACKENDS["gold"], 2))
        with pytest.raises(KeyboardInterrupt):
            teacher.run(GOLD, FIXTURE, out, metrics_path=None)
    with pytest.raises(ValueError, match=r"differs in \['format'\]"):
        teacher.run(dataclasses.replace(GOLD, format="json"), FIXTURE, out, metrics_path=None)
    # params outside the fingerprint (limit, seed, batch size ...) may change between runs
    stats = teacher.run(dataclasses.replace(GOLD, limit=4, seed=1), FIXTURE, out, metrics_path=None)
    assert stats["num_traces"] == 4


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="teacher.backend must be one of"):
        teacher.TeacherParams(backend="hf")


# ---------------------------------------------------------------- transformers backend, tiny random model

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    " Call as <tool_call>{json}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_target():
    """A byte-level toy tokenizer (hermes chat template) and a 2-layer random Qwen2 in fp32."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|pad|>")
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    tok.chat_template = CHAT_TEMPLATE
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval(), tok


@pytest.fixture
def patched_load_target(monkeypatch, tiny_target):
    from ooospec.runtime.backends import models

    calls = []

    def fake_load_target(name, dtype="bf16", threads=None, cache=None):
        calls.append((name, dtype, threads))
        return tiny_target

    monkeypatch.setattr(models, "load_target", fake_load_target)
    torch.set_num_threads(1)
    return calls


TF = teacher.TeacherParams(backend="transformers", model="tiny", max_new_tokens=6, limit=3, seed=0)


def test_transformers_backend_decodes_greedily_with_token_counts(patched_load_target, tiny_target, tmp_path):
    model, tok = tiny_target
    out, stats = _run(TF, tmp_path)
    assert patched_load_target == [("tiny", "auto", None)]
    rows = list(read_jsonl(out))
    by_id = {r["id"]: r for r in RECORDS}
    fmt = formats.get_format("hermes")
    for row in rows:
        rec = by_id[row["id"]]
        prompt = fmt.render_prompt(tok, rec["messages"], rec["tools"])
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert row["num_prompt_tokens"] == ids.shape[1]
        with torch.inference_mode():   # plain HF greedy (a random model completes no call in 6 tokens)
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=TF.max_new_tokens,
                                 do_sample=False, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        ended_by_eos = ref[-1] == tok.eos_token_id
        assert row["num_new_tokens"] == len(ref)
        assert row["text"] == tok.decode(ref[:-1] if ended_by_eos else ref, skip_special_tokens=False)
        assert row["finish"] == ("stop" if ended_by_eos or len(ref) < TF.max_new_tokens else "length")
        assert row["format"] == "hermes" and row["model"] == "tiny"
    assert stats["new_tokens"] == sum(r["num_new_tokens"] for r in rows)
    assert stats["new_tokens_per_s"] > 0 and stats["records_per_s"] > 0


def test_transformers_resume_after_interrupt_is_byte_identical(patched_load_target, monkeypatch, tmp_path):
    full, _ = _run(TF, tmp_path)
    resumed, _ = _interrupted_then_resumed(monkeypatch, TF, tmp_path, after=1)
    assert resumed.read_bytes() == full.read_bytes()


class _ScriptedModel:
    """Emits a fixed token script through HF's stopping-criteria protocol (what ``generate`` does greedily)."""

    def __init__(self, script, eos_id):
        self.script = script
        self.generation_config = type("GC", (), {"eos_token_id": eos_id})()

    def generate(self, input_ids, attention_mask, generation_config, stopping_criteria):
        ids = input_ids
        for t in self.script[:generation_config.max_new_tokens]:
            ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
            if t == generation_config.eos_token_id[0] or stopping_criteria(ids, None).all():
                break
        return ids


def test_transformers_stops_at_end_of_call_only_for_single_call_records(monkeypatch, tiny_target):
    from ooospec.runtime.backends import models

    _, tok = tiny_target
    two_calls = ('<tool_call>\n{"name": "search_flights", "arguments": {}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "book_hotel", "arguments": {}}\n</tool_call>')
    script = tok(two_calls, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    monkeypatch.setattr(models, "load_target", lambda *a, **k: (_ScriptedModel(script, tok.eos_token_id), tok))
    backend = teacher.TransformersBackend(dataclasses.replace(TF, max_new_tokens=200))
    by_id = {r["id"]: r for r in RECORDS}
    single, multi = backend.decode([by_id["sealtools/train/12051"], by_id["sealtools/train/12045"]])
    first_call = two_calls[:two_calls.index("</tool_call>") + len("</tool_call>")]
    assert (single.text, single.finish) == (first_call, "stop")
    assert (multi.text, multi.finish, multi.num_new_tokens) == (two_calls, "stop", len(script))
    capped = teacher.TransformersBackend(dataclasses.replace(TF, max_new_tokens=5)).decode([by_id[
        "sealtools/train/12045"]])[0]
    assert capped.finish == "length" and capped.num_new_tokens == 5


# ---------------------------------------------------------------- vllm backend against a fake vllm module

@pytest.mark.parametrize("on_cpu", [False, True])
def test_vllm_backend_chunks_token_prompts(monkeypatch, tiny_target, tmp_path, on_cpu):
    """The offline-LLM call convention, checked against a stand-in module; on vLLM's CPU backend the engine gets
    the threads, KV-cache space and in-process engine core by env defaults (a user's exported values win)."""
    import sys
    import types

    _, tok = tiny_target
    made, batches = [], []

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, **kw):
            made.append(kw)

        def get_tokenizer(self):
            return tok

        def generate(self, prompts, sampling, use_tqdm):
            batches.append(len(prompts))
            assert sampling.kw == {"temperature": 0.0, "max_tokens": 7, "skip_special_tokens": False}
            out = types.SimpleNamespace
            return [out(prompt_token_ids=p["prompt_token_ids"],
                        outputs=[out(text=f"n={len(p['prompt_token_ids'])}", token_ids=[1, 2],
                                     finish_reason="stop")])
                    for p in prompts]

    platform = types.SimpleNamespace(is_cpu=lambda: on_cpu)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=platform))
    for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")      # the user's own value is kept
    params = teacher.TeacherParams(backend="vllm", model="Qwen/Qwen2.5-32B-Instruct", max_new_tokens=7,
                                   batch_size=3, tensor_parallel_size=2, threads=2, max_model_len=4096)
    out, stats = _run(params, tmp_path)
    assert made == [{"model": "Qwen/Qwen2.5-32B-Instruct", "tensor_parallel_size": 2, "seed": 0, "dtype": "auto",
                     "max_model_len": 4096, "max_num_seqs": 3}]
    assert batches == [3, 3, 2] and stats["num_traces"] == len(RECORDS)
    for row in read_jsonl(out):
        assert row["text"] == f"n={row['num_prompt_tokens']}" and row["format"] == "hermes"
    env = {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                          "VLLM_ENABLE_V1_MULTIPROCESSING")}
    if on_cpu:
        assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "7",
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    else:
        assert env == {"VLLM_CPU_OMP_THREADS_BIND": None, "VLLM_CPU_KVCACHE_SPACE": "7",
                       "VLLM_ENABLE_V1_MULTIPROCESSING": None}


# ---------------------------------------------------------------- openai backend against a local server

def test_openai_backend_posts_tools_and_keeps_raw_arguments(monkeypatch, tmp_path):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            args = '{"formula": "(23+19)*3"}' if body["messages"][-1]["content"].startswith("What") else '{"q": '
            reply = {"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "Calculator", "arguments": args}}]}}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 9}}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("TEST_TEACHER_KEY", "sk-secret-123")
        params = teacher.TeacherParams(backend="openai", model="served",
                                       openai_url=f"http://127.0.0.1:{server.server_port}/v1",
                                       openai_api_key_env="TEST_TEACHER_KEY")
        out, _ = _run(params, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert len(seen) == len(RECORDS)
    path, auth, body = seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-secret-123"
    assert body["temperature"] == 0 and body["model"] == "served" and body["tools"][0]["type"] == "function"
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert all(r["num_prompt_tokens"] == 50 and r["num_new_tokens"] == 9 for r in rows.values())
    parsed = {i: formats.get_format(r["format"]).parse_calls(r["text"]) for i, r in rows.items()}
    assert parsed.pop("apibank/train-lv3/Calculator-7#1") == \
        [{"name": "Calculator", "arguments": {"formula": "(23+19)*3"}}]
    assert all(p == [] for p in parsed.values())  # a torn argument string stays unparseable downstream
    for f in (out, tmp_path / "teacher.json", tmp_path / "timings.jsonl"):
        assert "sk-secret" not in f.read_text()
