"""The wave gate: its estimates and decisions on constructed stats, the online update, the decision record, and
the hooks (client, chat turn, bench method) against a stand-in sidecar that counts the queries it is asked --
with the output equal to AR whatever the gate decides."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from ooospec.runtime.decoding import build_engine, make_engine
from ooospec.runtime.drafters.hints import HintDrafter, HintStats
from ooospec.runtime.drafters.pld import PromptLookupDrafter
from ooospec.runtime.engine import GenerationResult, StepStats
from ooospec.runtime.formats import hermes
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.client import RequestStats, SidecarClient
from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
from ooospec.runtime.sidecar.gate import WaveGate
from ooospec.runtime.sidecar.gate_decision import decide, tools_key
from ooospec.runtime.sidecar.gate_pricing import (
    Option,
    calibrated,
    expected_cost_s,
    expected_saving_s,
    wave_compute_s,
)
from ooospec.runtime.sidecar.outcome import (
    WaveOutcome,
    interference_sample,
    outcome_of,
    value_chars,
    verbatim_slots,
)
from tests.pipelines.sidecar_tiny import byte_tokenizer
from tests.runtime.conftest import tiny_model
from tests.runtime.sidecar_servers import MESSAGES, TOOLS, StandIn

WAVE = sp.build_wave(MESSAGES, TOOLS)            # index, get_weather.city, get_weather.unit, get_time.tz
SHARED, SPLIT = DEPLOYMENTS["shared"].prior, DEPLOYMENTS["split"].prior


# ------------------------------------------------------------------------------------------ pure estimates


def test_shared_prior_skips_split_prior_sends():
    d = decide(WAVE, TOOLS, SHARED)
    assert d.kind == "skip" and d.wave is None and d.queries == ()
    assert all(c > s for s, c in (d.options[k] for k in ("index", "slots")))      # every wave costs more
    d = decide(WAVE, TOOLS, SPLIT)
    assert d.kind == "slots" and d.saving_s > d.cost_s
    assert d.queries == ("index", "get_weather.city", "get_time.tz")              # the enum slot is dropped
    assert d.dropped == ("get_weather.unit",)
    assert d.wave.block == WAVE.block and d.wave.queries == tuple(WAVE.queries[i] for i in (0, 1, 3))


def test_a_slot_whose_values_run_long_prices_the_wave_by_them():
    """A wave decodes until its longest answer ends: where the target's calls wrote 120-character values for a
    queried slot, the ``slots`` option costs ``2 + 120 / chars_per_token`` forwards, not the prior's 5, and the
    gate that sent it now skips; values no longer than the prior's, or slots the wave does not ask, change nothing.
    The gate learns the lengths from the calls in each request's outcome."""
    from dataclasses import replace

    est = replace(DEPLOYMENTS["wave-first"].prior, step_s=0.3, marginal=0.41)    # the target waits for the wave
    sent = decide(WAVE, TOOLS, est)
    assert sent.kind == "slots"
    long_city = decide(WAVE, TOOLS, est, value_chars={("get_weather", "city"): 120.0})
    assert long_city.kind != "slots"
    assert long_city.options["slots"][1] > 5 * sent.options["slots"][1]                  # 42 forwards, not 5
    assert decide(WAVE, TOOLS, est, value_chars={("get_weather", "city"): 6.0}).options == sent.options
    assert decide(WAVE, TOOLS, est, value_chars={("get_weather", "unit"): 900.0}).options == sent.options   # dropped
    gate = WaveGate(est)
    outcome = _outcome("skip", accepted=0, after=0)
    gate.observe(replace(outcome, values=(("get_weather", "city", 100), ("get_weather", "city", 140))))
    assert gate.decide(WAVE, TOOLS).kind != "slots"
    assert value_chars([{"name": "get_weather", "arguments": {"city": "Paris", "n": 12, "x": None}}]) == (
        ("get_weather", "city", 5), ("get_weather", "n", 2), ("get_weather", "x", 0))


def test_a_machine_measured_slower_turns_a_send_into_a_skip_and_a_bad_measurement_changes_nothing():
    assert decide(WAVE, TOOLS, SPLIT).kind == "slots"
    slow = {"prefill_per_token": 0.05, "decode_forward_s": 2.0, "num_queries": 9}     # 45x / 28x the prior
    est = calibrated(SPLIT, slow)
    assert est.prefill_per_token == 0.05 and est.decode_forward + 9 * est.decode_per_query == pytest.approx(2.0)
    assert decide(WAVE, TOOLS, est).kind == "skip"
    gate = WaveGate(SPLIT)
    for bad in ({}, {"prefill_per_token": -1, "decode_forward_s": 0.1, "num_queries": 9},
                {"prefill_per_token": "x", "decode_forward_s": 0.1, "num_queries": 9},
                {"prefill_per_token": float("nan"), "decode_forward_s": 0.1, "num_queries": 9}):
        assert gate.calibrate(bad) is False
    assert gate.prior == SPLIT and gate.calibration is None
    assert gate.calibrate(slow) is True and gate.decide(WAVE, TOOLS).kind == "skip"
    assert gate.calibrate(slow) and gate.prior == est                   # idempotent


def test_cost_above_saving_is_a_skip_and_the_formulas_hold():
    est = replace(SHARED, interference=1.0, chars_per_token=1.0, prefill_per_token=0.001, decode_forward=0.05,
                  decode_per_query=0.0, forwards={"index": 2.0, "slots": 4.0}, latency_factor=1.0,
                  target_prefill=10.0, accept_rate={"index": 0.1, "slots": 0.5}, call_tokens=40, marginal=0.1,
                  step_s=0.2, client_s=0.0)
    opt = Option("slots", WAVE.queries, 100)
    tokens = 100 + sum(len(q.text) for q in WAVE.queries)
    assert wave_compute_s(opt, est) == pytest.approx(0.001 * tokens + 4 * 0.05)
    assert expected_saving_s(opt, est) == pytest.approx(0.5 * 40 * 0.1 * 0.2)                 # 0.4 s
    assert expected_cost_s(opt, est) == pytest.approx(wave_compute_s(opt, est))
    assert expected_saving_s(Option("skip", (), 0), est) == expected_cost_s(Option("skip", (), 0), est) == 0
    # a late bank: the wave ends 0.5 s after a 0.3 s target prefill, at 0.05 s a token -> 10 tokens already out
    late = replace(est, target_prefill=0.3, latency_factor=0.8 / wave_compute_s(opt, est), target_token_s=0.05)
    assert expected_saving_s(opt, late) == pytest.approx(0.5 * 30 * 0.1 * 0.2)
    assert decide(WAVE, TOOLS, replace(est, interference=10.0)).kind == "skip"
    assert decide(WAVE, TOOLS, replace(est, interference=0.0)).kind == "slots"


def test_only_the_index_pays():
    # the index answer carries most of the accepted tokens; the argument branches add decode cost for little
    est = replace(SPLIT, interference=1.0, prefill_per_token=0.0001, decode_forward=0.001, decode_per_query=0.05,
                  forwards={"index": 2.0, "slots": 5.0}, accept_rate={"index": 0.4, "slots": 0.45},
                  marginal=0.2, step_s=0.2, call_tokens=50, client_s=0.0)
    d = decide(WAVE, TOOLS, est)
    assert d.kind == "index" and d.queries == ("index",) and [q.form for q in d.wave.queries] == ["function_index"]
    s_index, c_index = d.options["index"]
    s_slots, c_slots = d.options["slots"]
    assert s_index - c_index > max(0.0, s_slots - c_slots)


def test_verbatim_slots_are_dropped():
    # evidence: the target copied get_weather.city from the request 5 of 5 times; get_time.tz never
    verbatim = {("get_weather", "city"): (5.0, 5.0), ("get_time", "tz"): (0.0, 5.0)}
    d = decide(WAVE, TOOLS, SPLIT, verbatim)
    assert d.kind == "slots" and d.queries == ("index", "get_time.tz")
    assert set(d.dropped) == {"get_weather.city", "get_weather.unit"}
    # every slot verbatim: nothing but the index is left to ask
    everything = {("get_weather", "city"): (5.0, 5.0), ("get_time", "tz"): (5.0, 5.0)}
    d = decide(WAVE, TOOLS, SPLIT, everything)
    assert d.kind == "index" and "slots" not in d.options
    # what counts as verbatim: the value's text in the request's messages
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin", "days": 3}}]
    msgs = [{"role": "user", "content": "Paris for 3 days"}]
    assert verbatim_slots(calls, msgs) == (("get_weather", "city", True), ("get_weather", "unit", False),
                                           ("get_weather", "days", True))


def test_decision_record_shape():
    d = decide(WAVE, TOOLS, SPLIT, key="k")
    rec = d.to_dict()
    assert set(rec) == {"decision", "expected_saving_s", "expected_cost_s", "queries", "num_queries",
                        "dropped_verbatim", "options", "probe", "cached_chars", "model_latency_s"}
    assert rec["decision"] == "slots" and rec["num_queries"] == len(rec["queries"]) == 3
    assert set(rec["options"]) == {"skip", "index", "slots"} and rec["options"]["skip"] == [0.0, 0.0]
    json.dumps(rec)                                   # a plain JSON record (bench rows, chat turn stats)
    gate = WaveGate(SHARED)
    gate.decide(WAVE, TOOLS)
    assert gate.log == [decide(WAVE, TOOLS, SHARED, key=tools_key(TOOLS)).to_dict()]


def test_one_tool_offers_no_index_wave():
    # the name of the only tool is drafted by the schema FSM: an index wave would buy nothing
    one = sp.build_wave(MESSAGES, TOOLS[:1])
    index_only = replace(SPLIT, accept_rate={"index": 0.9, "slots": 0.0})     # priced to win when offered
    assert decide(WAVE, TOOLS, index_only).kind == "index"
    d = decide(one, TOOLS[:1], index_only)
    assert "index" not in d.options and d.kind == "skip"
    assert decide(one, TOOLS[:1], index_only, probe=True).kind == "slots"     # a probe sends what is left
    assert decide(one, TOOLS[:1], SPLIT).kind == "slots"


def test_interference_sample():
    lost, overlapped = interference_sample([(0.0, 1.5, 1.0)], (0.0, 1.0), 0.8)
    assert lost == pytest.approx(0.5 * 2 / 3) and overlapped == pytest.approx(0.8)
    # steps outside the window and unknown expectations do not count
    assert interference_sample([(2.0, 1.0, 0.5), (0.0, 1.0, -1.0)], (0.0, 1.0), 0.8) is None
    assert interference_sample([(0.0, 1.0, 1.0)], (1.0, 1.0), 0.8) is None


# ------------------------------------------------------------------------------------------ online update


def _outcome(kind, *, accepted, after, server=None, interference=None, call_tokens=50, wave_s=None):
    return WaveOutcome(key=tools_key(TOOLS), kind=kind, call_tokens=call_tokens, tokens_after_ready=after,
                       accepted_hint_tokens=accepted, target_prefill_s=1.0, target_decode_s=0.1 * call_tokens,
                       idle_step_s=(0.19,) * 10, client_s=0.005, server=server or {}, wave_s=wave_s,
                       num_queries=3, block_chars=len(WAVE.block), query_chars=60, interference=interference)


def test_evidence_moves_the_decision():
    # shared prior -> skip; the target's calls turn out long (300 tokens): the same wave now pays
    gate = WaveGate(SHARED)
    assert gate.decide(WAVE, TOOLS).kind == "skip"
    for _ in range(20):
        gate.observe(_outcome("skip", accepted=0, after=0, call_tokens=300))
    assert gate.estimates(tools_key(TOOLS)).call_tokens > 200
    assert gate.decide(WAVE, TOOLS).kind == "slots"

    # split prior -> send; the waves turn out to slow the target by their whole compute and hints rarely land
    gate = WaveGate(SPLIT)
    assert gate.decide(WAVE, TOOLS).kind == "slots"
    server = {"prefill_s": 0.4, "decode_s": 0.4, "n_forwards": 5, "block_tokens": 340, "query_tokens": 20}
    for _ in range(20):
        gate.observe(_outcome("slots", accepted=1, after=50, server=server, interference=(0.8, 0.8), wave_s=0.85))
    est = gate.estimates(tools_key(TOOLS))
    assert est.interference > 0.7 and est.accept_rate["slots"] < 0.1
    assert est.prefill_per_token == pytest.approx(0.4 / 360, rel=0.2)
    assert gate.decide(WAVE, TOOLS).kind == "skip"


def test_a_tool_sets_waves_slower_than_priced_teach_that_tool_set_only():
    # wave-first: the target waits for the wave, so its latency is the whole cost
    gate = WaveGate(replace(SPLIT, target_waits=True, accept_rate={"index": 0.05, "slots": 0.5}, step_s=0.1,
                            call_tokens=100), prior_weight=1.0)
    first = gate.decide(WAVE, TOOLS)
    assert first.kind == "slots" and first.model_latency_s > 0
    assert first.to_dict()["model_latency_s"] == pytest.approx(first.model_latency_s, abs=1e-4)
    # its waves take 5x what the model priced (long free-text values the model did not know of): 4 of them
    for _ in range(4):
        gate.observe(replace(_outcome("slots", accepted=50, after=100, wave_s=5 * first.model_latency_s),
                             model_latency_s=first.model_latency_s))
    est = gate.estimates(tools_key(TOOLS))
    assert 4.0 < est.wave_scale["slots"] < 5.0 and est.wave_scale["index"] == 1.0    # an index wave: one forward
    assert gate.decide(WAVE, TOOLS).kind != "slots"          # the same hints no longer pay for such a wave
    assert gate.estimates("another tool set").wave_scale["slots"] == 1.0      # other toolboxes keep the model's price
    # a wave that took what was priced leaves the scale where it was; no priced latency (0) teaches nothing
    gate = WaveGate(SPLIT, prior_weight=1.0)
    gate.observe(replace(_outcome("slots", accepted=1, after=50, wave_s=0.8), model_latency_s=0.8))
    gate.observe(_outcome("slots", accepted=1, after=50, wave_s=9.0))
    assert gate.estimates(tools_key(TOOLS)).wave_scale["slots"] == pytest.approx(1.0)
    # an index wave faster than priced does not make the toolbox's slots waves look cheaper (as it once did here:
    # an `AddMeeting` slots wave priced 1.01 s -> 0.88 s after an index wave, then took 1.62 s)
    gate.observe(replace(_outcome("index", accepted=0, after=50, wave_s=0.1), model_latency_s=0.3))
    est = gate.estimates(tools_key(TOOLS))
    assert est.wave_scale["index"] == pytest.approx((0.1 + 0.5) / (0.3 + 0.5)) and est.wave_scale["slots"] == 1.0


def test_a_slow_tool_makes_the_slots_wave_pay_in_an_agent_loop():
    # shared prior: no tool runs on a guess -> skip; the loop's tools take 3 s and the joined calls hit:
    # a slots wave hides most of that latency and now pays (the index alone joins no call, so it cannot)
    gate = WaveGate(SHARED)
    key = tools_key(TOOLS)
    assert gate.decide(WAVE, TOOLS).kind == "skip"
    for _ in range(4):
        gate.observe_tool(key, 3.0, True)
    est = gate.estimates(key)
    # global mean (12 + 1 * 0) / (4 + 1) = 2.4 s; the tool set's own, shrunk toward it: (12 + 1 * 2.4) / 5
    assert est.tool_s == pytest.approx(14.4 / 5, rel=1e-6) and est.hit_rate > SHARED.hit_rate
    d = gate.decide(WAVE, TOOLS)
    assert d.kind == "slots" and d.options["index"][0] < d.options["slots"][0]
    # a skipped turn (hit None) teaches the latency only; misses pull the hit rate down until the wave stops paying
    gate.observe_tool(key, 3.0, None)
    assert gate.estimates(key).hit_rate == est.hit_rate
    for _ in range(40):
        gate.observe_tool(key, 0.1, False)
    assert gate.decide(WAVE, TOOLS).kind == "skip"
    # fresh(): the prior and settings without the evidence
    again = gate.fresh()
    assert again.estimates(key) == WaveGate(SHARED).estimates(key) and again.prior == gate.prior


def test_idle_prefill_only_when_the_next_wave_is_sent_and_fits_in_the_tool():
    gate = WaveGate(SPLIT)
    key = tools_key(TOOLS)
    assert not gate.prefill_pays(WAVE.block, TOOLS)            # nothing decided for this tool set yet
    assert gate.decide(WAVE, TOOLS).kind == "slots"
    assert not gate.prefill_pays(WAVE.block, TOOLS)            # no tool latency seen: nothing to hide it in
    for _ in range(4):
        gate.observe_tool(key, 3.0, None)
    assert gate.prefill_pays(WAVE.block, TOOLS)
    long_block = WAVE.block + "x" * 100_000                     # ~37 s of prefill at the prior: not within 3 s
    assert not gate.prefill_pays(long_block, TOOLS)
    assert gate.prefills == {"sent": 1, "skipped": 3} and gate.summary()["idle_prefills"] == gate.prefills
    skipping = WaveGate(replace(SHARED, interference=5.0))     # a wave costs 5x its compute: never pays
    for _ in range(4):
        skipping.observe_tool(key, 3.0, None)
    assert skipping.decide(WAVE, TOOLS).kind == "skip"
    assert not skipping.prefill_pays(WAVE.block, TOOLS)        # the next wave is skipped too: a prefill is waste


def test_probe_sends_every_nth_skip():
    gate = WaveGate(SHARED, probe_every=3)
    kinds = [gate.decide(WAVE, TOOLS) for _ in range(6)]
    assert [d.kind != "skip" for d in kinds] == [False, False, True, False, False, True]
    assert all(d.probe for d in kinds if d.kind != "skip")


def test_gate_is_thread_safe():
    gate = WaveGate(SPLIT)
    server = {"prefill_s": 0.4, "decode_s": 0.4, "n_forwards": 5, "block_tokens": 340, "query_tokens": 20}

    def work():
        for _ in range(50):
            gate.decide(WAVE, TOOLS)
            gate.observe(_outcome("slots", accepted=5, after=40, server=server, wave_s=0.9))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gate.num_requests == 200 and len(gate.log) == 200


def test_outcome_of_reads_the_request():
    steps = [StepStats(tree_size=3, accepted=2, new_tokens=3, t_draft=0.01, t_forward=0.19, tie_stop=False)] * 4
    result = GenerationResult(tokens=list(range(12)), n_forwards=4, steps=steps, prefill_s=1.0, decode_s=0.8,
                              stop_reason="stop")
    hs = HintStats(ready_step=1, num_polls=2, num_proposed_steps=3, num_proposed_tokens=12, num_accepted_tokens=4,
                   match_s=0.001, num_views=5, bank_tokens=40)
    st = RequestStats(arrival_t=100.0, sent_t=100.0, response_t=101.1, n_queries=3, build_s=0.002,
                      server={"prefill_s": 0.5, "decode_s": 0.3, "n_forwards": 4, "block_tokens": 300})
    d = decide(WAVE, TOOLS, SPLIT, key="k")
    o = outcome_of(d, result, hs, st, [{"name": "get_weather", "arguments": {"city": "Paris"}}], MESSAGES)
    assert o.kind == "slots" and o.call_tokens == 12 and o.tokens_after_ready == 9 and o.accepted_hint_tokens == 4
    assert o.idle_step_s == (0.2, 0.2, 0.2)        # the first step (1.0-1.2 s) ran under the wave (0-1.1 s)
    assert o.wave_s == pytest.approx(1.1) and o.client_s == pytest.approx(0.003)
    assert o.interference == pytest.approx((0.0, 0.8 * 0.1 / 1.1))   # that step took its idle time: nothing lost
    assert o.verbatim == (("get_weather", "city", True),)
    assert o.values == (("get_weather", "city", 5),)            # what a wave decodes for that slot, learnt
    assert o.model_latency_s == d.model_latency_s > 0            # what the gate priced the wave at


# ------------------------------------------------------------------------------------------ the hooks


INDEX_ONLY = replace(SPLIT, interference=1.0, prefill_per_token=0.0001, decode_forward=0.001, decode_per_query=0.05,
                     accept_rate={"index": 0.4, "slots": 0.45}, marginal=0.2)
GATES = {"off": None, "skip": SHARED, "slots": SPLIT, "index": INDEX_ONLY}


@pytest.fixture(scope="module")
def target():
    model, tok = tiny_model("llama"), byte_tokenizer()
    prompt = tok("user: Weather in Paris, in celsius?\nassistant: ", add_special_tokens=False)["input_ids"]
    return model, tok, prompt, build_engine("ar", model).generate(prompt, 24).tokens


@pytest.mark.parametrize("mode", list(GATES))
def test_client_sends_what_the_gate_decides_and_output_equals_ar(target, mode):
    model, tok, prompt, ar = target
    gate = None if GATES[mode] is None else WaveGate(GATES[mode])
    with StandIn("by_query") as server:
        client = SidecarClient(server.url, gate=gate)
        req = client.submit(MESSAGES, TOOLS, fmt=hermes, tokenizer=tok)
        req.wait(10)
        drafter = HintDrafter(req)
        result = make_engine(model, [drafter, PromptLookupDrafter()]).generate(prompt, 24)
        record = req.report(result, drafter.stats(result), [])
    assert result.tokens == ar                                        # exact whatever was asked
    expected = {"off": [4], "skip": [], "slots": [3], "index": [1]}[mode]
    assert [len(q) for q in server.queries] == expected
    if mode == "off":
        assert record is None and req.stats().decision is None
        return
    assert record["decision"] == mode and req.stats().decision == record
    if mode == "skip":
        assert req.done and req.poll() is None and req.stats().sent_t is None
    else:
        assert req.stats().call["name"] == "get_weather" and req.poll() is not None
        assert server.queries[0][0] == "Query: tool index"
    assert gate.estimates(tools_key(TOOLS)).call_tokens != GATES[mode].call_tokens   # the request was learnt


def test_chat_turn_carries_the_decision():
    from ooospec.runtime.agent.chat import ChatModel
    from tests.runtime.chat_tiny import TOOLS as CHAT_TOOLS
    from tests.runtime.chat_tiny import USER, trained_chat_model

    model, tok = trained_chat_model()
    ar = ChatModel(model, tok, method="ar").complete(USER, CHAT_TOOLS, max_new_tokens=48)
    with StandIn("by_query") as server:
        for prior, decision, n_queries in ((SHARED, "skip", []), (SPLIT, "slots", [2])):
            server.received.clear()
            chat = ChatModel(model, tok, method="ooospec", sidecar=SidecarClient(server.url, gate=WaveGate(prior)))
            turn = chat.complete(USER, CHAT_TOOLS, max_new_tokens=48)
            assert turn.text == ar.text and turn.calls == ar.calls
            assert turn.hints["wave"]["decision"] == decision
            assert [turn.hints["wave"]["num_queries"]] == (n_queries or [0])
            # a turn can end (and cancel its request) before the client's thread has posted the wave: what the
            # server got, if anything, is exactly the decided wave
            assert [len(q) for q in server.queries] in ([], n_queries)


def test_bench_method_reports_the_decision(target):
    from ooospec.eval.bench.method_api import BenchContext
    from ooospec.eval.bench.ooospec_method import SidecarHints

    model, tok, prompt, ar = target
    ctx = BenchContext(model=model, tokenizer=tok, fmt=hermes, eos_token_ids=[], max_new_tokens=24,
                       stop=lambda g: False, record={"messages": MESSAGES, "tools": TOOLS})
    with StandIn("by_query") as server:
        for deploy, decision, n in (("shared", "skip", 0), ("wave-first", "skip", 0)):
            client = SidecarClient(server.url, gate=WaveGate(DEPLOYMENTS[deploy].prior))
            hints = SidecarHints(client, DEPLOYMENTS[deploy], 1)
            source = hints.start(ctx, time.perf_counter())
            drafter = HintDrafter(source)
            result = make_engine(model, [drafter, PromptLookupDrafter()]).generate(prompt, 24)
            row = hints.finish(source, drafter, result)
            assert result.tokens == ar and row["wave"]["decision"] == decision and row["n_queries"] == n
        client = SidecarClient(server.url, gate=WaveGate(SPLIT))
        hints = SidecarHints(client, DEPLOYMENTS["shared"], 1)
        source = hints.start(ctx, time.perf_counter())
        source.wait(10)
        drafter = HintDrafter(source)
        result = make_engine(model, [drafter, PromptLookupDrafter()]).generate(prompt, 24)
        row = hints.finish(source, drafter, result)
    assert result.tokens == ar and row["wave"]["decision"] == "slots" and row["n_queries"] == 3
    assert len(server.queries) == 1


def test_wave_first_prices_the_whole_latency_and_counts_no_token_before_the_bank():
    """``target_waits`` (wave-first): the target commits nothing while it waits, so every call token can take a hint,
    and the wave's latency is the cost whatever the interference; the concurrent model charges the compute only."""
    est = replace(SHARED, interference=0.5, chars_per_token=1.0, prefill_per_token=0.001, decode_forward=0.05,
                  decode_per_query=0.0, forwards={"index": 2.0, "slots": 4.0}, latency_factor=1.2,
                  target_prefill=0.1, target_token_s=0.05, accept_rate={"index": 0.1, "slots": 0.5},
                  call_tokens=40, marginal=0.2, step_s=0.2, client_s=0.01)
    opt = Option("slots", WAVE.queries, 100)
    compute = wave_compute_s(opt, est)
    latency = 1.2 * compute
    waits = replace(est, target_waits=True)
    assert expected_saving_s(opt, waits) == pytest.approx(0.5 * 40 * 0.2 * 0.2)
    assert expected_cost_s(opt, waits) == pytest.approx(latency + 0.01)
    committed = (latency - 0.1) / 0.05                      # concurrent: tokens out before the bank
    assert expected_saving_s(opt, est) == pytest.approx(0.5 * max(0.0, 40 - committed) * 0.2 * 0.2)
    assert expected_cost_s(opt, est) == pytest.approx(0.5 * compute + 0.01)
    assert DEPLOYMENTS["wave-first"].prior.target_waits and not SHARED.target_waits
