"""``ooospec serve --backend``: which backend ``auto`` picks and why (logged), the clear errors for choices that
cannot run, and the context check a fixed-size (llama.cpp) context puts on ``max_tokens``. Nothing here loads a
model: the bindings' presence is stubbed, the loaders are fakes (the served llama.cpp model:
``test_chat_llamacpp.py``)."""

from __future__ import annotations

import argparse
import logging

import pytest

from ooospec import serve_cli
from ooospec.runtime.backends import llamacpp, models
from ooospec.runtime.serve.chat_app import fit_context
from ooospec.runtime.serve.http import RequestError


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def gguf(tmp_path) -> str:
    path = tmp_path / "model.gguf"      # resolving looks at the name and that the file exists, never inside
    path.write_bytes(b"GGUF")
    return str(path)


@pytest.fixture
def bindings(monkeypatch):
    """Set whether llama.cpp's bindings import: ``bindings(True)`` / ``bindings(False)``."""
    def set_to(ok: bool) -> None:
        answer = (True, "0.3.36") if ok else (False, "llama_cpp does not import (ModuleNotFoundError: no llama_cpp)")
        monkeypatch.setattr(llamacpp, "available", lambda: answer)
    return set_to


def test_the_default_is_auto_and_help_says_what_it_picks():
    assert _args("--target", "x").backend == "auto"
    p = argparse.ArgumentParser()
    serve_cli.add_arguments(p)
    text = " ".join(p.format_help().split())
    assert "--backend {auto,hf,llama.cpp}" in text and "'auto' (default) = llama.cpp" in text


def test_a_bad_backend_value_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        _args("--target", "x", "--backend", "vllm")
    assert e.value.code == 2
    err = capsys.readouterr().err.replace("'", "")     # Python 3.12.8+ quotes the choices
    assert "argument --backend: invalid choice: vllm (choose from auto, hf, llama.cpp)" in err
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'hf', 'llama.cpp'\), got 'vllm'"):
        models.resolve_backend("vllm", "x")


def test_auto_resolution(gguf, tmp_path, bindings):
    bindings(True)
    assert serve_cli.choose_backend(_args("--target", gguf)) == \
        ("llama.cpp", "GGUF target on the CPU: llama.cpp 0.3.36 runs its quantized weights")
    assert serve_cli.choose_backend(_args("--target", str(tmp_path))) == \
        ("hf", "not a GGUF target (HF folder or hub id)")
    assert serve_cli.choose_backend(_args("--target", "Qwen/Qwen2.5-0.5B-Instruct")) == \
        ("hf", "not a GGUF target (HF folder or hub id)")
    assert serve_cli.choose_backend(_args("--target", gguf, "--dtype", "bf16")) == \
        ("hf", "dtype bf16 given: HF numerics asked for")
    bindings(False)
    backend, why = serve_cli.choose_backend(_args("--target", gguf))
    assert backend == "hf" and why.startswith("GGUF target, but llama_cpp does not import")


@pytest.mark.parametrize("argv, match", [
    (["--backend", "llama.cpp", "--target", "{folder}"], "--backend llama.cpp: the llama.cpp backend needs a GGUF"),
    (["--backend", "llama.cpp", "--target", "{gguf}", "--dtype", "fp32"], "--dtype fp32: the llama.cpp backend runs"),
    (["--backend", "hf", "--target", "{gguf}", "--n-ctx", "2048"], r"--n-ctx sets .* but the backend is hf \(given\)"),
    (["--target", "{gguf}", "--dtype", "fp32", "--n-ctx", "2048"], r"backend is hf \(dtype fp32 given"),
    (["--backend", "llama.cpp", "--target", "{gguf}", "--n-ctx", "100"], "--n-ctx 100: at least 576"),
])
def test_choices_that_cannot_run_stop_at_start_up(argv, match, gguf, tmp_path, bindings):
    bindings(True)
    argv = [a.format(gguf=gguf, folder=tmp_path) for a in argv]
    with pytest.raises(SystemExit, match=match):
        serve_cli.choose_backend(_args(*argv))


def test_llama_cpp_without_bindings_says_how_to_install(gguf, bindings):
    bindings(False)
    with pytest.raises(SystemExit, match=r"--backend llama.cpp: llama_cpp does not import .*ooospec.llamacpp_install"):
        serve_cli.choose_backend(_args("--backend", "llama.cpp", "--target", gguf))


class _FakeLlamaTarget:
    n_ctx = 0


def test_the_choice_and_its_reason_are_logged(gguf, bindings, monkeypatch, caplog):
    bindings(True)
    loaded = []

    def fake_llamacpp(name, threads=None, cache=None, **kwargs):
        loaded.append(("llama.cpp", kwargs))
        target = _FakeLlamaTarget()
        target.n_ctx = kwargs["n_ctx"]
        return target, "tok"

    monkeypatch.setattr(models, "load_llamacpp_target", fake_llamacpp)
    monkeypatch.setattr(models, "load_target", lambda *a, **k: loaded.append(("hf", k)) or ("model", "tok"))
    with caplog.at_level(logging.INFO, logger=serve_cli.__name__):
        serve_cli.load_served_target(_args("--target", gguf), threads=2)
        serve_cli.load_served_target(_args("--target", gguf, "--dtype", "fp32"), threads=2)
    assert loaded == [("llama.cpp", {"n_ctx": serve_cli.DEFAULT_N_CTX}),
                      ("hf", {"dtype": "fp32", "threads": 2, "cache": None, "backend": "hf"})]
    lines = [r.getMessage() for r in caplog.records]
    assert "backend llama.cpp (GGUF target on the CPU: llama.cpp 0.3.36 runs its quantized weights)" in lines
    assert "backend hf (dtype fp32 given: HF numerics asked for)" in lines


def test_fit_context():
    assert fit_context(64, True, 500, None) == 64          # no fixed context (hf): unchanged
    assert fit_context(64, True, 500, 64) == 64
    assert fit_context(512, False, 900, 100) == 100        # the default is cut to what fits
    with pytest.raises(RequestError, match="max_tokens=512 does not fit .* at most 100") as e:
        fit_context(512, True, 900, 100)                   # a named max_tokens is refused
    assert e.value.status == 400
    with pytest.raises(RequestError, match="leaves no room"):
        fit_context(8, False, 1020, 0)
