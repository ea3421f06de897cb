"""Start, probe and stop a sidecar server process (``ooospec sidecar serve``), for benchmarks, tests and scripts.

    with launch_sidecar(threads=1, cpus=[1]) as proc:      # the shipped adapter, pinned to core 1
        client = SidecarClient(proc.url)                    # runtime/sidecar/client.py
        ...
        wait_idle(proc.url)                                 # its waves are over (before timing the next call)

:func:`launch_sidecar` runs the server as a subprocess (optionally pinned to some cores) and waits for its
``/health``; :func:`start_server` does that for any server command line (vLLM too); :func:`health` and
:func:`wait_idle` ask a running one; :func:`stop_tree` stops one with everything it started.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)


class SidecarProcess:
    """A sidecar server subprocess: ``url``, ``stop()``; a context manager that stops it on exit."""

    def __init__(self, popen: subprocess.Popen, url: str, log_path: Path):
        self.popen, self.url, self.log_path = popen, url, log_path

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (graceful), then SIGKILL after ``timeout`` seconds; returns the exit code."""
        return stop_tree(self.popen, timeout)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def descendants(pid: int) -> list[int]:
    """The PIDs of ``pid``'s children, their children, ... (read from Linux's ``/proc``; [] where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop_tree(popen: subprocess.Popen, timeout: float = 60.0) -> int:
    """Stop a server and everything it started: SIGTERM, SIGKILL after ``timeout`` seconds, then SIGKILL each of its
    descendants still alive (vLLM's engine core and workers outlive an API server that dies before it reaps them,
    and spin on the cores). Returns the server's exit code."""
    kids = descendants(popen.pid) if popen.poll() is None else []
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout)
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return popen.returncode


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def health(url: str, timeout: float = 1.0) -> dict | None:
    """``GET url/health`` as JSON ({} for a non-JSON 200), or None when it does not answer 200."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path.rstrip("/") + "/health")
        resp = conn.getresponse()
        body = resp.read(65536)
        if resp.status != 200:
            return None
        try:
            value = json.loads(body) if body else {}
        except ValueError:
            value = {}
        return value if isinstance(value, dict) else {}
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def start_server(argv: Sequence[str], url: str, *, startup_timeout: float = 300.0,
                 log_path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> SidecarProcess:
    """Run ``argv`` as a server subprocess and wait until ``url/health`` answers 200.

    Raises RuntimeError (with the log's tail) when the process exits first, TimeoutError after
    ``startup_timeout`` seconds (the process is stopped either way).
    """
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="ooospec-sidecar-", suffix=".log")
        os.close(fd)
    log_path = Path(log_path)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=None if env is None else dict(env))
    proc = SidecarProcess(popen, url, log_path)
    deadline = time.monotonic() + startup_timeout
    while True:
        if popen.poll() is not None:
            raise RuntimeError(f"sidecar server exited with code {popen.returncode} before answering /health; "
                               f"log {log_path}:\n{proc.log_tail()}")
        if health(url) is not None:
            return proc
        if time.monotonic() > deadline:
            proc.stop()
            raise TimeoutError(f"sidecar server did not answer {url}/health within {startup_timeout:.0f} s; "
                               f"log {log_path}:\n{proc.log_tail()}")
        time.sleep(0.1)


def launch_sidecar(adapter_dir: str | os.PathLike | None = None, *, host: str = "127.0.0.1",
                   port: int | None = None, threads: int = 1, cpus: Sequence[int] | None = None,
                   dtype: str = "fp32", startup_timeout: float = 300.0,
                   log_path: str | os.PathLike | None = None,
                   prefix_cache_tokens: int | None = None, engine: str = "transformers") -> SidecarProcess:
    """Start ``ooospec sidecar serve`` for ``adapter_dir`` (default: the shipped adapter) as a subprocess.

    Args:
        port: default a free one.
        threads: torch threads of the server.
        cpus: cores to pin the server to (``os.sched_setaffinity`` in the server before it loads anything);
            None = all cores.
        prefix_cache_tokens: the server's block KV cache (``--prefix-cache-tokens``; None = its default, 0 = off).
        engine: ``--engine`` (default transformers, named so that a bench does not depend on ``auto``'s choice).
    Returns:
        a running :class:`SidecarProcess` (``.url`` for :class:`SidecarClient`; ``.stop()`` or ``with``).
    """
    port = free_port(host) if port is None else port
    argv = [sys.executable, "-m", "ooospec.cli", "sidecar", "serve", "--host", host, "--port", str(port),
            "--threads", str(threads), "--dtype", dtype, "--engine", engine]
    if adapter_dir is not None:
        argv += ["--adapter", str(adapter_dir)]
    if cpus:
        argv += ["--cpus", ",".join(str(c) for c in sorted(cpus))]
    if prefix_cache_tokens is not None:
        argv += ["--prefix-cache-tokens", str(prefix_cache_tokens)]
    return start_server(argv, f"http://{host}:{port}", startup_timeout=startup_timeout, log_path=log_path)


def reset_prefix_cache(url: str, timeout: float = 60.0) -> bool:
    """``POST url/reset_prefix_cache``: the server forgets every earlier block (after its running wave); True when
    it answered 200 (an older server without the endpoint: False, logged)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("POST", parts.path.rstrip("/") + "/reset_prefix_cache")
        resp = conn.getresponse()
        resp.read(65536)
        if resp.status != 200:
            logger.warning("sidecar server %s did not reset its prefix cache (HTTP %s)", url, resp.status)
        return resp.status == 200
    except (OSError, http.client.HTTPException) as e:
        logger.warning("sidecar server %s did not reset its prefix cache: %s", url, e)
        return False
    finally:
        conn.close()


def wave_requests(url: str, settle: bool = False) -> int | None:
    """The wave requests the sidecar server at ``url`` has taken since it started (``/health``'s ``requests``), after
    its running wave when ``settle``; None from a server that does not count them (or does not answer)."""
    if settle:
        wait_idle(url)
    value = (health(url) or {}).get("requests")
    return value if isinstance(value, int) else None


def wait_idle(url: str, timeout_s: float = 300.0, poll_s: float = 0.05) -> float:
    """Block until the sidecar server at ``url`` runs and queues nothing; returns the seconds waited.

    The server finishes a wave even after its client cancelled it (the call it was for ended first); benchmarks
    call this before every timed call, untimed, so that leftover wave compute never slows the next method.
    """
    t0 = time.perf_counter()
    while True:
        h = health(url) or {}
        if not h.get("running") and not h.get("waiting"):
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            logger.warning("sidecar server %s still busy after %.0f s (%s); timing the next call anyway", url,
                           timeout_s, h)
            return time.perf_counter() - t0
        time.sleep(poll_s)
