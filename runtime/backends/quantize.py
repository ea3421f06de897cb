"""Quantized targets for vLLM's CPU backend: a registry target turned into a compressed-tensors checkpoint.

    ooospec models quantize qwen2.5-coder-1.5b --scheme w8a8 --calibration data/dedupe/train.jsonl --samples 128
    ooospec vllm-bench --target qwen2.5-coder-1.5b --quantized w8a8 ...      # the engine loads it from the cache

llm-compressor (``oneshot``) does the work; it pins its own transformers, so it lives in an environment of its own
(``bash eval/vllm/setup_quant.sh`` -> ``.venv-quant``, as vLLM's docs keep it), and only :func:`quantize` imports it.
The source is the registry's bf16 folder (the GGUF dequantized once by :func:`~.fetch.fetch`): the model vLLM plain
runs, so "the same target, fewer bytes".

Schemes (:data:`SCHEMES`; each one a recipe YAML, recorded verbatim beside the weights):

    w8a8      int8 weights per output channel (SmoothQuant 0.8, then GPTQ on the calibration prompts) and int8
              activations per token, scaled at run time: vLLM's CPU backend runs its GEMMs in int8 (oneDNN)
    w8a8-rtn  the same format, weights rounded to nearest, no calibration (seconds; for a quick look)
    w4a16     int4 weights in groups of 128 (GPTQ), bf16 activations: fewer bytes, bf16 GEMMs after unpacking
    w4a16-rtn the same format rounded to nearest (seconds)

GPTQ on the CPU is slow: ``w8a8`` of the 0.5B on 32 calibration records took 539 s on 2 Xeon cores (SmoothQuant's
pass, then GPTQ layer by layer); the ``-rtn`` schemes take seconds and give the same format, so the same speed.

``lm_head`` stays bf16 in every scheme: vLLM 0.32 has no compressed-tensors method for its ``ParallelLMHead``
(a checkpoint with an int8 head fails to load: "no module or parameter named 'lm_head.weight_scale'").

Calibration (:func:`calibration_texts`): records of the pipeline's own training split (never a benchmark), a seeded
sample, each rendered as the target sees it at serving time -- its chat template with the record's tools and
messages -- followed by the record's calls in the target's call syntax: the traffic the quantized model will serve.

Layout, written atomically (a temp folder renamed into place, ``DONE`` last)::

    $OOOSPEC_CACHE/models/<name>/quant/<scheme>/
        config.json (with quantization_config), model.safetensors, tokenizer files
        ooospec_quant.json   recipe, calibration (file, records, sha256 of their ids), source, versions, seconds
        DONE
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path

from ooospec.runtime.backends.fetch import REGISTRY, fetch, model_dir

logger = logging.getLogger(__name__)

MANIFEST = "ooospec_quant.json"
SETUP_HINT = ("llm-compressor is not installed in this environment (it pins its own transformers): run "
              "`bash eval/vllm/setup_quant.sh`, then `.venv-quant/bin/ooospec models quantize ...`")


class QuantizerMissing(RuntimeError):
    """llm-compressor cannot be imported here; the message says how to get it (:data:`SETUP_HINT`)."""


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One quantization scheme: its llm-compressor recipe and whether it reads calibration data."""

    name: str
    recipe: str
    calibrated: bool
    about: str


def _recipe(modifiers: str) -> str:
    return "quant_stage:\n  quant_modifiers:\n" + modifiers


SCHEMES = {s.name: s for s in (
    Scheme("w8a8", _recipe(
        "    SmoothQuantModifier:\n      smoothing_strength: 0.8\n"
        "    GPTQModifier:\n      targets: [Linear]\n      scheme: W8A8\n      ignore: [lm_head]\n"),
        True, "int8 weights (GPTQ) + dynamic per-token int8 activations; lm_head bf16"),
    Scheme("w8a8-rtn", _recipe(
        "    QuantizationModifier:\n      targets: [Linear]\n      scheme: W8A8\n      ignore: [lm_head]\n"),
        False, "int8 weights rounded to nearest + dynamic per-token int8 activations; lm_head bf16"),
    Scheme("w4a16", _recipe(
        "    GPTQModifier:\n      targets: [Linear]\n      scheme: W4A16\n      ignore: [lm_head]\n"),
        True, "int4 weights in groups of 128 (GPTQ), bf16 activations; lm_head bf16"),
    Scheme("w4a16-rtn", _recipe(
        "    QuantizationModifier:\n      targets: [Linear]\n      scheme: W4A16\n      ignore: [lm_head]\n"),
        False, "int4 weights in groups of 128 rounded to nearest, bf16 activations; lm_head bf16"),
)}


def quantized_dir(name: str, scheme: str, cache: str | os.PathLike | None = None) -> Path:
    """Where ``name`` quantized with ``scheme`` lives in the cache (whether or not it exists yet)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; choose from {', '.join(SCHEMES)}")
    return model_dir(name, cache) / "quant" / scheme


def is_quantized(name: str, scheme: str, cache: str | os.PathLike | None = None) -> bool:
    return (quantized_dir(name, scheme, cache) / "DONE").exists()


def resolve_quantized(name: str, scheme: str, cache: str | os.PathLike | None = None) -> Path:
    """The finished folder of ``name`` in ``scheme``; a clear error naming the command that makes it otherwise."""
    out = quantized_dir(name, scheme, cache)
    if not (out / "DONE").exists():
        raise FileNotFoundError(f"{name} has no {scheme} checkpoint at {out}: make it with "
                                f"`ooospec models quantize {name} --scheme {scheme}` (in .venv-quant, "
                                f"eval/vllm/setup_quant.sh)")
    return out


def target_folder(target: str, scheme: str | None = None, cache: str | os.PathLike | None = None) -> Path:
    """The folder an engine loads for ``target``: a registry name's bf16 folder (fetched when missing) or, with
    ``scheme``, its quantized checkpoint; anything else is taken as a local HF folder."""
    if scheme:
        if target not in REGISTRY:
            raise ValueError(f"a quantized scheme takes a registry target, got {target!r} (pass a local quantized "
                             "folder as the target itself)")
        return resolve_quantized(target, scheme, cache)
    return fetch(target, cache) if target in REGISTRY else Path(target)


def quantization_of(folder: str | os.PathLike) -> dict | None:
    """A quantized checkpoint's scheme, calibration and versions (its manifest); ``None`` for other weights."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    m = json.loads(path.read_text())
    return {k: m.get(k) for k in ("target", "scheme", "about", "calibration", "versions")}


def sample_records(rows: list[dict], n: int, seed: int = 0) -> list[dict]:
    """A seeded sample of ``n`` of ``rows`` (valid records, e.g. :func:`ooospec.pipelines.records.load_records`'s),
    sorted by id; all of them when fewer."""
    rows = sorted(rows, key=lambda r: r["id"])
    if not rows:
        raise ValueError("no valid records to calibrate on")
    if n < len(rows):
        rows = sorted(random.Random(seed).sample(rows, n), key=lambda r: r["id"])
    return rows


def calibration_texts(records: list[dict], tokenizer) -> list[str]:
    """Each record as the target reads and writes it: the prompt (chat template, tools) then its calls and EOS."""
    from ooospec.runtime.formats import detect_format

    fmt = detect_format(tokenizer)
    eos = tokenizer.eos_token or ""
    return [fmt.render_prompt(tokenizer, r["messages"], r["tools"])
            + "\n".join(fmt.render_call(c) for c in r["calls"]) + eos for r in records]


def ids_digest(records: list[dict]) -> str:
    return hashlib.sha256("\n".join(r["id"] for r in records).encode()).hexdigest()


def manifest(name: str, scheme: Scheme, source: Path, calibration: dict | None, seconds: float) -> dict:
    """What made the checkpoint: enough to rebuild it and to tell two checkpoints apart."""
    import importlib.metadata as md

    versions = {}
    for dist in ("llmcompressor", "compressed-tensors", "transformers", "torch"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    gguf = REGISTRY[name].sha256 if name in REGISTRY else None
    return {"target": name, "scheme": scheme.name, "about": scheme.about, "recipe": scheme.recipe,
            "source": {"folder": str(source), "gguf_sha256": gguf}, "calibration": calibration,
            "versions": versions, "seconds": round(seconds, 1)}


def _oneshot(source: Path, out: Path, scheme: Scheme, texts: list[str], max_seq_length: int, threads: int) -> None:
    """llm-compressor's one-shot pass over ``source``, saved compressed into ``out``."""
    try:
        import torch
        from datasets import Dataset
        from llmcompressor import oneshot
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise QuantizerMissing(SETUP_HINT) from e
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(source)
    kwargs = {}
    if scheme.calibrated:
        rows = [tokenizer(t, add_special_tokens=False, truncation=True, max_length=max_seq_length) for t in texts]
        kwargs = {"dataset": Dataset.from_list([{"input_ids": r["input_ids"], "attention_mask": r["attention_mask"]}
                                                for r in rows]),
                  "num_calibration_samples": len(rows), "max_seq_length": max_seq_length,
                  "shuffle_calibration_samples": False}
    oneshot(model=model, recipe=scheme.recipe, **kwargs)
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)


def quantize(name: str, scheme_name: str, calibration: list[dict] | None = None, *, source_file: str | None = None,
             samples: int = 128, seed: int = 0, max_seq_length: int = 1024, threads: int = 2,
             cache: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Quantize registry target ``name`` with ``scheme_name`` into the cache; returns the folder.

    A finished folder is kept unless ``force``. Calibrated schemes need ``calibration``: valid records (the CLI reads
    them from ``source_file``, e.g. the pipeline's ``data/dedupe/train.jsonl``); ``samples`` of them, seeded, each
    cut at ``max_seq_length`` tokens.
    """
    scheme = SCHEMES.get(scheme_name)
    if scheme is None:
        raise ValueError(f"unknown quantization scheme {scheme_name!r}; choose from {', '.join(SCHEMES)}")
    out = quantized_dir(name, scheme.name, cache)
    if (out / "DONE").exists() and not force:
        logger.info("%s %s: cached at %s", name, scheme.name, out)
        return out
    if scheme.calibrated and calibration is None:
        raise ValueError(f"scheme {scheme.name} calibrates on tool-call records: pass --calibration "
                         f"(e.g. data/dedupe/train.jsonl, the pipeline's training split)")
    if scheme.calibrated and not calibration:
        raise ValueError(f"{source_file or 'the calibration file'}: no valid records to calibrate on")
    source = fetch(name, cache)
    t0 = time.perf_counter()
    texts, calib = [], None
    if scheme.calibrated:
        from transformers import AutoTokenizer

        records = sample_records(calibration, samples, seed)
        texts = calibration_texts(records, AutoTokenizer.from_pretrained(source))
        calib = {"file": source_file, "records": len(records), "seed": seed, "ids_sha256": ids_digest(records),
                 "max_seq_length": max_seq_length}
        logger.info("%s %s: calibrating on %d records of %s", name, scheme.name, len(records), source_file)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _oneshot(source, tmp, scheme, texts, max_seq_length, threads)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / MANIFEST).write_text(json.dumps(manifest(name, scheme, source, calib, time.perf_counter() - t0),
                                           indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    (out / "DONE").write_text("ok\n")
    logger.info("%s %s: %s (%.0f s)", name, scheme.name, out, time.perf_counter() - t0)
    return out
