"""Raw files fetched from their pinned commits: a local HTTP mirror stands in for GitHub (no network in tests)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ooospec.pipelines import ingest
from ooospec.pipelines.sources import fetch

LOCK = json.loads(ingest.LOCK_FILE.read_text())


def test_every_locked_file_has_an_upstream_url():
    for local in LOCK:
        url = fetch.url_of(local)
        assert url.startswith(fetch.GITHUB_RAW + "/") and len(url.split("/")[5]) == 40, url   # a full commit
    assert fetch.url_of("toolalpaca/raw/eval_real.json", "http://m/") == (
        "http://m/tangqiaoyu/ToolAlpaca/189069998d64a7baf1b4a1c3c4b2e75eb9d05532/data/eval_real.json")
    with pytest.raises(fetch.SourceError, match="no upstream origin"):
        fetch.origin("elsewhere/raw/x.json")


class _Mirror(BaseHTTPRequestHandler):
    """Serves ``server.files`` (url path -> bytes); ``server.mode``: ``ok`` (honours Range), ``no_range``, ``cut``
    (sends half of each file, then drops the connection). Records the Range headers it saw."""

    def do_GET(self):
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        self.server.ranges.append(rng)
        start = int(rng.split("=")[1].rstrip("-")) if rng and self.server.mode == "ok" else 0
        if start >= len(body) and rng:
            self.send_error(416)
            return
        part = body[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        if self.server.mode == "cut":
            self.wfile.write(part[:len(part) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(part)

    def log_message(self, *args):
        pass


@pytest.fixture()
def mirror():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Mirror)
    httpd.files, httpd.ranges, httpd.mode = {}, [], "ok"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


FILES = {"toolalpaca/raw/eval_real.json": b'[{"Name": "x"}]' * 500, "toolrl/raw/rlla_sft.json": b"[]" * 300}


def _serve(mirror, files: dict[str, bytes], tamper: str | None = None) -> dict[str, str]:
    """Put ``files`` on the mirror at their upstream paths; return their lock (``tamper``: served with other bytes)."""
    lock = {}
    for local, data in files.items():
        lock[local] = hashlib.sha256(data).hexdigest()
        path = fetch.url_of(local, "")
        mirror.files[path] = data + b" " if local == tamper else data
    return lock


def test_download_checks_every_file_and_keeps_no_half_file(mirror, tmp_path):
    lock = _serve(mirror, FILES)
    fetch.download(lock, tmp_path / "cache", mirror.url)
    for local, data in FILES.items():
        assert (tmp_path / "cache" / local).read_bytes() == data
    assert not list((tmp_path / "cache").rglob("*.partial"))
    assert fetch.complete(tmp_path / "cache", lock)
    mirror.ranges.clear()
    fetch.download(lock, tmp_path / "cache", mirror.url)        # all there: nothing fetched again
    assert mirror.ranges == []


def test_a_file_that_differs_from_the_lock_is_refused_and_named(mirror, tmp_path):
    lock = _serve(mirror, FILES, tamper="toolrl/raw/rlla_sft.json")
    with pytest.raises(fetch.SourceError, match=r"rlla_sft.json: the bytes from .* do not match the lock"):
        fetch.download(lock, tmp_path, mirror.url)
    assert not (tmp_path / "toolrl/raw/rlla_sft.json").exists()
    assert not list(tmp_path.rglob("*.partial"))


@pytest.mark.parametrize("then", ["ok", "no_range"])
def test_an_interrupted_download_resumes_or_restarts(mirror, tmp_path, then):
    lock = _serve(mirror, FILES)
    mirror.mode = "cut"
    with pytest.raises(fetch.SourceError, match="run again to resume"):
        fetch.download(lock, tmp_path, mirror.url)
    assert not any((tmp_path / local).exists() for local in FILES)      # never a half file in place
    assert list(tmp_path.rglob("*.partial"))                              # what arrived is kept for the resume
    mirror.mode, mirror.ranges[:] = then, []
    fetch.download(lock, tmp_path, mirror.url)
    assert all((tmp_path / k).read_bytes() == v for k, v in FILES.items())
    assert not list(tmp_path.rglob("*.partial"))
    if then == "ok":
        assert any(r and r != "bytes=0-" for r in mirror.ranges)          # resumed from where it stopped


def test_auto_prefers_a_local_folder_then_the_cache_then_downloads(mirror, tmp_path, monkeypatch):
    lock = _serve(mirror, FILES)
    monkeypatch.setenv(fetch.DATASETS_ENV, str(tmp_path / "mine"))
    assert fetch.resolve_source("auto", lock, cache=tmp_path / "cache", mirror=mirror.url) == tmp_path / "mine"
    assert fetch.resolve_source("/x/y", lock, cache=tmp_path / "cache") == Path("/x/y")
    monkeypatch.delenv(fetch.DATASETS_ENV)
    monkeypatch.setattr(fetch, "WORKSPACE_DATASETS", tmp_path / "no-shared-here")
    assert fetch.resolve_source("auto", lock, cache=tmp_path / "cache", mirror=mirror.url) == tmp_path / "cache"
    assert fetch.complete(tmp_path / "cache", lock)
    mirror.files.clear()                                           # the cache is complete: no network needed
    assert fetch.resolve_source("auto", lock, cache=tmp_path / "cache", mirror=mirror.url) == tmp_path / "cache"


def test_a_mirror_laid_out_from_a_folder_serves_the_download(mirror, tmp_path):
    src = tmp_path / "datasets"
    lock = {}
    for local, data in FILES.items():
        (src / local).parent.mkdir(parents=True, exist_ok=True)
        (src / local).write_bytes(data)
        lock[local] = hashlib.sha256(data).hexdigest()
    assert fetch.make_mirror(src, tmp_path / "m", lock) == 2
    for path in (tmp_path / "m").rglob("*"):
        if path.is_file():
            mirror.files["/" + path.relative_to(tmp_path / "m").as_posix()] = path.read_bytes()
    fetch.download(lock, tmp_path / "got", mirror.url)
    assert fetch.complete(tmp_path / "got", lock)


def test_ingest_auto_names_the_refused_file(mirror, tmp_path, monkeypatch):
    lock = _serve(mirror, FILES, tamper="toolalpaca/raw/eval_real.json")
    monkeypatch.delenv(fetch.DATASETS_ENV, raising=False)
    monkeypatch.setattr(fetch, "WORKSPACE_DATASETS", tmp_path / "no-shared-here")
    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path / "cache"))
    params = ingest.IngestParams(source="auto", mirror=mirror.url, sources=("toolalpaca",))
    with pytest.raises(ingest.LockMismatch, match="eval_real.json"):
        ingest.run(params, tmp_path / "out", metrics_path=tmp_path / "m.json", card_path=None, lock=lock)
