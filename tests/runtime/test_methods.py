"""The method registry: one list that the bench, the chat server and the agent loop read; one per-request decoder."""

from __future__ import annotations

import argparse

import pytest

from ooospec.eval.agent import cli as agent_bench
from ooospec.eval.bench import methods as bench_methods
from ooospec.runtime import decoding, methods
from ooospec.runtime.agent.chat import ChatModel
from ooospec.runtime.drafters.hints import HintBank, HintDrafter
from ooospec.runtime.drafters.pld import PromptLookupDrafter
from ooospec.runtime.drafters.retrieval import RetrievalDrafter
from ooospec.runtime.drafters.schema_fsm import SchemaFSMDrafter
from ooospec.runtime.formats import detect_format
from ooospec.runtime.sidecar.deployments import DEPLOYMENTS
from tests.runtime.chat_tiny import CALL, TOOLS, USER, trained_chat_model


def _parses(add_arguments, argv: list[str]) -> bool:
    """Whether a CLI's parser accepts ``argv``."""
    p = argparse.ArgumentParser()
    add_arguments(p)
    try:
        p.parse_args(argv)
    except SystemExit:
        return False
    return True


def test_every_cli_accepts_exactly_the_registrys_choices(capsys):
    from ooospec import serve_cli
    from ooospec.eval.bench import cli as bench

    def serve(*argv):
        return _parses(serve_cli.add_arguments, ["--target", "t", *argv])

    def bench_(*argv):
        return _parses(bench.add_arguments, ["--target", "t", "--dataset", "d", *argv])

    def agent(*argv):
        return _parses(agent_bench.add_arguments, ["--target", "t", *argv])

    assert methods.SERVED == ("ar", "toolspec", "ooospec")
    for name in methods.REGISTRY:
        assert serve("--method", name) == agent("--method", name) == (name in methods.SERVED), name
    assert tuple(methods.HINT_SOURCES) == ("oracle", "gold", "sidecar")       # the report tables' order
    assert all(bench_("--hints", source) for source in methods.HINT_SOURCES) and not bench_("--hints", "psychic")
    # a server never makes the target wait for a wave; the bench places only a sidecar on its own box
    assert [d for d in ("off", "shared", "split", "wave-first", "remote") if serve("--sidecar-gate", d)] == [
        "off", "shared", "split", "remote"]
    assert [d for d in ("shared", "split", "wave-first", "remote") if bench_("--sidecar-deploy", d)] == [
        "shared", "split", "wave-first"]
    for gate in ("on", "off"):          # the benches place the sidecar: "on" is their deployment's prior
        assert bench_("--sidecar-gate", gate) and agent("--sidecar-gate", gate)
    assert not bench_("--sidecar-gate", "remote")
    capsys.readouterr()


def test_the_registry_sorts_every_method_and_its_hints():
    assert set(methods.BENCH_METHODS) | set(methods.VLLM_BENCH_METHODS) == set(methods.REGISTRY)
    assert set(methods.ENGINE_METHODS) | set(bench_methods.HF_PEERS) | set(bench_methods.LLAMACPP_PEERS) == set(
        methods.BENCH_METHODS)
    assert bench_methods.HF_PEERS == ("hf-greedy", "hf-pld", "hf-assisted")
    assert methods.REFERENCES == {"hf": "hf-greedy", "llama.cpp": "llama.cpp", "vllm": "vllm"}
    assert {n: m.hints for n, m in methods.REGISTRY.items() if m.hints} == {
        "ooospec": "sidecar", "ooospec-dedicated": "sidecar", "ooospec-wave-first": "sidecar", "ooospec-gold": "gold",
        "ooospec-oracle": "oracle"}
    assert [n for n, m in methods.REGISTRY.items() if m.uses_sidecar] == [
        "ooospec", "ooospec-dedicated", "ooospec-wave-first"]
    assert {methods.hint_method(s) for s in methods.HINT_SOURCES} == set(methods.HINT_METHODS) - {
        "ooospec-dedicated", "ooospec-wave-first"}
    wave_first = methods.REGISTRY["ooospec-wave-first"]        # real: the target waits, nothing emulated
    assert DEPLOYMENTS[wave_first.deployment].target_waits and not DEPLOYMENTS[wave_first.deployment].emulated
    dedicated = methods.REGISTRY["ooospec-dedicated"]          # the emulation: never served, always labelled
    assert not dedicated.served and DEPLOYMENTS[dedicated.deployment].emulated and "EMULATED" in dedicated.summary
    assert [n for n, m in methods.REGISTRY.items() if not m.warm_starts] == ["hf-pld", "hf-assisted"]
    assert methods.default_served(with_sidecar=True) == "ooospec"
    assert methods.default_served(with_sidecar=False) == "toolspec"
    assert "ooospec-oracle" not in methods.SERVED             # bench only: it needs ar's output of the request
    with pytest.raises(ValueError, match="unknown method 'pld'; known: ar, toolspec, ooospec"):
        methods.get_method("pld", served=True)
    with pytest.raises(ValueError, match="unknown method"):
        ChatModel(*trained_chat_model(), method="pld")


def test_request_independent_methods_are_engines_and_per_request_ones_refuse():
    model, _ = trained_chat_model()
    assert decoding.build_engine("ar", model).drafters == []
    pld = decoding.build_engine("pld-fixed", model)
    assert [type(d) for d in pld.drafters] == [PromptLookupDrafter]
    assert (pld.policy, pld.max_draft_nodes) == ("fixed", methods.FIXED_NODES)
    for name in ("toolspec", "ooospec"):
        with pytest.raises(ValueError, match="built per request"):
            decoding.build_engine(name, model)
    with pytest.raises(ValueError, match="a peer"):
        decoding.RequestDecoder("llama.cpp", model)


def test_decoder_builds_the_request_engine_and_carries_state_across_requests():
    model, tok = trained_chat_model()
    fmt = detect_format(tok)
    ar = decoding.RequestDecoder("ar", model)
    assert ar.engine(tok, fmt, TOOLS) is ar.engine()          # one engine for the stream

    hints = HintDrafter(HintBank.from_calls([CALL], fmt, tok))
    toolspec = decoding.RequestDecoder("toolspec", model)
    first = toolspec.engine(tok, fmt, TOOLS, hints)
    assert [type(d) for d in first.drafters] == [SchemaFSMDrafter, RetrievalDrafter, PromptLookupDrafter]
    second = toolspec.engine(tok, fmt, TOOLS)
    assert second is not first and second.acceptance is first.acceptance is toolspec.acceptance
    assert second.drafters[1] is first.drafters[1]              # one retrieval bank for the stream

    ooospec = decoding.RequestDecoder("ooospec", model)
    assert [type(d) for d in ooospec.engine(tok, fmt, TOOLS, hints).drafters] == [
        SchemaFSMDrafter, HintDrafter, RetrievalDrafter, PromptLookupDrafter]


def test_every_method_decodes_the_same_call():
    model, tok = trained_chat_model()
    texts = {m: ChatModel(model, tok, method=m).complete(USER, TOOLS, max_new_tokens=40).calls
             for m in methods.SERVED}
    assert texts == {m: [CALL] for m in methods.SERVED}
