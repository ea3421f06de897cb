"""The chat server on the llama.cpp backend, built the way ``ooospec serve --backend llama.cpp`` builds it, against
the official ``openai`` client: every answer is llama.cpp's own greedy decoding of the same prompt, token for token.

The target is a tiny random GGUF built in code (:mod:`tests.runtime.tiny_gguf`) with the hermes chat template, so
requests with tools render as a registry Qwen's do; its answers are random plain pieces (no calls, valid text that
streams), which is all an exactness test needs. References come from
:func:`~ooospec.runtime.backends.llamacpp.greedy_reference` on the served target itself, after each test's
requests (it takes the context, so the sessions start over after it).
"""

from __future__ import annotations

import argparse

import httpx
import openai
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (python -m ooospec.llamacpp_install)")

from ooospec import serve_cli
from ooospec.runtime.backends.llamacpp import greedy_reference
from ooospec.runtime.serve.chat_app import Limits, create_app
from tests.runtime.chat_tiny import TOOLS, USER
from tests.runtime.sidecar_servers import running_app
from tests.runtime.tiny_gguf import make_tiny_gguf
from tests.runtime.toy_bpe import HERMES_TEMPLATE

NAME = "tiny-gguf"
N_CTX = 1024
LIMITS = Limits(max_body_bytes=64 << 10, max_tokens=64, default_max_tokens=24, max_messages=16)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf"
    return str(make_tiny_gguf(path, head_scale=8.0, chat_template=HERMES_TEMPLATE, plain_output=True))


@pytest.fixture(scope="module")
def server(gguf):
    """``(url, chat, turns)``: the app on ``ooospec serve``'s ChatModel; ``turns`` records every generated turn as
    ``(prepared, max_tokens, turn)``."""
    args = _args("--target", gguf, "--backend", "llama.cpp", "--n-ctx", str(N_CTX), "--method", "toolspec")
    chat = serve_cli.build_chat(args, serve_cli.served_method(args), threads=2)
    turns: list = []
    generate = chat.generate

    def recording(prepared, **kwargs):
        turn = generate(prepared, **kwargs)
        turns.append((prepared, kwargs["max_new_tokens"], turn))
        return turn

    chat.generate = recording
    with running_app(create_app(chat, model_name=NAME, limits=LIMITS)) as url:
        yield url, chat, turns
    chat.model.close()


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _reference(chat, prepared, max_tokens: int) -> list[int]:
    """llama.cpp's plain greedy decoding of the turn's prompt, with the server's stop rule (EOS, the end of a call
    when tools are shown, ``max_tokens``)."""
    def call_complete(out) -> bool:
        return chat.fmt.is_complete(prepared.opening + chat.tokenizer.decode(list(out), skip_special_tokens=False))

    stop = call_complete if prepared.tools else None
    return greedy_reference(chat.model, prepared.prompt_ids, max_tokens, chat.eos_token_ids, stop)[0]


def _check_turns(chat, turns, texts: list[str]) -> None:
    """Every recorded turn is the reference token for token, and the client got its text."""
    assert len(turns) == len(texts)
    for (prepared, max_tokens, turn), text in zip(turns, texts):
        ref = _reference(chat, prepared, max_tokens)
        assert turn.result.tokens == ref
        assert text == chat.tokenizer.decode([t for t in ref if t not in chat.eos_token_ids],
                                             skip_special_tokens=False)
    turns.clear()


def test_the_backend_is_llama_cpp(server):
    url, chat, _ = server
    assert chat.backend == "llama.cpp" and chat.n_ctx == N_CTX and chat.sessions is not None
    assert httpx.get(url + "/health", timeout=30).json()["backend"] == "llama.cpp"


def test_tool_requests_equal_llama_cpp_greedy(client, server):
    """A request with tools, its next turn streamed, another conversation in between and the first one again:
    each answer is the reference; the continued turns reuse their conversation's KV (parked meanwhile)."""
    _, chat, turns = server
    first = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=20)
    choice = first.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert first.usage.completion_tokens == len(turns[-1][2].result.tokens)
    texts = [choice.message.content]

    follow = USER + [{"role": "assistant", "content": choice.message.content},
                     {"role": "user", "content": "And in Rome?"}]
    chunks = list(client.chat.completions.create(model=NAME, messages=follow, tools=TOOLS, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True}))
    texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0

    other = [{"role": "user", "content": "Any news from Oslo?"}]
    texts.append(client.chat.completions.create(model=NAME, messages=other, tools=TOOLS).choices[0].message.content)
    again = follow + [{"role": "assistant", "content": texts[1]}, {"role": "user", "content": "Thanks."}]
    last = client.chat.completions.create(model=NAME, messages=again, tools=TOOLS, max_tokens=12)
    texts.append(last.choices[0].message.content)
    assert last.model_extra["ooospec"]["session"] == "session"
    assert last.usage.prompt_tokens_details.cached_tokens > len(turns[1][0].prompt_ids) // 2
    _check_turns(chat, turns, texts)


def test_text_streams_and_equals_llama_cpp_greedy(client, server):
    _, chat, turns = server
    chunks = list(client.chat.completions.create(model=NAME, messages=USER, stream=True, max_tokens=16))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) >= 2 and chunks[-1].choices[0].finish_reason in ("stop", "length")
    _check_turns(chat, turns, ["".join(deltas)])


def test_a_request_over_the_context_gets_400(client, server):
    long = [{"role": "user", "content": "t1 " * 700}]
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model=NAME, messages=long, max_tokens=64)
    r = client.chat.completions.create(model=NAME, messages=USER, tools=TOOLS, max_tokens=4)
    assert r.usage.completion_tokens <= 4
    server[2].clear()


def test_auto_picks_llama_cpp_for_the_gguf(gguf):
    backend, why = serve_cli.choose_backend(_args("--target", gguf))
    assert backend == "llama.cpp" and "GGUF target" in why
    assert serve_cli.choose_backend(_args("--target", gguf, "--dtype", "fp32")) == \
        ("hf", "dtype fp32 given: HF numerics asked for")
