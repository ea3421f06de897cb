"""What a measurement ran on: versions, threads and dtype with their reasons, CPU, roofline, footprint, commit.

    env = environment(threads, dtype, "auto", model, roofline)   # the ``env`` of a bench or transfer JSON
    env.update(backend_env(backend, model))
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess

import torch

from ooospec.runtime.backends import hardware
from ooospec.runtime.backends.target import as_target
from ooospec.runtime.paths import PACKAGE_ROOT


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_ROOT), *args], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(threads: tuple[int, str], dtype: tuple[str, str], dtype_requested: str, model,
                roofline: dict | None) -> dict:
    """Versions, threads and dtype (with the reasons they were chosen), CPU, roofline, footprint and commit.

    ``commit_dirty``: uncommitted changes were present.
    """
    import transformers

    status = _git("status", "--porcelain", "--untracked-files=no")
    info = hardware.cpu_info()
    return {
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "threads": threads[0], "threads_reason": threads[1],
        "dtype": dtype[0], "dtype_requested": dtype_requested, "dtype_reason": dtype[1],
        "cpu": info["model"], "cpu_flags": info["flags"], "cpu_count": os.cpu_count(),
        "cores_available": info["cores"], "roofline": roofline,
        "footprint": dataclasses.asdict(as_target(model).footprint()),
        "commit": _git("rev-parse", "HEAD"), "commit_dirty": None if status is None else bool(status),
        "loadavg_start": list(os.getloadavg()),
    }


def backend_env(backend: tuple[str, str], model) -> dict:
    """The backend, why it was chosen, and for llama.cpp its bindings' version and the GGUF's weight format."""
    out = {"backend": backend[0], "backend_reason": backend[1]}
    if backend[0] == "llama.cpp":
        from ooospec.runtime.backends import llamacpp

        out.update(llama_cpp=llamacpp.available()[1], weights=model.weight_type, gguf=str(model.path),
                   llama_threads=model.threads)
    return out
