"""``ooospec bench`` on a tiny random Qwen2 and a byte-level toy tokenizer with a tool-aware chat template.

No downloads; fp32 (so the engine, HF greedy and HF prompt lookup must agree token for token).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ooospec import cli
from ooospec.eval.bench import data as bench_data
from ooospec.eval.bench import harness, hint_sources, peers, summaries
from ooospec.eval.bench import methods as bench_methods
from ooospec.pipelines.records import call, make_record, tool, write_jsonl
from ooospec.runtime import methods
from ooospec.runtime.backends import hardware
from ooospec.runtime.formats import detect_format
from ooospec.runtime.sidecar import prompts as sp

SPECIALS = ["<pad>", "<s>", "</s>"]
# Mentions <tool_call> (-> hermes format) and renders `tools` (-> the template's own tool path).
TEMPLATE = (
    "{%- if tools %}<|system|>Tools: {{ tools | tojson }}\nCall one as <tool_call>{json}</tool_call>\n{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
REQUIRED = ("n", "mean_s", "median_s", "speedup", "decode_speedup", "mat", "exact_rate", "defects",
            "prefill_flops_per_s", "decode_bytes_per_s", "prefill_peak_frac", "decode_peak_frac")
ROOF = {"peak_flops": 1e11, "peak_bytes_per_s": 1e10}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Every UTF-8 byte is one token (ids 0..255); ``</s>`` (258) is EOS."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({s: 256 + i for i, s in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = TEMPLATE
    return fast


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                      pad_token_id=256, bos_token_id=257, eos_token_id=258, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).eval()


def toy_records() -> list[dict]:
    weather = tool("get_weather", "Current weather for a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    agenda = tool("add_agenda", "Add an agenda item.",
                  {"type": "object", "properties": {"content": {"type": "string"}, "time": {"type": "string"}},
                   "required": ["content", "time"]})
    return [
        make_record("toy", "test", "b", [weather], [{"role": "user", "content": "Weather in Paris?"}],
                    [call("get_weather", {"city": "Paris"})]),
        make_record("toy", "test", "a", [weather, agenda],
                    [{"role": "user", "content": "Add 'review' at 10:00, then weather in Oslo."}],
                    [call("add_agenda", {"content": "review", "time": "10:00"})]),
        make_record("toy", "test", "c", [agenda], [{"role": "user", "content": "Agenda: lunch at noon."}],
                    [call("add_agenda", {"content": "lunch", "time": "12:00"})]),
    ]


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return tiny_qwen2(), byte_tokenizer()


@pytest.fixture(scope="module")
def results(target):
    model, tok = target
    factories, notes = bench_methods.build_methods(["ar", "pld", "toolspec", "hf-pld", "toolspec-fixed"], model, tok,
                                                   eos_token_ids=bench_methods.eos_ids(model, tok), pld_tokens=5)
    assert notes == []
    return harness.run_bench(model, tok, toy_records(), factories, fmt=detect_format(tok), max_new_tokens=24,
                           progress=False, roofline=ROOF)


# ------------------------------------------------------------------------------------------ end to end


def test_run_has_required_keys_and_order(results):
    assert list(results["methods"]) == ["ar", "hf-greedy", "pld", "toolspec", "hf-pld", "toolspec-fixed"]
    for name, summary in results["methods"].items():
        missing = [k for k in REQUIRED if k not in summary]
        assert not missing, f"{name} lacks {missing}"
        assert summary["n"] == 3
        assert summary["prefill_flops_per_s"] > 0 and summary["decode_bytes_per_s"] > 0
        assert summary["prefill_peak_frac"] == pytest.approx(summary["prefill_flops_per_s"] / ROOF["peak_flops"])
    assert len(results["examples"]) == 3 * 6
    json.dumps(results, allow_nan=False)  # standard JSON: no NaN / inf anywhere


def test_ar_is_its_own_reference_and_plain(results):
    ar = results["methods"]["ar"]
    assert ar["exact_rate"] == 1.0 and ar["defects"] == 0
    assert ar["speedup"] == pytest.approx(1.0) and ar["speedup_median"] == pytest.approx(1.0)
    assert ar["mat"] == pytest.approx(1.0)
    for row in results["examples"]:
        if row["method"] == "ar":
            assert row["forwards"] == row["new_tokens"] and set(row["tree_sizes"]) == {1}


def test_fp32_methods_match_ar_and_hf_greedy(results):
    for name, summary in results["methods"].items():
        assert summary["exact_rate"] == 1.0, (name, [r["mismatch"] for r in results["examples"]])
        assert summary["exact_hf_rate"] == 1.0, name


def test_hf_forward_counting(results):
    for row in results["examples"]:
        if row["method"] == "hf-greedy":  # one forward per token, prefill included (it yields token 1)
            assert row["forwards"] == row["new_tokens"] and set(row["tree_sizes"]) == {1}
        if row["method"] in ("ar", "pld", "toolspec", "toolspec-fixed"):
            assert 0 <= row["draft_s"] <= row["decode_s"]
            assert len(row["proposed"]) == row["forwards"]
            assert all(t - 1 <= p for t, p in zip(row["tree_sizes"], row["proposed"]))
        if row["method"] in ("pld", "toolspec", "toolspec-fixed"):
            # every step commits its accepted drafts + the bonus token; only the last may be cut by the stop rule
            full = [a + 1 for a in row["accepted"]]
            assert len(row["tree_sizes"]) == len(full) == row["forwards"]
            assert sum(full[:-1]) < row["new_tokens"] <= sum(full)
            assert all(a < t for a, t in zip(row["accepted"], row["tree_sizes"]))   # accepted nodes are in the tree
        if row["method"] == "hf-pld":
            assert len(row["tree_sizes"]) == row["forwards"] and 1 <= row["forwards"] <= row["new_tokens"]


def test_examples_in_id_order_and_stop_rule(results):
    ar_rows = [r for r in results["examples"] if r["method"] == "ar"]
    assert [r["id"] for r in ar_rows] == ["toy/test/a", "toy/test/b", "toy/test/c"]
    fmt = detect_format(byte_tokenizer())
    for row in ar_rows:
        assert row["new_tokens"] <= 24
        if row["stop_reason"] == "stop":
            assert fmt.is_complete(row["text"]) and not fmt.is_complete(row["text"][:-1])


# ------------------------------------------------------------------------------------------ CLI


def test_fixed_method_stays_within_its_budget(results):
    fixed = [t for r in results["examples"] if r["method"] == "toolspec-fixed" for t in r["tree_sizes"]]
    assert max(fixed) <= methods.FIXED_NODES + 1
    assert results["methods"]["toolspec-fixed"]["exact_rate"] == 1.0


@pytest.fixture
def fake_roofline(monkeypatch):
    """The roofline probes sweep 1 GiB and time large matmuls: faked here, tested in
    tests/runtime/backends/test_hardware."""
    monkeypatch.setattr(hardware, "roofline", lambda dtype, threads: {"cpu": "fake", "flags": [], "threads": threads,
                                                                      "dtype": dtype, **ROOF})


def saved_toy_bench(tmp_path, target) -> tuple:
    """``(model folder, records file)``: the tiny target saved under ``tmp_path/tiny``, :func:`toy_records` as
    ``tmp_path/toy.jsonl`` (what ``ooospec bench --target --dataset`` reads)."""
    model, tok = target
    model_dir = tmp_path / "tiny"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    data = tmp_path / "toy.jsonl"
    write_jsonl(data, toy_records())
    return model_dir, data


def test_cli_writes_results_and_report(tmp_path, target, fake_roofline):
    model_dir, data = saved_toy_bench(tmp_path, target)
    out = tmp_path / "results.json"
    rc = cli.main(["bench", "--target", str(model_dir), "--dataset", str(data), "--dtype", "fp32",
                   "--threads", "1", "--limit", "2", "--max-new-tokens", "12", "--warmup", "0",
                   "--methods", "ar,hf-assisted", "--assistant", str(model_dir),
                   "--out", str(out), "--report-dir", str(tmp_path / "report")])
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res["methods"]) == ["ar", "hf-assisted", "hf-greedy"]  # JSON keys are sorted on disk
    assert res["config"]["methods"] == ["ar", "hf-greedy", "hf-assisted"]
    assert {r["id"] for r in res["examples"]} == {"toy/test/a", "toy/test/b"}
    for key in ("torch", "threads", "dtype", "cpu", "commit", "cpu_flags", "footprint", "dtype_reason"):
        assert key in res["env"]
    assert res["env"]["threads"] == 1 and res["env"]["dtype"] == "fp32" and res["env"]["dtype_reason"] == "given"
    assert res["env"]["roofline"]["peak_flops"] == ROOF["peak_flops"]
    assert res["methods"]["ar"]["decode_peak_frac"] > 0
    # the draft is the target itself: exact, and more than one token per target forward
    assisted = res["methods"]["hf-assisted"]
    assert assisted["exact_rate"] == 1.0 and assisted["mat"] > 1.0
    assert res["notes"] == [] and res["partial"] is False
    assert (tmp_path / "report" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_with_all_defaults(tmp_path, target, fake_roofline, monkeypatch):
    """The documented command line: no --threads, --dtype, --methods or --out."""
    model, tok = target
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    data = tmp_path / "toy.jsonl"
    write_jsonl(data, toy_records())
    monkeypatch.chdir(tmp_path)
    try:
        assert cli.main(["bench", "--target", str(tmp_path / "tiny"), "--dataset", str(data), "--limit", "1",
                         "--max-new-tokens", "8", "--warmup", "0"]) == 0
    finally:
        torch.set_num_threads(1)
    res = json.loads((tmp_path / "results" / "bench_tiny_toy.json").read_text())
    env = res["env"]
    assert env["dtype_requested"] == "auto" and env["dtype"] in ("bf16", "fp32") and env["dtype_reason"]
    assert env["threads"] == hardware.available_cores() and "sched_getaffinity" in env["threads_reason"]
    assert res["config"]["methods"] == ["ar", "hf-greedy", "pld", "toolspec", "hf-pld"]


def test_hf_assisted_without_draft_falls_back_and_says_so(target):
    model, tok = target
    _, notes = bench_methods.build_methods(["ar", "hf-assisted"], model, tok, eos_token_ids=[258])
    assert len(notes) == 1 and "fell back to prompt lookup" in notes[0]


def test_unknown_method_is_rejected(target):
    model, tok = target
    with pytest.raises(ValueError, match="unknown method.*'magic'"):
        bench_methods.build_methods(["ar", "magic"], model, tok, eos_token_ids=[258])


# ------------------------------------------------------------------------------------------ data


def test_load_examples_sorts_limits_and_names_bad_records(tmp_path):
    path = tmp_path / "r.jsonl"
    write_jsonl(path, toy_records())
    assert [r["id"] for r in bench_data.load_examples(path, limit=2)] == ["toy/test/a", "toy/test/b"]
    bad = toy_records()
    bad[1]["calls"] = [call("nope", {})]
    write_jsonl(path, bad)
    with pytest.raises(ValueError, match="toy/test/a.*call_unknown_tool"):
        bench_data.load_examples(path)


def test_load_examples_keeps_the_named_ids_then_a_seeded_sample_in_id_order(tmp_path):
    path, rows = tmp_path / "r.jsonl", tmp_path / "heldout.jsonl"
    recs = toy_records()
    recs[1]["calls"] = [call("nope", {})]          # invalid, but not asked for: skipped, not raised
    write_jsonl(path, recs)
    ids = sorted(r["id"] for r in toy_records())
    keep = [i for i in ids if i != recs[1]["id"]]
    write_jsonl(rows, [{"id": f"{i}#0", "record_id": i} for i in keep])
    assert bench_data.record_ids_of(rows) == set(keep)
    assert [r["id"] for r in bench_data.load_examples(path, ids=set(keep))] == keep
    one = bench_data.load_examples(path, ids=set(keep), sample=len(keep) - 1)
    assert [r["id"] for r in one] == sorted(r["id"] for r in one) and len(one) == len(keep) - 1
    assert one == bench_data.load_examples(path, ids=set(keep), sample=len(keep) - 1)     # seeded
    assert [r["id"] for r in bench_data.load_examples(path, ids=set(keep), sample=99)] == keep
    with pytest.raises(ValueError, match="--sample"):
        bench_data.load_examples(path, ids=set(keep), sample=0)
    write_jsonl(rows, [{"id": "x#0"}])
    with pytest.raises(ValueError, match="record_id"):
        bench_data.record_ids_of(rows)


# ------------------------------------------------------------------------------------------ summary math


def _row(id_, method, time_s, decode_s, tokens, forwards, exact=True, mismatch=None, exact_hf=True):
    return {"id": id_, "method": method, "time_s": time_s, "prefill_s": time_s - decode_s, "decode_s": decode_s,
            "new_tokens": tokens, "forwards": forwards, "tree_sizes": [1] * forwards, "exact": exact,
            "exact_hf": exact_hf, "mismatch": mismatch}


def test_summary_math_on_hand_made_rows():
    rows = [
        _row("x", "ar", 1.0, 0.8, 10, 10), _row("y", "ar", 3.0, 2.0, 30, 30), _row("z", "ar", 2.0, 1.2, 20, 20),
        _row("x", "m", 0.5, 0.3, 10, 4), _row("y", "m", 2.0, 1.0, 30, 10),
        _row("z", "m", 4.0, 3.2, 19, 15, exact=False, exact_hf=False,
             mismatch={"position": 3, "margin": 0.1, "kind": "near_tie"}),
    ]
    s = summaries.summarize(rows)
    m = s["m"]
    assert m["n"] == 3
    assert m["mean_s"] == pytest.approx(6.5 / 3) and m["median_s"] == pytest.approx(2.0)
    assert m["speedup"] == pytest.approx(2.0 / (6.5 / 3))                 # ratio of mean times
    assert m["speedup_median"] == pytest.approx(1.5)                      # median of [2.0, 1.5, 0.5]
    assert m["decode_speedup"] == pytest.approx(4.0 / 4.5)
    assert m["mat"] == pytest.approx(59 / 29)
    assert m["exact_rate"] == pytest.approx(2 / 3) and m["exact_hf_rate"] == pytest.approx(2 / 3)
    assert (m["near_ties"], m["defects"]) == (1, 0)
    assert s["ar"]["speedup"] == pytest.approx(1.0) and s["ar"]["mat"] == pytest.approx(1.0)


def test_summary_needs_baseline_rows():
    with pytest.raises(ValueError, match="no 'ar' rows"):
        summaries.summarize([_row("x", "m", 1.0, 0.5, 3, 3)])


def test_mismatch_is_classified_with_ar_margins():
    rows = {"ar": {"tokens": [1, 2, 3]}, "hf-greedy": {"tokens": [1, 2, 3]}, "m": {"tokens": [1, 9, 3]},
            "d": {"tokens": [1, 2, 7]}}
    harness.compare_rows(rows, ar_margins=[5.0, 0.1, 4.0], tie_tol=0.25)
    assert rows["ar"]["exact"] and rows["ar"]["mismatch"] is None
    assert rows["m"]["mismatch"] == {"position": 1, "margin": 0.1, "kind": "near_tie"}
    assert rows["d"]["mismatch"]["kind"] == "defect" and rows["d"]["exact_hf"] is False


def test_json_safe_replaces_non_finite():
    assert summaries.json_safe({"a": [math.nan, 1.0], "b": math.inf, "c": "x"}) == {"a": [None, 1.0], "b": None,
                                                                                    "c": "x"}


# ------------------------------------------------------------------------------------------ peers


def test_cut_at_stop():
    assert peers.cut_at_stop([5, 6, 2, 7], [2], None, 10) == [5, 6, 2]
    assert peers.cut_at_stop([5, 6, 7, 8], [], lambda g: g[-1] == 6, 10) == [5, 6]
    assert peers.cut_at_stop([5, 6, 7, 8], [], None, 3) == [5, 6, 7]


def test_forward_counter_counts_and_restores(target):
    model, _ = target
    with peers.ForwardCounter(model) as counter:
        model(input_ids=torch.tensor([[1, 2, 3]]))
        model(torch.tensor([[4]]))
    assert counter.q_lens == [3, 1] and counter.t_first is not None
    assert "forward" not in vars(model)  # the class method is back


# ------------------------------------------------------------------------------------------ ooospec


def test_ooospec_gold_hints_are_exact_used_and_reported(target):
    model, tok = target
    factories, _ = bench_methods.build_methods(["ar", "toolspec", "ooospec-gold"], model, tok,
                                               eos_token_ids=bench_methods.eos_ids(model, tok))
    res = harness.run_bench(model, tok, toy_records(), factories, fmt=detect_format(tok), max_new_tokens=24,
                          progress=False)
    gold = res["methods"]["ooospec-gold"]
    assert gold["exact_rate"] == 1.0 and gold["defects"] == 0
    h = gold["hints"]
    assert h["n"] == 3 and h["ready_before_first_tree"] == 1.0 and h["errors"] == {}
    rows = [r for r in res["examples"] if r["method"] == "ooospec-gold"]
    assert all(r["hints"]["source"] == "gold" and r["hints"]["bank_tokens"] > 0 for r in rows)
    assert "hints" not in res["methods"]["toolspec"]


def float64_bench(kind: str) -> tuple:
    """``(model, tokenizer, records)`` in float64: ``random``, the tiny random Llama of tests/runtime/conftest.py
    (random text, 24 tokens a record) on :func:`toy_records`; ``trained``, the tiny chat model that writes
    ``get_weather(city="Paris")`` (tests/runtime/chat_tiny.py), on records whose gold calls it does NOT write."""
    import copy

    from tests.runtime.chat_tiny import AFTER_TOOL, TOOLS, USER, trained_chat_model
    from tests.runtime.conftest import tiny_model

    if kind == "random":
        return tiny_model("llama"), byte_tokenizer(), toy_records()
    model, tok = trained_chat_model()
    records = [make_record("toy", "test", "call", TOOLS, USER, [call("get_weather", {"city": "Oslo"})]),
               make_record("toy", "test", "answer", TOOLS, AFTER_TOOL, [call("get_weather", {"city": "Rome"})])]
    return copy.deepcopy(model).double(), tok, records


@pytest.mark.parametrize("kind", ["random", "trained"])
def test_ooospec_oracle_and_gold_hints_change_no_token_on_float64_targets(kind):
    model, tok, records = float64_bench(kind)
    assert next(model.parameters()).dtype == torch.float64
    factories, _ = bench_methods.build_methods(["ar", "ooospec-oracle", "ooospec-gold"], model, tok,
                                               eos_token_ids=bench_methods.eos_ids(model, tok))
    res = harness.run_bench(model, tok, records, factories, fmt=detect_format(tok), max_new_tokens=48,
                          progress=False)
    assert list(res["methods"]) == ["ar", "hf-greedy", "ooospec-oracle", "ooospec-gold"]
    ar = {r["id"]: r["tokens"] for r in res["examples"] if r["method"] == "ar"}
    for row in res["examples"]:
        assert row["tokens"] == ar[row["id"]], (row["method"], row["id"])     # exact, token for token
        assert row["exact"] and row["mismatch"] is None
    oracle = [r for r in res["examples"] if r["method"] == "ooospec-oracle"]
    assert len(oracle) == len(records)
    for row in oracle:
        h = row["hints"]
        assert h["source"] == "oracle" and h["ready_s"] == 0.0 and h["ready_step"] == 0
        assert h["num_accepted_tokens"] >= 0 and h["target_sidecar_s"] >= h["match_s"] >= 0
    summary = res["methods"]["ooospec-oracle"]["hints"]
    assert summary["source"] == "oracle" and summary["n"] == len(records) and summary["errors"] == {}
    assert summary["mean_hint_tokens_accepted"] >= 0
    assert res["methods"]["ooospec-gold"]["hints"]["source"] == "gold"
    if kind == "trained":     # the target writes a call: the oracle hints it, and the hints are taken
        by_id = {r["id"]: r["hints"] for r in oracle}
        assert by_id["toy/test/call"]["call"] == call("get_weather", {"city": "Paris"})
        assert by_id["toy/test/call"]["num_accepted_tokens"] > 0
        assert by_id["toy/test/answer"]["call"] is None and by_id["toy/test/answer"]["bank_tokens"] == 0


def test_the_oracle_bank_is_built_from_ar_calls_not_gold():
    """The oracle hints with the call the target wrote (Paris), never with the record's gold call (Oslo)."""
    from ooospec.eval.bench.method_api import BenchContext
    from ooospec.eval.bench.ooospec_method import OracleHints
    from ooospec.runtime.drafters.hints import HintBank

    model, tok, records = float64_bench("trained")
    rec = records[0]
    fmt = detect_format(tok)
    factories, _ = bench_methods.build_methods(["ar"], model, tok, eos_token_ids=bench_methods.eos_ids(model, tok))
    res = harness.run_bench(model, tok, [rec], factories, fmt=fmt, max_new_tokens=48, progress=False, warmup=0)
    ar_tokens = next(r["tokens"] for r in res["examples"] if r["method"] == "ar")
    written = fmt.parse_calls(tok.decode(ar_tokens, skip_special_tokens=False))
    assert written == [call("get_weather", {"city": "Paris"})] != rec["calls"]    # gold says Oslo

    ctx = BenchContext(model, tok, fmt, bench_methods.eos_ids(model, tok), 48, harness.make_stop(tok, fmt), record=rec)
    ctx.set_reference(rec["id"], ar_tokens)
    bank = OracleHints().start(ctx, 0.0)
    assert bank.views == HintBank.from_calls(written, fmt, tok).views
    assert bank.views != HintBank.from_calls(rec["calls"], fmt, tok).views
    texts = [tok.decode(list(v)) for v in bank.views.values()]
    assert all("Paris" in t and "Oslo" not in t for t in texts)
    assert any(t in tok.decode(ar_tokens, skip_special_tokens=False) for t in texts)   # the target's own text


def test_the_oracle_refuses_without_ar_output_of_the_same_request(target):
    from ooospec.eval.bench.method_api import BenchContext
    from ooospec.eval.bench.ooospec_method import OracleHints

    model, tok = target
    fmt = detect_format(tok)
    a, b = sorted(toy_records(), key=lambda r: r["id"])[:2]
    ctx = BenchContext(model, tok, fmt, [258], 8, harness.make_stop(tok, fmt), record=a)
    with pytest.raises(ValueError, match=r"oracle hints for 'toy/test/a' need the baseline 'ar' output.*none"):
        OracleHints().start(ctx, 0.0)
    ctx.set_reference(b["id"], [1, 2, 3])      # ar's output of another request is no reference for this one
    with pytest.raises(ValueError, match="have one for 'toy/test/b'"):
        OracleHints().start(ctx, 0.0)
    # a run where ar does not come first: refused at the oracle's first call, before anything is timed
    factories, _ = bench_methods.build_methods(["ar", "ooospec-oracle"], model, tok, eos_token_ids=[258])
    reordered = {"ooospec-oracle": factories["ooospec-oracle"], "ar": factories["ar"]}
    with pytest.raises(ValueError, match="need the baseline 'ar' output"):
        harness.run_bench(model, tok, toy_records(), reordered, fmt=fmt, max_new_tokens=8, progress=False)


@pytest.mark.parametrize("mode", ["hanging", "invalid_json"])
def test_ooospec_with_a_broken_sidecar_is_exact_and_never_waits(target, mode):
    from ooospec.eval.bench.ooospec_method import SidecarHints
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
    from tests.runtime.sidecar_servers import StandIn

    model, tok = target
    with StandIn(mode) as server:
        hints = SidecarHints(SidecarClient(server.url, timeout=30.0), DEPLOYMENTS["shared"], 1)
        factories, _ = bench_methods.build_methods(["ar", "ooospec"], model, tok,
                                                   eos_token_ids=bench_methods.eos_ids(model, tok), hints=hints)
        res = harness.run_bench(model, tok, toy_records(), factories, fmt=detect_format(tok), max_new_tokens=24,
                              progress=False)
    oo = res["methods"]["ooospec"]
    assert oo["exact_rate"] == 1.0
    assert oo["hints"]["ready_before_end"] == 0.0 and oo["hints"]["used"] == 0.0
    assert oo["mean_s"] < 10.0          # a hanging sidecar (20 s) never held a request up
    rows = [r for r in res["examples"] if r["method"] == "ooospec"]
    # the wave starts after the request's arrival and before its end (time_s is timed around the whole call)
    assert all(r["hints"]["submit_s"] is not None and 0 <= r["hints"]["submit_s"] <= r["time_s"] for r in rows)
    # neither stand-in gives a call: no bank is ever ready
    assert all(r["hints"]["ready_s"] is None and r["hints"]["call"] is None for r in rows)
    if mode == "hanging":                # never answers (for 20 s): the wave has no response time
        assert all(r["hints"]["wave_s"] is None for r in rows)
    # a call that ends before the answer arrives cancels its wave (recorded asynchronously by the client)
    assert set(oo["hints"]["errors"]) <= {"bad_json" if mode == "invalid_json" else "timeout", "cancelled"}


def test_ooospec_without_hint_source_is_refused(target):
    model, tok = target
    with pytest.raises(ValueError, match="needs a hint source"):
        bench_methods.build_methods(["ar", "ooospec"], model, tok, eos_token_ids=bench_methods.eos_ids(model, tok))


def test_the_hint_flags_become_typed_hint_options():
    import argparse

    from ooospec.eval.bench import cli as bench
    from ooospec.eval.bench.ooospec_method import GoldHints, OracleHints

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--target", "t", "--dataset", "d", "--hints", "gold", "--sidecar-deploy", "split",
                         "--sidecar-adapter", "a", "--dtype", "fp32"])
    options = bench.hint_options(args)
    assert options == hint_sources.HintOptions(source="gold", sidecar_adapter="a", sidecar_deploy="split", dtype="fp32")
    proc, hints = hint_sources.start_hints(options, bench_threads=1)   # gold: no server is started
    assert proc is None and isinstance(hints, GoldHints)
    oracle = bench.hint_options(p.parse_args(["--target", "t", "--dataset", "d", "--hints", "oracle"]))
    assert oracle.source == "oracle"
    proc, hints = hint_sources.start_hints(oracle, bench_threads=1)    # oracle: no server either
    assert proc is None and isinstance(hints, OracleHints) and hints.name == "oracle"
    with pytest.raises(ValueError, match="hint source 'psychic'"):
        hint_sources.HintOptions(source="psychic")
    with pytest.raises(ValueError, match="deployment 'nowhere'"):
        hint_sources.HintOptions(sidecar_deploy="nowhere")
    # a running sidecar (nothing is contacted until a request), with and without the wave gate
    for gate in (False, True):
        options = hint_sources.HintOptions(sidecar_url="http://127.0.0.1:9", sidecar_gate=gate)
        proc, hints = hint_sources.start_hints(options, 1)
        assert proc is None and hints.name == "sidecar" and (hints.client.gate is not None) == gate


ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"   # sha256(b"abc"), FIPS 180-2


def fake_adapter(path):
    """A sidecar adapter folder whose weights file holds the bytes ``abc`` and whose layout is 2."""
    path.mkdir()
    (path / "adapter_model.safetensors").write_bytes(b"abc")
    (path / "sidecar.json").write_text(json.dumps({"layout_version": 2, "base": "b"}))
    return path


def test_the_sidecar_adapter_is_recorded_by_path_weights_hash_and_layout(tmp_path, monkeypatch):
    adapter = fake_adapter(tmp_path / "adapter")
    record = {"path": str(adapter.resolve()), "sha256": ABC_SHA256, "layout_version": 2}
    assert hint_sources.adapter_record(adapter) == record
    assert hint_sources.sidecar_adapter_record(hint_sources.HintOptions(sidecar_adapter=str(adapter))) == {**record,
                                                                                                           "url": None}
    monkeypatch.setenv("OOOSPEC_SIDECAR_ADAPTER", str(adapter))      # the adapter start_hints would launch
    assert hint_sources.sidecar_adapter_record(hint_sources.HintOptions()) == {**record, "url": None}
    url = "http://127.0.0.1:9"
    assert hint_sources.sidecar_adapter_record(hint_sources.HintOptions(sidecar_url=url)) == {
        "path": None, "sha256": None, "layout_version": None, "url": url}      # someone else's server: unknown
    assert hint_sources.sidecar_adapter_record(
        hint_sources.HintOptions(sidecar_url=url, sidecar_adapter=str(adapter))) == {**record, "url": url}
    for source in ("gold", "oracle"):                                           # no sidecar ran
        options = hint_sources.HintOptions(source=source, sidecar_adapter=str(adapter))
        assert hint_sources.sidecar_adapter_record(options) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert hint_sources.adapter_record(empty) == {"path": str(empty.resolve()), "sha256": None, "layout_version": None}


def test_cli_bench_with_oracle_hints_and_with_a_sidecar_records_the_adapter(tmp_path, target, fake_roofline):
    from tests.runtime.sidecar_servers import StandIn

    model_dir, data = saved_toy_bench(tmp_path, target)
    adapter = fake_adapter(tmp_path / "adapter")
    base = ["bench", "--target", str(model_dir), "--dataset", str(data), "--dtype", "fp32", "--threads", "1",
            "--limit", "2", "--max-new-tokens", "12", "--warmup", "0", "--no-roofline"]

    out = tmp_path / "oracle.json"
    assert cli.main([*base, "--methods", "ar,ooospec,ooospec-oracle", "--hints", "oracle", "--out", str(out),
                     "--report-dir", str(tmp_path / "report")]) == 0
    res = json.loads(out.read_text())
    assert res["config"]["hints"] == "oracle" and res["config"]["sidecar"] is None
    assert res["env"]["sidecar_adapter"] is None                                # no sidecar ran
    for name in ("ooospec", "ooospec-oracle"):
        assert res["methods"][name]["exact_rate"] == 1.0 and res["methods"][name]["hints"]["source"] == "oracle"
    table = (tmp_path / "report" / "table.md").read_text()
    assert "hints: oracle / gold / real" in table and "| toy | oracle | ooospec-oracle | 2 |" in table

    out = tmp_path / "sidecar.json"
    with StandIn("invalid_json") as server:
        assert cli.main([*base, "--methods", "ar,ooospec", "--sidecar-url", server.url, "--sidecar-adapter",
                         str(adapter), "--out", str(out), "--report-dir", str(tmp_path / "report")]) == 0
    res = json.loads(out.read_text())
    assert res["env"]["sidecar_adapter"] == {"path": str(adapter.resolve()), "sha256": ABC_SHA256,
                                             "layout_version": 2, "url": server.url}
    assert res["methods"]["ooospec"]["exact_rate"] == 1.0 and res["methods"]["ooospec"]["hints"]["source"] == "sidecar"
    table = (tmp_path / "report" / "table.md").read_text()
    assert "| toy | real | ooospec | 2 |" in table
    assert f"sidecar adapter {adapter.resolve()} (weights sha256 {ABC_SHA256[:12]}, layout 2)" in table


# ------------------------------------------------------------------------------------------ warm toolbox


def test_warm_tools_caches_the_block_for_every_method_and_changes_no_token(target, results):
    """--warm-tools: each method starts from the system + tools block (prefilled untimed); same tokens as cold."""
    model, tok = target
    fmt = detect_format(tok)
    factories, _ = bench_methods.build_methods(["ar", "pld", "toolspec"], model, tok,
                                               eos_token_ids=bench_methods.eos_ids(model, tok), pld_tokens=5)
    warm = harness.run_bench(model, tok, toy_records(), factories, fmt=fmt, max_new_tokens=24, progress=False,
                           warm_tools=True)
    cold = {(r["id"], r["method"]): r["tokens"] for r in results["examples"]}
    for row in warm["examples"]:
        rec = next(r for r in toy_records() if r["id"] == row["id"])
        block = tok(fmt.render_prompt(tok, [{"role": "user", "content": "a"}], rec["tools"]))["input_ids"]
        assert 0 < row["warm_tokens"] < row["prompt_tokens"]
        assert row["warm_tokens"] <= len(block)
        assert row["tokens"] == cold[(row["id"], row["method"])], row["method"]
        assert row["exact"] and row["exact_hf"]
    hf_first = [r["tree_sizes"][0] for r in warm["examples"] if r["method"] == "hf-greedy"]
    assert hf_first == [1, 1, 1]   # the HF prefill forward carried only the uncached tail (+ the first token)


def test_warm_tools_refuses_the_methods_that_always_start_cold(target):
    """transformers' prompt lookup cannot continue from a cached prefix: such a method has no warm hook."""
    model, tok = target
    factories, _ = bench_methods.build_methods(["hf-pld"], model, tok, eos_token_ids=bench_methods.eos_ids(model, tok),
                                               pld_tokens=5)
    assert factories["hf-pld"]().warm is None and factories["hf-greedy"]().warm is not None
    with pytest.raises(ValueError, match=r"method\(s\) \['hf-pld'\] cannot start from a cached prefix"):
        harness.run_bench(model, tok, toy_records()[:1], factories, fmt=detect_format(tok), max_new_tokens=4,
                          progress=False, warm_tools=True, warmup=0)


def test_warm_tools_prefills_the_sidecar_toolbox_before_the_clock(target, results):
    """--warm-tools with a real sidecar server (tiny model, tools-first layout, block KV cache): each request's
    toolbox is prefilled untimed, so its wave starts from it; the target's tokens stay ar's."""
    from ooospec.eval.bench.ooospec_method import SidecarHints
    from ooospec.runtime.agent.session import PrefixCache
    from ooospec.runtime.serve.sidecar_app import create_app
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
    from ooospec.runtime.sidecar.wave import Sidecar
    from tests.runtime.conftest import tiny_model
    from tests.runtime.sidecar_servers import running_app

    model, tok = target
    sidecar = Sidecar(tiny_model("llama"), tok, max_new_tokens=6, metadata={"layout_version": 3},
                      prefix_cache=PrefixCache(max_tokens=50_000))
    with running_app(create_app(sidecar)) as url:
        hints = SidecarHints(SidecarClient(url, max_tokens=6), DEPLOYMENTS["wave-first"], 1)
        factories, _ = bench_methods.build_methods(["ar", "ooospec"], model, tok,
                                                   eos_token_ids=bench_methods.eos_ids(model, tok), hints=hints)
        res = harness.run_bench(model, tok, toy_records(), factories, fmt=detect_format(tok), max_new_tokens=24,
                                progress=False, warm_tools=True, warmup=0)
    cold = {(r["id"], r["method"]): r["tokens"] for r in results["examples"]}
    rows = [r for r in res["examples"] if r["method"] == "ooospec"]
    assert [r["tokens"] for r in rows] == [cold[(r["id"], "ar")] for r in rows]
    for row in rows:
        rec = next(r for r in toy_records() if r["id"] == row["id"])
        toolbox = sp.shared_block([], rec["tools"], layout=3).split("Conversation:")[0]
        server = row["hints"]["server"]   # wave-first: the wave's answer is in before the target starts
        assert server["cached_tokens"] >= len(tok(toolbox, add_special_tokens=False)["input_ids"]) - 1, row["id"]
        assert server["cached_tokens"] < server["block_tokens"]


def test_hf_peers_from_a_cached_prefix_are_exact_or_refuse():
    """Stock greedy ``generate`` continues from a pre-filled cache (first forward = the uncached tail, tokens =
    cold); prompt lookup either does the same or raises (transformers 5.24 feeds the whole prompt on top of the
    cache): never a silently different computation."""
    model = tiny_qwen2(seed=3).double()
    base = list(range(40, 52))
    prompt = base + base + base[:6]                  # repetitive: prompt lookup finds drafts
    kwargs = {"eos_token_ids": [0], "max_new_tokens": 20, "stop": None}
    for extra in ({}, {"prompt_lookup_num_tokens": 5}):
        cold = peers.hf_generate(model, prompt, **kwargs, **extra)
        warm = peers.WarmPrefix(model)
        warm.warm(prompt[:20])
        try:
            res = peers.hf_generate(model, prompt, cache=warm.take(), **kwargs, **extra)
        except RuntimeError as e:
            assert extra and "did not continue from the cache" in str(e)
            continue
        assert res.tokens == cold.tokens, extra
        assert res.tree_sizes[0] <= 1 + extra.get("prompt_lookup_num_tokens", 0)
        if not extra:
            assert res.tree_sizes[0] == 1


def test_warm_tools_refuses_a_method_without_a_cache_hook(target):
    model, tok = target
    factories, _ = bench_methods.build_methods(["ar", "hf-pld", "hf-assisted"], model, tok,
                                               eos_token_ids=bench_methods.eos_ids(model, tok), assistant=model)
    with pytest.raises(ValueError, match=r"--warm-tools: method\(s\) \['hf-pld', 'hf-assisted'\]"):
        harness.run_bench(model, tok, toy_records(), factories, fmt=detect_format(tok), max_new_tokens=8,
                        progress=False, warm_tools=True)


def test_llamacpp_peers_need_a_gguf_and_hf_peers_need_hf(target):
    model, tok = target
    with pytest.raises(ValueError, match="need a GGUF target"):
        bench_methods.build_methods(["ar", "llama.cpp"], model, tok, eos_token_ids=bench_methods.eos_ids(model, tok))

    class FakeLlamaCppTarget:
        backend = "llama.cpp"

    with pytest.raises(ValueError, match="need --backend hf"):
        bench_methods.build_methods(["ar", "hf-pld"], FakeLlamaCppTarget(), tok, eos_token_ids=[258], gguf="x.gguf")


def test_sidecar_wave_options_reach_the_client():
    import argparse

    from ooospec.eval.bench import cli as bench
    from ooospec.eval.bench import hint_sources

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--target", "t", "--dataset", "d", "--sidecar-url", "http://127.0.0.1:9",
                         "--sidecar-wave", "function-first", "--sidecar-top-k", "3", "--sidecar-min-prob", "0.2"])
    options = bench.hint_options(args)
    assert (options.sidecar_wave, options.sidecar_top_k, options.sidecar_min_prob) == ("function-first", 3, 0.2)
    proc, hints = hint_sources.start_hints(options, 1)          # nothing is contacted until a request
    client = hints.client
    assert proc is None and (client.wave, client.top_k, client.min_prob) == ("function-first", 3, 0.2)
    assert bench.hint_options(p.parse_args(["--target", "t", "--dataset", "d"])).sidecar_wave == "all"
    with pytest.raises(ValueError, match="top_k"):
        hint_sources.HintOptions(sidecar_wave="function-first", sidecar_top_k=0)


def test_released_guess_replays_each_bank_at_its_measured_latency():
    """``dedicated`` (the emulation): the wave ran alone; its early bank is released at the early latency and the
    final one at the final latency, both counted from the target's start, never before."""
    import time

    from ooospec.eval.bench.ooospec_method import ReleasedGuess
    from ooospec.runtime.drafters.hints import HintBank

    early, final = HintBank({"v": [1, 2]}), HintBank({"v": [1, 2, 3]})

    class Finished:                        # a function-first request whose two banks came at 0.05 s and 0.1 s
        done = True

        def poll(self):
            return final

    guess = ReleasedGuess(Finished(), [(0.05, early), (0.10, final)])
    assert guess.poll() is None and not guess.done
    time.sleep(0.06)
    assert guess.poll() is early and not guess.done
    time.sleep(0.05)
    assert guess.poll() is final and guess.done


def test_the_dedicated_emulation_times_the_wave_alone_and_keeps_the_output(target, results):
    from ooospec.eval.bench.ooospec_method import SidecarHints
    from ooospec.runtime.serve.sidecar_app import create_app
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
    from ooospec.runtime.sidecar.wave import Sidecar
    from tests.runtime.conftest import tiny_model
    from tests.runtime.sidecar_servers import running_app

    model, tok = target
    sidecar = Sidecar(tiny_model("llama"), tok, max_new_tokens=6, metadata={"layout_version": 3})
    with running_app(create_app(sidecar)) as url:
        hints = SidecarHints(SidecarClient(url, max_tokens=6, wave="function-first"), DEPLOYMENTS["dedicated"], 1)
        factories, _ = bench_methods.build_methods(["ar", "ooospec"], model, tok,
                                                   eos_token_ids=bench_methods.eos_ids(model, tok), hints=hints)
        res = harness.run_bench(model, tok, toy_records(), factories, fmt=detect_format(tok), max_new_tokens=24,
                                progress=False, warmup=0)
    cold = {(r["id"], r["method"]): r["tokens"] for r in results["examples"]}
    rows = [r for r in res["examples"] if r["method"] == "ooospec"]
    assert [r["tokens"] for r in rows] == [cold[(r["id"], "ar")] for r in rows]
    for row in rows:
        h = row["hints"]
        assert h["emulated"] and h["deployment"] == "dedicated"
        if h["error"] is None and h["ready_s"] is not None:      # a wave that ended: its banks were scheduled
            assert h["released_s"] and h["released_s"][-1] == pytest.approx(h["ready_s"], abs=0.01)
