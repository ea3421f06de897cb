"""The one-pass wave: every branch equals greedy decoding of its own prompt (tiny float64 models)."""

import json
import random

import pytest
import torch

from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.prompts import LayoutMismatch, join_answers, read_metadata
from ooospec.runtime.sidecar.wave import decode_branches
from tests.runtime.conftest import SLIDING_WINDOW, VOCAB


def _greedy_alone(model, prompt, max_new_tokens, eos):
    """Reference: plain HF greedy decoding of one prompt, cut after the first EOS."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False)[0, len(prompt):].tolist()
    for i, t in enumerate(out):
        if t in eos:
            return out[:i + 1]
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_each_branch_equals_greedy_on_its_own(make_model, family, seed):
    model = make_model(family)
    rng = random.Random(seed)
    block = [rng.randrange(VOCAB) for _ in range(SLIDING_WINDOW + 5)]
    common = [rng.randrange(VOCAB) for _ in range(2)]
    queries = [common + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))] for _ in range(4)]
    queries += [[rng.randrange(VOCAB)], list(queries[0])]      # a one-token query and a duplicate
    queries = [q if q else [7] for q in queries]
    eos = {rng.randrange(VOCAB) for _ in range(40)}            # some branches stop early, others run to the cap
    got, stats = decode_branches(model, block, queries, max_new_tokens=9, eos_token_ids=eos)
    for q, answer in zip(queries, got):
        assert answer == _greedy_alone(model, block + q, 9, eos), f"query {q}"
    assert got[0] == got[-1]                                   # the duplicate shares the branch
    assert stats["block_tokens"] == len(block)
    assert stats["n_forwards"] <= 9                             # about (longest answer) forwards, not per query


def test_branches_share_query_prefixes(make_model):
    model = make_model("llama")
    _, stats = decode_branches(model, [1, 2, 3], [[5, 6, 7], [5, 6, 8], [5, 9]], max_new_tokens=1)
    assert stats["query_tokens"] == 5            # 5,6,7 + 8 + 9: shared prefixes are one node
    assert stats["n_forwards"] == 1              # max_new_tokens=1: the forest forward gives every first token


def test_wave_rejects_empty_inputs(make_model):
    model = make_model("llama")
    with pytest.raises(ValueError, match="block is empty"):
        decode_branches(model, [], [[1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="at least one token"):
        decode_branches(model, [1], [[]], max_new_tokens=2)


def test_layout_version_is_checked(tmp_path):
    (tmp_path / "sidecar.json").write_text(json.dumps({"layout_version": 1}))      # no such layout
    with pytest.raises(LayoutMismatch, match="layout"):
        read_metadata(tmp_path)
    (tmp_path / "sidecar.json").write_text(json.dumps({"layout_version": sp.LAYOUT_VERSION, "base": "x"}))
    assert read_metadata(tmp_path)["base"] == "x"
    with pytest.raises(FileNotFoundError, match="sidecar.json"):
        read_metadata(tmp_path / "missing")


def test_join_answers_maps_answers_to_their_queries():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "g", "parameters": {"properties": {"c": {"type": "string"}}}}}]
    wave = sp.build_wave([{"role": "user", "content": "hi"}], tools, with_direct_call=True)
    answers = {"function_index": "0", ("f", "a"): '"x"', ("f", "b"): '"not an int"', ("g", "c"): '"y"'}
    texts = [answers.get(q.form) or answers.get((q.function, q.parameter)) or '{"name":"f","arguments":{"b":2}}'
             for q in wave.queries]
    call = join_answers(tools, wave, texts)
    assert call == {"name": "f", "arguments": {"a": "x"}, "direct_call": {"name": "f", "arguments": {"b": 2}}}


def test_a_cancelled_wave_stops_computing(make_model):
    from ooospec.runtime.sidecar.wave import WaveCancelled

    model = make_model("llama")
    polls = []

    def stop_after_two() -> bool:
        polls.append(1)
        return len(polls) > 2

    with pytest.raises(WaveCancelled, match="after 2 forwards"):
        decode_branches(model, [1, 2, 3], [[5], [6]], max_new_tokens=50, eos_token_ids=(), should_stop=stop_after_two)
    assert len(polls) == 3     # polled before each forward: the forest forward, one branch step, then stopped


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_drafts_change_forwards_never_answers(make_model, family, seed):
    """Adversarial drafts (right, wrong, EOS-carrying, longer than the cap) leave every branch's answer as it was."""
    model = make_model(family)
    rng = random.Random(seed)
    block = [rng.randrange(VOCAB) for _ in range(SLIDING_WINDOW + 3)]
    queries = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))] for _ in range(5)] + [[3, 4], [3, 4]]
    eos = {rng.randrange(VOCAB) for _ in range(30)}
    plain, plain_stats = decode_branches(model, block, queries, max_new_tokens=10, eos_token_ids=eos)

    def oracle_and_noise(i: int, generated):
        right = plain[i][len(generated):]                       # the true continuation (an oracle draft) ...
        wrong = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 5))]
        half = right[:rng.randint(0, len(right))] + wrong[:2]   # ... a right prefix going wrong, and noise
        return [c for c in (half, wrong, right + [next(iter(eos))] * 3) if rng.random() < 0.8]

    got, stats = decode_branches(model, block, queries, max_new_tokens=10, eos_token_ids=eos,
                                 propose=oracle_and_noise, max_draft_nodes=6)
    assert got == plain
    for q, answer in zip(queries, got):
        assert answer == _greedy_alone(model, block + q, 10, eos)
    assert stats["accepted"] > 0 and stats["drafted"] > stats["accepted"]
    assert stats["n_forwards"] <= plain_stats["n_forwards"]


@pytest.mark.parametrize("seed", [0, 1])
def test_per_branch_adversarial_drafts_leave_each_answer_greedy_alone(make_model, family, seed):
    """Each branch is drafted the OTHER branches' answers (accepted only if branches saw each other), its own
    answer shifted by one, EOS at once, the block's tail, and its true answer running past the cap; queries are
    prefixes of one another. Every answer stays greedy decoding of its own prompt (float64)."""
    model = make_model(family)
    rng = random.Random(seed)
    block = [rng.randrange(VOCAB) for _ in range(SLIDING_WINDOW + 2)]
    base = [rng.randrange(VOCAB) for _ in range(3)]
    queries = [base, base[:2], base + [rng.randrange(VOCAB)], [rng.randrange(VOCAB)], base[:1], base[:2]]
    eos = {rng.randrange(VOCAB) for _ in range(20)}
    stop = min(eos)
    expected = [_greedy_alone(model, block + q, 12, eos) for q in queries]

    def adversary(i: int, generated):
        assert generated == expected[i][:len(generated)]           # the branch so far is its own greedy answer
        own = expected[i][len(generated):]
        others = [e[len(generated):][:3] for e in expected if e != expected[i]]
        return others[:1] + [own + [stop] * 20] + others[1:] + [own[1:], [stop], block[-4:]]

    got, stats = decode_branches(model, block, queries, max_new_tokens=12, eos_token_ids=eos,
                                 propose=adversary, max_draft_nodes=10)
    assert got == expected
    assert got[1] == got[5] and stats["query_tokens"] == 5      # the duplicate shares a branch, prefixes share nodes
    assert stats["drafted"] > stats["accepted"] > 0


def test_a_one_token_block_is_the_root_of_the_query_tree(make_model):
    model = make_model("llama")
    got, stats = decode_branches(model, [5], [[6], [6, 7], [8]], max_new_tokens=6)
    assert got == [_greedy_alone(model, [5] + q, 6, set()) for q in ([6], [6, 7], [8])]
    assert stats["block_tokens"] == 1 and stats["query_tokens"] == 3


def test_an_oracle_draft_finishes_the_wave_in_two_forwards(make_model):
    model = make_model("llama")
    block, queries = [1, 2, 3, 4], [[5], [6, 7], [8]]
    plain, stats = decode_branches(model, block, queries, max_new_tokens=8)
    assert stats["n_forwards"] == 8
    got, stats = decode_branches(model, block, queries, max_new_tokens=8,
                                 propose=lambda i, gen: [plain[i][len(gen):]], max_draft_nodes=7)
    assert got == plain and stats["n_forwards"] == 2 and stats["accepted"] == 3 * 6


def test_answer_drafter_copies_from_the_prompt_and_closes_json():
    from ooospec.runtime.sidecar.wave import AnswerDrafter

    class CharTok:   # one token per character, ids = code points
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    tok = CharTok()
    block = tok.encode("user: weather in New York City?\n")
    drafter = AnswerDrafter(tok, block, [tok.encode("Query: city\n")], eos_token_id=0, num_pred_tokens=4)
    cands = drafter(0, tok.encode('"New Y'))
    assert tok.encode("ork ") in cands                     # copied from the conversation
    assert tok.encode('"') + [0] in cands                  # close the string, then EOS
    assert all(c[-1] != 0 for c in drafter(0, tok.encode("null")))   # a complete value gets no closer


def test_logprobs_follow_each_answer_token_with_or_without_drafts(make_model):
    model = make_model("llama")
    rng = random.Random(3)
    block = [rng.randrange(3, VOCAB) for _ in range(20)]
    queries = [[rng.randrange(3, VOCAB) for _ in range(3)] for _ in range(3)]
    plain, st = decode_branches(model, block, queries, max_new_tokens=6, logprobs=2)
    drafted, st2 = decode_branches(model, block, queries, max_new_tokens=6, logprobs=2, max_draft_nodes=4,
                                   propose=lambda i, out: [[rng.randrange(3, VOCAB) for _ in range(4)]])
    assert plain == drafted                  # drafts change forwards, never answers nor their log-probabilities
    for a, b in zip(st["top_logprobs"], st2["top_logprobs"]):
        for x, y in zip(a, b):
            assert x.keys() == y.keys() and all(x[k] == pytest.approx(y[k], abs=1e-9) for k in x)
    for toks, steps in zip(drafted, st2["top_logprobs"]):
        assert len(steps) == len(toks)
        assert all(max(step, key=step.get) == t for t, step in zip(toks, steps))


def test_auto_engine_is_measured_once_and_cached(tmp_path, monkeypatch):
    import math

    from ooospec.runtime.sidecar import engines as sidecar

    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path / "cache"))
    adapter = tmp_path / "a"
    adapter.mkdir()
    (adapter / "sidecar.json").write_text(json.dumps({"layout_version": 3, "base": "qwen2.5-coder-0.5b"}))
    monkeypatch.setattr("ooospec.runtime.backends.llamacpp.available", lambda: (True, "test"))
    monkeypatch.setattr(sidecar, "vllm_installed", lambda: True)
    measured = []
    seconds = {"transformers": 1.0, "llama.cpp": 0.5, "vllm": math.inf}      # vLLM failed to run here

    def wave_seconds(adapter_dir, threads, dtype, engine):
        measured.append(engine)
        return seconds[engine]

    monkeypatch.setattr(sidecar, "_wave_seconds", wave_seconds)
    engine, why = sidecar.resolve_engine("auto", adapter, threads=2)
    assert engine == "llama.cpp" and "vllm failed" in why and sorted(measured) == ["llama.cpp", "transformers", "vllm"]
    assert sidecar.resolve_engine("auto", adapter, threads=2)[0] == "llama.cpp"    # cached: not measured again
    assert len(measured) == 3
    assert sidecar.resolve_engine("transformers", adapter) == ("transformers", "given")
    seconds["vllm"] = 0.25                            # another machine (threads): measured again, vLLM wins
    assert sidecar.resolve_engine("auto", adapter, threads=1)[0] == "vllm"
    monkeypatch.setattr(sidecar, "vllm_installed", lambda: False)
    (adapter / "sidecar.json").write_text(json.dumps({"layout_version": 3, "base": "/some/hf/folder"}))
    engine, why = sidecar.resolve_engine("auto", adapter, threads=2)
    assert engine == "transformers" and "no registry GGUF" in why
    with pytest.raises(ValueError, match="unknown sidecar engine"):
        sidecar.resolve_engine("sglang", adapter)
