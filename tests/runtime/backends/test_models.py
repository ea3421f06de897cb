"""``load_target`` on a tiny model saved to a local folder: explicit and automatic dtypes (no downloads)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ooospec.runtime.backends import hardware, models
from tests.runtime.toy_bpe import toy_bpe


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(toy_bpe()), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    toy_bpe().save_pretrained(path)
    return str(path)


def test_load_target_local_folder(tiny_folder):
    model, tok = models.load_target(tiny_folder, dtype="fp32")
    assert model.dtype == torch.float32 and not model.training
    assert model.config._attn_implementation == "sdpa"
    assert tok.decode(tok.encode('{"name": "f"}')) == '{"name": "f"}'
    with pytest.raises(ValueError, match="dtype must be 'auto' or one of"):
        models.load_target(tiny_folder, dtype="int8")


@pytest.mark.parametrize(("flags", "bf16_speedup", "expected"), [
    (["avx2", "fma"], None, torch.float32),                     # Zen 3: bf16 would be emulated, no probe runs
    (["avx2", "avx512f", "amx_bf16"], 4.0, torch.bfloat16),     # AMX and the probe agrees
    (["avx2", "avx512_bf16"], 0.9, torch.float32),              # native bf16 that the probe finds slower
])
def test_load_target_auto_dtype_follows_the_cpu(tiny_folder, monkeypatch, flags, bf16_speedup, expected):
    monkeypatch.setattr(hardware, "cpu_info", lambda: {"model": "fake", "flags": flags, "cores": 2})

    def probe(threads, use_cache=True):
        assert bf16_speedup is not None, "no probe on a CPU without native bf16"
        return bf16_speedup

    monkeypatch.setattr(hardware, "bf16_speedup", probe)
    model, _ = models.load_target(tiny_folder)          # dtype="auto" is the default
    assert model.dtype == expected


def test_registry_and_fetch_stay_importable_from_models():
    from ooospec.runtime.backends import fetch

    assert models.REGISTRY is fetch.REGISTRY and models.fetch is fetch.fetch


def test_resolve_backend_picks_llamacpp_only_for_gguf_targets_on_the_cpu(tmp_path, monkeypatch):
    from ooospec.runtime.backends import llamacpp

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(llamacpp, "available", lambda: (True, "0.3.36"))
    assert models.resolve_backend("auto", "qwen2.5-coder-0.5b")[0] == "llama.cpp"
    assert models.resolve_backend("auto", str(gguf))[0] == "llama.cpp"
    assert models.resolve_backend("auto", str(tmp_path))[0] == "hf"               # an HF folder
    assert models.resolve_backend("auto", "qwen2.5-coder-0.5b", device="cuda")[0] == "hf"
    backend, why = models.resolve_backend("auto", "qwen2.5-coder-0.5b", dtype="fp32")
    assert backend == "hf" and "fp32" in why                                      # HF numerics asked for
    assert models.resolve_backend("hf", "qwen2.5-coder-0.5b") == ("hf", "given")
    with pytest.raises(ValueError, match="needs a GGUF target"):
        models.resolve_backend("llama.cpp", str(tmp_path))
    with pytest.raises(ValueError, match="runs on the CPU"):
        models.resolve_backend("llama.cpp", str(gguf), device="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        models.resolve_backend("vllm", str(gguf))
    monkeypatch.setattr(llamacpp, "available", lambda: (False, "llama_cpp does not import (ImportError: x)"))
    backend, why = models.resolve_backend("auto", str(gguf))
    assert backend == "hf" and "does not import" in why
    with pytest.raises(RuntimeError, match="ooospec.llamacpp_install"):
        models.resolve_backend("llama.cpp", str(gguf))
