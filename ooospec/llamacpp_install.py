"""Install llama-cpp-python, built for THIS CPU, into the running interpreter (the llama.cpp backend's bindings).

    python -m ooospec.llamacpp_install            # no-op when the bindings already load

Why not a plain dependency: PyPI has only the source distribution for Linux here (the prebuilt wheels elsewhere
need glibc 2.38), pip would build it with ``-march=native`` and keep the result in its wheel cache, and a wheel
built on an AVX-512 machine crashes with SIGILL on an AVX2-only one. So the wheel is built once per CPU (its ISA
flags) and Python version and kept in ``$OOOSPEC_CACHE/wheels/llama-cpp-python-<version>/<key>/``; a later
install on the same kind of CPU takes seconds. The build takes ~10-30 minutes on 2 cores (cmake + gcc).
After installing, the bindings are loaded in a subprocess (an illegal instruction would kill only that).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ooospec.runtime.paths import cache_dir

VERSION = "0.3.36"
# the vendored llama.cpp only: no multimodal library, tools, examples, tests or server
CMAKE_ARGS = ("-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
              "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF")
CHECK = "import llama_cpp; llama_cpp.llama_backend_init(); print(llama_cpp.__version__)"


def cpu_key() -> str:
    """A short hash of the CPU's ISA flags, the Python version and the machine: what a native build depends on."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.partition(":")[2].split()))
                break
    except OSError:
        pass
    text = f"{flags}|{platform.machine()}|{sys.version_info.major}.{sys.version_info.minor}|{VERSION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def wheel_dir(cache: str | None = None) -> Path:
    return cache_dir(cache or None) / "wheels" / f"llama-cpp-python-{VERSION}" / cpu_key()


def loads(python: str = sys.executable) -> str | None:
    """The bindings' version when they import and initialise in a fresh interpreter, else None."""
    r = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def build_wheel(dst: Path) -> Path:
    """Build the wheel from the sdist into ``dst`` (atomically: a temporary folder renamed at the end)."""
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS,
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dst.name}.", suffix=".partial", dir=dst.parent))
    try:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "--no-binary",
               "llama-cpp-python", f"llama-cpp-python=={VERSION}", "-w", str(tmp)]
        print(f"building llama-cpp-python {VERSION} for this CPU (cmake + gcc; 10-30 min on 2 cores) ...",
              file=sys.stderr, flush=True)
        t0 = time.time()
        subprocess.run(cmd, env=env, check=True)
        print(f"built in {time.time() - t0:.0f} s", file=sys.stderr)
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ooospec.llamacpp_install", description=__doc__.split("\n\n")[0])
    p.add_argument("--cache", default=None, help="cache root (default $OOOSPEC_CACHE or ~/.cache/ooospec)")
    p.add_argument("--force", action="store_true", help="rebuild even when a wheel for this CPU is cached")
    args = p.parse_args(argv)
    have = loads()
    if have == VERSION and not args.force:
        print(f"llama-cpp-python {have} already loads here")
        return 0
    where = wheel_dir(args.cache)
    wheels = sorted(where.glob("llama_cpp_python-*.whl")) if where.is_dir() else []
    if args.force or not wheels:
        build_wheel(where)
        wheels = sorted(where.glob("llama_cpp_python-*.whl"))
        if not wheels:
            raise SystemExit(f"the build left no wheel in {where}")
    pip = [sys.executable, "-m", "pip", "install", "--no-cache-dir"]
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(wheels[-1])], check=True)
    subprocess.run([*pip, str(wheels[-1])], check=True)   # its dependencies, without reinstalling them
    got = loads()
    if got is None:
        raise SystemExit(f"llama-cpp-python installed from {wheels[-1]} but does not load on this CPU; rebuild with "
                         f"--force (the cached wheel may come from another CPU with the same flags hash)")
    print(f"llama-cpp-python {got} installed from {wheels[-1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
