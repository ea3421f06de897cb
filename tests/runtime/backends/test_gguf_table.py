"""The fast GGUF tensor table agrees with gguf's own reader, tensor by tensor, on tiny GGUFs built in code."""

from __future__ import annotations

import pytest

from ooospec.runtime.backends.gguf_table import tensor_table
from tests.runtime.tiny_gguf import make_tiny_gguf, quantize

pytest.importorskip("gguf")


def _reference(path):
    from gguf import GGUFReader

    return {t.name: (int(t.n_elements), int(t.n_bytes), len(t.shape)) for t in GGUFReader(path).tensors}


def test_tensor_table_matches_gguf_reader(tmp_path):
    path = make_tiny_gguf(tmp_path / "t.gguf", vocab=300, chat_template="{{ messages }}")   # strings, arrays
    table = tensor_table(path)
    assert {n: (t.n_elements, t.n_bytes, t.n_dims) for n, t in table.items()} == _reference(path)
    assert table["token_embd.weight"].n_elements == 300 * 64 and table["token_embd.weight"].n_bytes == 300 * 64 * 4


def test_tensor_table_of_a_quantized_file(tmp_path):
    pytest.importorskip("llama_cpp")
    src = make_tiny_gguf(tmp_path / "f32.gguf", vocab=300, hidden=64)
    dst = quantize(src, tmp_path / "q8.gguf", "Q8_0")
    table = tensor_table(dst)
    assert {n: (t.n_elements, t.n_bytes, t.n_dims) for n, t in table.items()} == _reference(dst)
    assert sum(t.n_bytes for t in table.values()) < sum(t.n_bytes for t in tensor_table(src).values()) / 3


def test_not_a_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="not a GGUF"):
        tensor_table(bad)
    path = make_tiny_gguf(tmp_path / "t.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="truncated|past the end"):
        tensor_table(cut)
