"""The call log alone: its line, rotation by size, and a writer that never blocks or raises into the caller."""

from __future__ import annotations

import errno
import json
import threading
import time
from pathlib import Path

import pytest

from ooospec.runtime import call_log
from ooospec.runtime.call_log import THREAD_NAME, CallLog, answer_message, log_line, rotate

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
USER = [{"role": "user", "content": "Wetter in München?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "München"}'}}
ANSWER = {"role": "assistant", "content": None, "tool_calls": [CALL]}


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_a_line_is_the_request_then_the_answer():
    line = log_line(TOOLS, USER, ANSWER, model="m", source="vllm", request_id="chatcmpl-1", created=7)
    assert line.endswith("\n") and line.count("\n") == 1 and "München" in line
    assert json.loads(line) == {"tools": TOOLS, "messages": [*USER, ANSWER], "model": "m", "created": 7,
                                "source": "vllm", "id": "chatcmpl-1", "log_version": 1}


def test_the_answer_takes_openais_shape():
    assert answer_message("It is 21 C.") == {"role": "assistant", "content": "It is 21 C."}   # no tool_calls key
    flat = answer_message(None, [{"id": "c", "name": "f", "arguments": {"x": 1}}])
    assert flat["tool_calls"] == [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]
    assert answer_message(None, [CALL]) == ANSWER
    with pytest.raises(ValueError):
        log_line(TOOLS, [{"role": "user", "content": float("nan")}], ANSWER, model="m", source="vllm")


def test_rotate_shifts_the_backups_and_drops_the_oldest(tmp_path):
    path = tmp_path / "calls.jsonl"
    for name in ("calls.jsonl", "calls.jsonl.1", "calls.jsonl.2"):
        (tmp_path / name).write_text(name)
    rotate(path, backups=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl.1", "calls.jsonl.2"]
    assert (tmp_path / "calls.jsonl.1").read_text() == "calls.jsonl"
    assert (tmp_path / "calls.jsonl.2").read_text() == "calls.jsonl.1"
    path.write_text("new")
    rotate(path, backups=0)
    assert not path.exists()
    rotate(path, backups=3)                                            # nothing there: nothing to do


def test_a_log_records_requests_with_tools_only(tmp_path):
    path = tmp_path / "a" / "b" / "calls.jsonl"
    log = CallLog(path)
    assert writer_threads()
    assert not log.record([], USER, ANSWER, model="m", source="ooospec-serve")
    assert log.record(TOOLS, USER, ANSWER, model="m", source="ooospec-serve", request_id="r1")
    log.close()
    log.close()                                                        # idempotent
    assert not writer_threads()
    (line,) = lines_of(path)
    assert line["messages"] == [*USER, ANSWER] and line["id"] == "r1"
    assert (path.stat().st_mode & 0o777) == 0o600                      # prompts may hold personal data
    assert not log.record(TOOLS, USER, ANSWER, model="m", source="vllm") and log.dropped == 1


def test_rotation_by_size_keeps_the_backups_and_whole_lines(tmp_path):
    path = tmp_path / "calls.jsonl"
    one = len(log_line(TOOLS, USER, ANSWER, model="m", source="vllm", request_id="r00").encode())
    log = CallLog(path, max_bytes=3 * one + one // 2, backups=2)          # three lines a file
    for i in range(20):
        log.record(TOOLS, USER, ANSWER, model="m", source="vllm", request_id=f"r{i:02d}")
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl", "calls.jsonl.1", "calls.jsonl.2"]
    files = [path.with_name("calls.jsonl.2"), path.with_name("calls.jsonl.1"), path]
    assert all(f.stat().st_size <= log.max_bytes for f in files)
    ids = [line["id"] for f in files for line in lines_of(f)]
    assert ids == [f"r{i:02d}" for i in range(20 - len(ids), 20)] and len(ids) == 8   # 3 + 3 + 2, the newest
    assert (log.written, log.dropped, log.failed) == (20, 0, 0)


def test_a_line_longer_than_the_file_may_grow_is_dropped(tmp_path):
    log = CallLog(tmp_path / "calls.jsonl", max_bytes=200)
    log.record(TOOLS, [{"role": "user", "content": "x" * 500}], ANSWER, model="m", source="vllm")
    log.close()
    assert (log.written, log.dropped) == (0, 1) and not list(tmp_path.iterdir())


def test_a_full_queue_drops_instead_of_blocking(tmp_path, monkeypatch):
    release = threading.Event()
    log = CallLog(tmp_path / "calls.jsonl", queue_size=2)
    write = log._write
    monkeypatch.setattr(log, "_write", lambda data: (release.wait(30), write(data)))   # a disk that hangs
    t0 = time.perf_counter()
    queued = [log.record(TOOLS, USER, ANSWER, model="m", source="vllm") for _ in range(10)]
    assert time.perf_counter() - t0 < 1.0
    assert sum(queued) <= 3 and log.dropped == 10 - sum(queued) >= 7
    release.set()
    log.close()
    assert log.written == sum(queued) and len(lines_of(log.path)) == sum(queued)


def test_a_write_error_is_counted_not_raised(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    log = CallLog(tmp_path / "file" / "calls.jsonl")                 # its folder is a file
    assert log.record(TOOLS, USER, ANSWER, model="m", source="vllm")
    log.close()
    assert (log.written, log.failed) == (0, 1)

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    log = CallLog(tmp_path / "calls.jsonl")
    monkeypatch.setattr(call_log.os, "write", disk_full)
    log.record(TOOLS, USER, ANSWER, model="m", source="vllm")
    log.close()
    assert (log.written, log.failed) == (0, 1)
    log = CallLog(tmp_path / "calls.jsonl")
    log.record(TOOLS, [{"role": "user", "content": object()}], ANSWER, model="m", source="vllm")   # not JSON
    log.close()
    assert log.failed == 1


def test_concurrent_records_give_whole_lines(tmp_path):
    path = tmp_path / "calls.jsonl"
    logs = [CallLog(path, max_bytes=256 << 10, backups=50) for _ in range(2)]   # two writers, as two processes
    big = [{"role": "user", "content": "y" * 20_000}]

    def worker(k: int) -> None:
        for i in range(40):
            logs[k % 2].record(TOOLS, big, ANSWER, model="m", source="vllm", request_id=f"{k}-{i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for log in logs:
        log.close()
    ids = [line["id"] for f in tmp_path.iterdir() for line in lines_of(f)]
    assert sorted(ids) == sorted(f"{k}-{i}" for k in range(6) for i in range(40))
    assert sum(log.written for log in logs) == 240 and not any(log.failed or log.dropped for log in logs)


def test_bad_settings_are_refused(tmp_path):
    for kwargs in ({"max_bytes": 0}, {"backups": -1}, {"queue_size": 0}):
        with pytest.raises(ValueError, match="max_bytes"):
            CallLog(tmp_path / "c.jsonl", **kwargs)
    assert not list(tmp_path.iterdir()) and not writer_threads()


def test_the_module_imports_the_standard_library_only():
    import ast
    import sys

    tree = ast.parse(Path(call_log.__file__).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= set(sys.stdlib_module_names) | {"__future__"}
