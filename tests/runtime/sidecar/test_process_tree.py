"""Stopping a server stops what it started: a child that ignores SIGTERM and outlives its parent is killed too
(vLLM's engine core and workers, left spinning, made every later run on the box slower)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ooospec.runtime.sidecar.process import descendants, stop_tree

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux /proc")

# a "server" that starts a worker ignoring SIGTERM, prints its pid, and dies on SIGTERM without reaping it
SERVER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
print(worker.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_stop_tree_kills_a_worker_that_outlives_its_server():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    worker = int(server.stdout.readline())
    try:
        assert worker in descendants(server.pid)
        assert descendants(worker) == []
        stop_tree(server, timeout=10)
        deadline = time.time() + 10
        while alive(worker) and time.time() < deadline:
            time.sleep(0.05)
        assert server.returncode is not None
        assert not alive(worker), "the worker outlived stop_tree"
    finally:
        for pid in (worker, server.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        server.stdout.close()


def test_stopping_a_server_that_already_exited_returns_its_code():
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    done.wait()
    assert stop_tree(done) == 3
