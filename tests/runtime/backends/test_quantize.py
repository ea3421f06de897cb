"""Quantized targets: cache layout, calibration texts, recipes, the atomic write, and the errors a user meets.

llm-compressor is not installed here (it lives in .venv-quant): its one-shot pass is replaced by a stub that writes
what it would, so what this module does around it (calibration sample, manifest, DONE, no half-written folder) is
tested; the real pass is measured in eval/reports/cpu/quantized/.
"""

from __future__ import annotations

import builtins
import json

import pytest
import yaml

from ooospec import models_cli
from ooospec.runtime.backends import quantize as q
from tests.runtime.chat_tiny import CALL, CALL_TEXT, TOOLS, USER
from tests.runtime.toy_bpe import HERMES_TEMPLATE, with_template


def _record(i: int) -> dict:
    return {"id": f"r{i:03d}", "source": "t", "split": "train", "tools": TOOLS, "messages": USER, "calls": [CALL]}


def _write_records(path, n: int, bad: int = 0):
    lines = [json.dumps(_record(i)) for i in range(n)] + ["{not json"] * bad
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def fake_source(tmp_path, monkeypatch):
    """The registry fetch returns a folder of the toy tokenizer (no download)."""
    src = tmp_path / "src"
    with_template(HERMES_TEMPLATE).save_pretrained(src)
    monkeypatch.setattr(q, "fetch", lambda name, cache=None: src)
    return src


def test_every_scheme_is_a_recipe_llm_compressor_reads_and_keeps_lm_head_bf16():
    for scheme in q.SCHEMES.values():
        recipe = yaml.safe_load(scheme.recipe)
        modifiers = recipe["quant_stage"]["quant_modifiers"]
        quantizers = [m for name, m in modifiers.items() if name != "SmoothQuantModifier"]
        assert quantizers and all(m["ignore"] == ["lm_head"] for m in quantizers), scheme.name
        gptq = "GPTQModifier" in modifiers
        assert scheme.calibrated == gptq, scheme.name


def test_layout_and_unknown_scheme(tmp_path):
    assert q.quantized_dir("qwen2.5-coder-0.5b", "w8a8", tmp_path) == \
        tmp_path / "models" / "qwen2.5-coder-0.5b" / "quant" / "w8a8"
    with pytest.raises(ValueError, match="unknown quantization scheme 'int3'"):
        q.quantized_dir("qwen2.5-coder-0.5b", "int3", tmp_path)


def test_missing_checkpoint_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="ooospec models quantize qwen2.5-coder-1.5b --scheme w8a8"):
        q.resolve_quantized("qwen2.5-coder-1.5b", "w8a8", tmp_path)


def test_calibration_texts_are_prompt_then_call_then_eos():
    tok = with_template(HERMES_TEMPLATE)
    [text] = q.calibration_texts([_record(0)], tok)
    assert text.endswith(CALL_TEXT + tok.eos_token)
    assert text.startswith(tok.apply_chat_template(USER, tools=TOOLS, add_generation_prompt=True, tokenize=False))


def test_sample_is_seeded_and_sorted():
    rows = [_record(i) for i in reversed(range(20))]
    a, b = q.sample_records(rows, 5, seed=1), q.sample_records(rows, 5, seed=1)
    assert [r["id"] for r in a] == [r["id"] for r in b] == sorted(r["id"] for r in a)
    assert len(a) == 5 and q.sample_records(rows, 5, seed=2) != a
    assert [r["id"] for r in q.sample_records(rows, 99)] == sorted(r["id"] for r in rows)
    with pytest.raises(ValueError, match="no valid records"):
        q.sample_records([], 5)


def test_quantize_writes_manifest_and_done_and_then_is_cached(tmp_path, fake_source, monkeypatch):
    seen = []

    def stub(source, out, scheme, texts, max_seq_length, threads):
        seen.append((source, scheme.name, len(texts), max_seq_length))
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(q, "_oneshot", stub)
    calib = [_record(i) for i in range(10)]
    out = q.quantize("qwen2.5-coder-0.5b", "w8a8", calib, source_file="train.jsonl", samples=4,
                     cache=tmp_path / "cache")
    assert seen == [(fake_source, "w8a8", 4, 1024)]
    assert (out / "DONE").exists() and (out / "config.json").exists()
    assert not out.with_name("w8a8.partial").exists()
    m = json.loads((out / q.MANIFEST).read_text())
    assert m["scheme"] == "w8a8" and m["recipe"] == q.SCHEMES["w8a8"].recipe
    assert m["calibration"]["records"] == 4 and len(m["calibration"]["ids_sha256"]) == 64
    assert m["calibration"]["file"] == "train.jsonl"
    assert m["source"]["gguf_sha256"] == q.REGISTRY["qwen2.5-coder-0.5b"].sha256
    q.quantize("qwen2.5-coder-0.5b", "w8a8", calib, samples=4, cache=tmp_path / "cache")
    assert len(seen) == 1  # cached: not redone
    assert q.resolve_quantized("qwen2.5-coder-0.5b", "w8a8", tmp_path / "cache") == out


def test_rtn_needs_no_calibration_and_calibrated_schemes_do(tmp_path, fake_source, monkeypatch):
    monkeypatch.setattr(q, "_oneshot", lambda source, out, scheme, texts, *a: (out / "config.json").write_text("{}"))
    out = q.quantize("qwen2.5-coder-0.5b", "w8a8-rtn", None, cache=tmp_path)
    assert json.loads((out / q.MANIFEST).read_text())["calibration"] is None
    with pytest.raises(ValueError, match="--calibration"):
        q.quantize("qwen2.5-coder-0.5b", "w4a16", None, cache=tmp_path)
    with pytest.raises(ValueError, match="train.jsonl: no valid records"):
        q.quantize("qwen2.5-coder-0.5b", "w4a16", [], source_file="train.jsonl", cache=tmp_path)


def test_a_failed_pass_leaves_no_checkpoint(tmp_path, fake_source, monkeypatch):
    def boom(source, out, *a):
        (out / "half.safetensors").write_text("x")
        raise RuntimeError("killed")

    monkeypatch.setattr(q, "_oneshot", boom)
    with pytest.raises(RuntimeError, match="killed"):
        q.quantize("qwen2.5-coder-0.5b", "w8a8-rtn", None, cache=tmp_path)
    assert not q.is_quantized("qwen2.5-coder-0.5b", "w8a8-rtn", tmp_path)
    out = q.quantized_dir("qwen2.5-coder-0.5b", "w8a8-rtn", tmp_path)
    assert not out.exists() and not out.with_name("w8a8-rtn.partial").exists()


def test_cli_without_llm_compressor_says_how_to_get_it(tmp_path, fake_source, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_llmcompressor(name, *a, **k):
        if name.startswith("llmcompressor"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_llmcompressor)
    parser = __import__("argparse").ArgumentParser()
    models_cli.add_arguments(parser)
    args = parser.parse_args(["quantize", "qwen2.5-coder-0.5b", "--scheme", "w8a8-rtn", "--cache", str(tmp_path)])
    assert models_cli.run_cli(args) == 2
    assert "bash eval/vllm/setup_quant.sh" in capsys.readouterr().err
    assert not q.quantized_dir("qwen2.5-coder-0.5b", "w8a8-rtn", tmp_path).exists()


def test_cli_reads_the_calibration_file_and_reports_bad_lines(tmp_path, fake_source, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(q, "_oneshot", lambda source, out, scheme, texts, *a: seen.append(len(texts)))
    parser = __import__("argparse").ArgumentParser()
    models_cli.add_arguments(parser)
    calib = _write_records(tmp_path / "train.jsonl", 6, bad=2)
    args = parser.parse_args(["quantize", "qwen2.5-coder-0.5b", "--scheme", "w8a8", "--calibration", str(calib),
                              "--samples", "4", "--cache", str(tmp_path / "cache")])
    assert models_cli.run_cli(args) == 0
    assert seen == [4]
    err = capsys.readouterr().err
    assert "2 malformed records skipped" in err and "train.jsonl" in err
