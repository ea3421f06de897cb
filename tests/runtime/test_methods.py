"""The method registry: one list that the bench, the chat server and the agent loop read; one per-request decoder."""

from __future__ import annotations

import argparse

import pytest

from ooospec.eval import agent_bench, harness
from ooospec.runtime import methods
from ooospec.runtime.chat import ChatModel
from ooospec.runtime.formats import detect_format
from ooospec.runtime.hints import HintBank, HintDrafter
from ooospec.runtime.pld import PromptLookupDrafter
from ooospec.runtime.retrieval import RetrievalDrafter
from ooospec.runtime.schema_fsm import SchemaFSMDrafter
from tests.runtime.chat_tiny import CALL, TOOLS, USER, trained_chat_model


def _choices(add_arguments, flag: str) -> tuple[str, ...]:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return tuple(next(a for a in p._actions if flag in a.option_strings).choices)


def test_every_cli_reads_its_choices_from_the_registry():
    from ooospec import serve_cli

    assert methods.SERVED == ("ar", "toolspec", "ooospec")
    assert _choices(serve_cli.add_arguments, "--method") == methods.SERVED
    assert _choices(agent_bench.add_arguments, "--method") == methods.SERVED
    assert harness.KNOWN_METHODS == tuple(methods.REGISTRY)
    assert set(methods.ENGINE_METHODS) | set(harness.HF_PEERS) | set(harness.LLAMACPP_PEERS) == set(methods.REGISTRY)
    assert harness.HF_PEERS == ("hf-greedy", "hf-pld", "hf-assisted")
    from ooospec.eval import bench

    assert methods.HINT_SOURCES == ("sidecar", "gold", "oracle")
    assert _choices(bench.add_arguments, "--hints") == methods.HINT_SOURCES
    assert {n: m.hints for n, m in methods.REGISTRY.items() if m.hints} == {
        "ooospec": "sidecar", "ooospec-gold": "gold", "ooospec-oracle": "oracle"}
    assert "ooospec-oracle" not in methods.SERVED             # bench only: it needs ar's output of the request
    with pytest.raises(ValueError, match="unknown method 'pld'; known: ar, toolspec, ooospec"):
        methods.get_method("pld", served=True)
    with pytest.raises(ValueError, match="unknown method"):
        ChatModel(*trained_chat_model(), method="pld")


def test_request_independent_methods_are_engines_and_per_request_ones_refuse():
    model, _ = trained_chat_model()
    assert methods.REGISTRY["ar"](model).drafters == []
    pld = methods.REGISTRY["pld-fixed"](model)
    assert [type(d) for d in pld.drafters] == [PromptLookupDrafter]
    assert (pld.policy, pld.max_draft_nodes) == ("fixed", methods.FIXED_NODES)
    for name in ("toolspec", "ooospec"):
        with pytest.raises(ValueError, match="built per request"):
            methods.REGISTRY[name](model)
    with pytest.raises(ValueError, match="a peer"):
        methods.RequestDecoder("llama.cpp", model)


def test_decoder_builds_the_request_engine_and_carries_state_across_requests():
    model, tok = trained_chat_model()
    fmt = detect_format(tok)
    ar = methods.RequestDecoder("ar", model)
    assert ar.engine(tok, fmt, TOOLS) is ar.engine()          # one engine for the stream

    hints = HintDrafter(HintBank.from_calls([CALL], fmt, tok))
    toolspec = methods.RequestDecoder("toolspec", model)
    first = toolspec.engine(tok, fmt, TOOLS, hints)
    assert [type(d) for d in first.drafters] == [SchemaFSMDrafter, RetrievalDrafter, PromptLookupDrafter]
    second = toolspec.engine(tok, fmt, TOOLS)
    assert second is not first and second.acceptance is first.acceptance is toolspec.acceptance
    assert second.drafters[1] is first.drafters[1]              # one retrieval bank for the stream

    ooospec = methods.RequestDecoder("ooospec", model)
    assert [type(d) for d in ooospec.engine(tok, fmt, TOOLS, hints).drafters] == [
        SchemaFSMDrafter, HintDrafter, RetrievalDrafter, PromptLookupDrafter]


def test_every_method_decodes_the_same_call():
    model, tok = trained_chat_model()
    texts = {m: ChatModel(model, tok, method=m).complete(USER, TOOLS, max_new_tokens=40).calls
             for m in methods.SERVED}
    assert texts == {m: [CALL] for m in methods.SERVED}
