"""The sidecar server on 127.0.0.1 with a tiny float64 model: every choice equals greedy decoding of its prompt
alone; limits answer 4xx; the block/query split tokenizes like whole prompts on byte-level BPE (the vLLM claim)."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ooospec.runtime.formats import hermes
from ooospec.runtime.serve.sidecar_app import (
    Limits,
    common_token_prefix,
    create_app,
    finish_text,
    split_shared_block,
    tokenize_prompts,
)
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.client import SidecarClient
from ooospec.runtime.sidecar.prompts import join_answers
from ooospec.runtime.sidecar.wave import Sidecar
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.conftest import tiny_model
from tests.runtime.sidecar_servers import running_app

RECORDS = [json.loads(line) for line in
           (Path(__file__).resolve().parents[2] / "fixtures" / "train_records.jsonl").read_text().splitlines()]
LIMITS = Limits(max_body_bytes=200_000, max_prompts=64, max_prompt_tokens=6000, max_tokens=16)
EOS = 258                # the byte tokenizer's </s>


# ------------------------------------------------------------------------------------------ pure parts


def test_split_shared_block():
    assert split_shared_block(["C\nT\nQuery: a\n", "C\nT\nQuery: b\n"]) == ("C\nT\n", ["Query: a\n", "Query: b\n"])
    assert split_shared_block(["C\nQuery: a\n"]) == ("C\n", ["Query: a\n"])          # one prompt
    assert split_shared_block(["C\nQ\n", "C\nQ\n"]) == ("C\n", ["Q\n", "Q\n"])        # identical prompts
    assert split_shared_block(["C\nQ", "C\n"]) is None                                # "C\n" would leave ""
    assert split_shared_block(["abc", "abd"]) is None and split_shared_block([]) is None


def test_common_token_prefix_and_finish_text():
    assert common_token_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_token_prefix([[5], [6]]) == 0 and common_token_prefix([]) == 0
    assert finish_text("ab;c;", [1, 2], [], [";"]) == ("ab", "stop")
    assert finish_text("abc", [1, EOS], [EOS], []) == ("abc", "stop")
    assert finish_text("abc", [1, 2], [EOS], ["z"]) == ("abc", "length")


# ------------------------------------------------------------------------------------------ the vLLM claim

GPT2_STYLE = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
QWEN2_STYLE = pre_tokenizers.Sequence([      # Qwen2/2.5/3 (Llama 3 differs only by \p{N}{1,3})
    pre_tokenizers.Split(Regex(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"""
                               r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
SENTENCEPIECE_STYLE = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")


def trained_tokenizer(pre_tokenizer, vocab_size: int) -> PreTrainedTokenizerFast:
    """A BPE tokenizer with real merges, trained in the test on wave texts."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace() if pre_tokenizer is SENTENCEPIECE_STYLE else decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator([p for r in RECORDS[:4] for p in sp.build_wave(r["messages"], r["tools"]).prompts()],
                            trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet,
                                                special_tokens=["</s>"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def tricky_waves() -> list[sp.Wave]:
    tools = [{"type": "function", "function": {
        "name": "f_1", "description": "Sums (a, b)... then: 'x'!", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "default": 3, "description": "count (max 10)"},
                                         "u": {"enum": ["°C", "°F"]}, "t": {"type": ["string", "null"]}}}}}]
    msgs = [{"role": "user", "content": "Über   12,5 €?\n\n  2 + 2 = 4 ;)\t"}, {"role": "assistant", "content": ""}]
    return [sp.build_wave(msgs, tools, with_direct_call=True),
            sp.build_wave(msgs, tools, [{"name": "f_1", "arguments": {"n": 2}}])]


@pytest.mark.parametrize("style", ["gpt2", "qwen2"])
def test_block_and_query_apart_tokenize_like_the_whole_prompt_on_byte_level_bpe(style):
    tok = trained_tokenizer(GPT2_STYLE if style == "gpt2" else QWEN2_STYLE, 800)
    assert len(tok) > 600                              # real merges, newlines merged into some of them
    assert any("Ċ" in t and len(t) > 1 for t in tok.get_vocab())       # e.g. "ĊĠ", and ")Ċ" under qwen2
    waves = [sp.build_wave(r["messages"], r["tools"], with_direct_call=True) for r in RECORDS] + tricky_waves()
    for wave in waves:
        block = tok(wave.block, add_special_tokens=False)["input_ids"]
        for prompt, q in zip(wave.prompts(), wave.queries):
            assert tok(prompt, add_special_tokens=False)["input_ids"] == \
                block + tok(q.text, add_special_tokens=False)["input_ids"], (style, q.text)


def test_sentencepiece_style_disagrees_so_the_server_tokenizes_whole_prompts():
    tok = trained_tokenizer(SENTENCEPIECE_STYLE, 290)
    wave = sp.build_wave(RECORDS[0]["messages"], RECORDS[0]["tools"])
    block = tok(wave.block, add_special_tokens=False)["input_ids"]
    query = tok(wave.queries[0].text, add_special_tokens=False)["input_ids"]
    assert tok(wave.prompts()[0], add_special_tokens=False)["input_ids"] != block + query   # "▁Query" apart
    groups, shared = tokenize_prompts(tok, wave.prompts(), add_special_tokens=False)
    assert not shared and len(groups) == 1
    for p, q in zip(wave.prompts(), groups[0].queries):
        assert tok(p, add_special_tokens=False)["input_ids"] == groups[0].block + q


# ------------------------------------------------------------------------------------------ over HTTP


def greedy_alone(model, tok, prompt: str, max_new_tokens: int) -> tuple[str, str]:
    """Reference: HF greedy decoding of the whole prompt's ids, cut after EOS; (text, finish_reason)."""
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False)[0, ids.shape[1]:].tolist()
    if EOS in out:
        out = out[:out.index(EOS) + 1]
    return tok.decode(out, skip_special_tokens=True), "stop" if out[-1] == EOS else "length"


@pytest.fixture(scope="module")
def server():
    model, tok = tiny_model("llama"), byte_tokenizer()
    sidecar = Sidecar(model, tok, metadata={"layout_version": sp.LAYOUT_VERSION})
    with running_app(create_app(sidecar, limits=LIMITS)) as url:
        yield url, model, tok


def post(url: str, body, path: str = "/v1/completions", chunked: bool = False) -> tuple[int, dict]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        if chunked:
            conn.request("POST", path, body=iter([data]), headers={"Content-Type": "application/json"},
                         encode_chunked=True)
        else:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def get(url: str, path: str) -> tuple[int, dict]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_wave_is_answered_in_one_pass_exactly_as_each_prompt_alone(server):
    url, model, tok = server
    wave = sp.build_wave(RECORDS[0]["messages"], RECORDS[0]["tools"][:2])
    prompts = wave.prompts()
    status, resp = post(url, {"model": "sidecar", "prompt": prompts, "max_tokens": 12, "temperature": 0,
                              "add_special_tokens": False})
    assert status == 200, resp
    assert resp["object"] == "text_completion" and resp["model"] == "sidecar" and resp["id"].startswith("cmpl-")
    assert [c["index"] for c in resp["choices"]] == list(range(len(prompts)))
    for p, c in zip(prompts, resp["choices"]):
        assert (c["text"], c["finish_reason"]) == greedy_alone(model, tok, p, 12)
    info = resp["ooospec"]
    assert info["shared_block"] and info["num_passes"] == 1 and info["n_forwards"] <= 12
    assert info["block_tokens"] == len(tok(wave.block)["input_ids"])
    assert resp["usage"]["prompt_tokens"] == sum(len(tok(p)["input_ids"]) for p in prompts)
    assert resp["usage"]["total_tokens"] == resp["usage"]["prompt_tokens"] + resp["usage"]["completion_tokens"]


@pytest.mark.parametrize("prompts", [
    "Conversation:\nuser: hi\nQuery: tool index\n",             # one string
    ["alpha beta", "gamma\ndelta", "alpha gamma"],             # no shared line
    ["same prefix, no newline: a", "same prefix, no newline: b"],
    [" x\nQuery: a", " x\n y"],                                 # a query starting with whitespace
])
def test_prompts_without_a_shared_block_are_still_exact(server, prompts):
    url, model, tok = server
    status, resp = post(url, {"prompt": prompts, "max_tokens": 6})
    assert status == 200, resp
    for p, c in zip([prompts] if isinstance(prompts, str) else prompts, resp["choices"]):
        assert (c["text"], c["finish_reason"]) == greedy_alone(model, tok, p, 6)


def test_stop_strings_cut_the_text(server):
    url, model, tok = server
    prompt = "Conversation:\nuser: hi\nQuery: tool index\n"
    full, _ = greedy_alone(model, tok, prompt, 10)
    stop = full[3:5]
    status, resp = post(url, {"prompt": [prompt], "max_tokens": 10, "stop": stop})
    assert status == 200 and resp["choices"][0] == {"index": 0, "text": full[:full.find(stop)],
                                                    "finish_reason": "stop", "logprobs": None}


def test_logprobs_are_openais_legacy_object_of_each_answer_token(server):
    url, model, tok = server
    prompts = sp.build_wave(RECORDS[0]["messages"], RECORDS[0]["tools"][:2]).prompts()[:3]
    status, resp = post(url, {"prompt": prompts, "max_tokens": 5, "logprobs": 3})
    assert status == 200, resp
    for p, c in zip(prompts, resp["choices"]):
        ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            first = torch.log_softmax(model(ids).logits[0, -1].float(), -1)
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(lp["top_logprobs"]) == len(lp["token_logprobs"]) == len(lp["text_offset"])
        assert all(len(step) <= 3 for step in lp["top_logprobs"])    # distinct ids may decode to one text
        best = int(first.argmax())
        assert lp["tokens"][0] == tok.decode([best])
        assert lp["token_logprobs"][0] == pytest.approx(float(first[best]), abs=1e-4)
        for text, value in lp["top_logprobs"][0].items():    # ids sharing a text: the most likely one
            same = [i for i in first.topk(3).indices.tolist() if tok.decode([i]) == text]
            assert value == pytest.approx(max(float(first[i]) for i in same), abs=1e-4)


@pytest.mark.parametrize("body, status, match", [
    (b"{not json", 400, "not valid JSON"),
    ({"prompt": "x\ny", "logprobs": 6}, 400, "logprobs"),
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": [1, 2, 3]}, 400, "prompt"),
    ({"prompt": []}, 400, "between 1 and"),
    ({"prompt": ["a\nb"] * 65}, 400, "65 items, over the limit of 64"),
    ({"prompt": [""]}, 400, "empty prompt"),
    ({"prompt": "x\ny", "max_tokens": 17}, 400, "max_tokens"),
    ({"prompt": "x\ny", "temperature": 0.7}, 400, "greedily"),
    ({"prompt": "x\ny", "stream": True}, 400, "not supported"),
    ({"prompt": "x\ny", "n": 2}, 400, "not supported"),
    ({"prompt": "x\ny", "model": "gpt-4"}, 404, "does not exist"),
    ({"prompt": "x"}, 400, "at least 2"),
    ({"prompt": "x" * 7000 + "\ny"}, 400, "over the limit"),
    ({"prompt": ["x\ny" * 80_000]}, 413, "over the limit"),
])
def test_limits_and_bad_requests_get_4xx(server, body, status, match):
    got, resp = post(server[0], body)
    assert got == status and match in resp["error"]["message"], resp
    assert resp["error"]["code"] == status


def test_a_chunked_body_is_limited_too(server):
    got, resp = post(server[0], {"prompt": ["x\ny" * 80_000]}, chunked=True)
    assert got == 413, resp


def test_health_and_models(server):
    status, h = get(server[0], "/health")
    assert status == 200 and h["status"] == "ok" and h["model"] == "sidecar" and h["running"] == h["waiting"] == 0
    assert h["layout_version"] == sp.LAYOUT_VERSION and h["threads"] >= 1 and h["cpus"]
    assert h["dtype"] == str(next(server[1].parameters()).dtype).removeprefix("torch.") and h["calibration"] is None
    assert h["engine"] == "transformers"
    assert get(server[0], "/v1/models")[1]["data"][0]["id"] == "sidecar"


def test_health_counts_the_wave_requests_it_took_not_the_rejected_ones(server):
    url = server[0]
    before = get(url, "/health")[1]["requests"]
    assert post(url, {"prompt": "x\ny", "temperature": 0.7})[0] == 400   # rejected: not a wave
    prompts = sp.build_wave(RECORDS[0]["messages"], RECORDS[0]["tools"][:1]).prompts()
    assert post(url, {"prompt": prompts, "max_tokens": 2, "add_special_tokens": False})[0] == 200
    assert get(url, "/health")[1]["requests"] == before + 1


def test_the_client_speaks_to_the_server(server):
    url, model, tok = server
    rec = RECORDS[1]
    client = SidecarClient(url, max_tokens=8)
    req = client.submit(rec["messages"], rec["tools"], fmt=hermes, tokenizer=tok)
    req.wait(60)
    st = req.stats()
    # the expected outcome: greedy decoding of each of the wave's prompts alone, joined as the client joins them
    wave = sp.build_wave(rec["messages"], rec["tools"], (), client.with_direct_call)
    answers = [greedy_alone(model, tok, p, 8)[0] for p in wave.prompts()]
    expected = join_answers(rec["tools"], wave, answers)
    assert req.done and st.payload_bytes == sum(len(a.encode()) for a in answers)
    if expected is None:
        assert (st.error, st.call) == ("no_call", None), st.error_detail
    else:
        assert (st.error, st.call) == (None, {"name": expected["name"], "arguments": expected["arguments"]})
    assert st.server["shared_block"] and st.server["n_forwards"] <= 8
    assert 0 <= st.server["queue_s"] <= st.wave_s     # the server's queue wait is inside the client's wave
    assert st.n_queries == len(sp.build_wave(rec["messages"], rec["tools"]).queries)


def test_a_client_that_goes_away_stops_its_wave():
    """The server watches for the disconnect and abandons the wave at its next forward (499 in its own log)."""
    import socket
    import time

    model, tok = tiny_model("llama"), byte_tokenizer()
    forwards = []

    def slow(module, args, kwargs):     # ~0.1 s per forward: a wave of 16 steps would take ~1.6 s
        forwards.append(1)
        time.sleep(0.1)

    hook = model.register_forward_pre_hook(slow, with_kwargs=True)
    sidecar = Sidecar(model, tok, metadata={"layout_version": sp.LAYOUT_VERSION})
    limits = Limits(max_body_bytes=200_000, max_prompts=64, max_prompt_tokens=6000, max_tokens=200)
    try:
        with running_app(create_app(sidecar, limits=limits)) as url:
            parts = urllib.parse.urlsplit(url)
            body = json.dumps({"model": "sidecar", "prompt": ["shared block\nq1", "shared block\nq2"],
                               "max_tokens": 200, "temperature": 0}).encode()
            with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
                deadline = time.monotonic() + 20
                while not forwards and time.monotonic() < deadline:   # the wave has started
                    time.sleep(0.02)
            # the client is gone; the server notices within one poll + one forward
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                h = get(url, "/health")[1]
                if h.get("cancelled") and h["running"] == 0:
                    break
                time.sleep(0.05)
            assert h.get("cancelled") == 1 and h["running"] == h["waiting"] == 0, h
            assert len(forwards) < 100                      # far fewer than the 200 steps it was asked for
            assert post(url, {"prompt": ["a\nb"], "max_tokens": 2})[0] == 200   # and it keeps answering
    finally:
        hook.remove()
