"""The call log: each finished chat request that showed tools, appended to a JSON-lines file (off by default).

    log = CallLog("logs/calls.jsonl", max_bytes=256 << 20, backups=3)
    log.record(tools, messages, answer, model="qwen2.5-coder-0.5b", source=SERVE)   # returns at once
    log.close()                                     # drains the queue (also run at exit)

``ooospec serve --call-log PATH`` and the vLLM plugin (``OOOSPEC_CALL_LOG=PATH``) write it; ``ingest`` reads it back
as ``openai_chat`` records. One line per request (:func:`log_line`)::

    {"tools": [...as the request sent them...],
     "messages": [...the request's messages..., {"role": "assistant", "content": str | null,
                                                "tool_calls": [{"id", "type": "function",
                                                                "function": {"name", "arguments": JSON text}}]}],
     "model": str, "created": unix seconds, "source": "ooospec-serve" | "vllm", "id": str | null, "log_version": 1}

``tool_calls`` is left out of an answer without calls. :meth:`CallLog.record` serialises the line in the caller
(a snapshot: later changes to the request do not reach the file) and hands it to one writer thread through a
bounded queue; it never blocks and never raises: a full queue drops the line (counted in ``dropped``), an
unwritable disk counts it in ``failed``, each logged once. The writer appends every line with one ``os.write`` on an
``O_APPEND`` descriptor, so lines from several threads or processes sharing the path never interleave; before a
write that would take the file past ``max_bytes`` it rotates (:func:`rotate`): ``PATH`` -> ``PATH.1`` -> ... ->
``PATH.<backups>``, the oldest deleted (under a lock on the file, so that one of several writers rotates). A line
longer than ``max_bytes`` is dropped.

Standard library only (POSIX: ``fcntl``): no torch, no vLLM.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

LOG_VERSION = 1
SERVE = "ooospec-serve"
VLLM = "vllm"
Source = Literal["ooospec-serve", "vllm"]
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_BACKUPS = 3
DEFAULT_QUEUE_SIZE = 1024
THREAD_NAME = "ooospec-call-log"
_STOP = object()


def answer_message(content: str | None, tool_calls: Sequence[dict] = ()) -> dict:
    """The assistant message of an answer in OpenAI's shape; ``tool_calls`` entries are ``{"id", "name",
    "arguments"}`` or OpenAI's ``{"id", "type", "function": {"name", "arguments"}}``; arguments that are not text
    yet become JSON text."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls = []
    for tc in tool_calls:
        fn = tc.get("function", tc)
        args = fn.get("arguments")
        calls.append({"id": tc.get("id"), "type": "function",
                      "function": {"name": fn.get("name"),
                                   "arguments": args if isinstance(args, str) else json.dumps(args or {},
                                                                                                ensure_ascii=False)}})
    if calls:
        message["tool_calls"] = calls
    return message


def log_line(tools: Sequence[Any], messages: Sequence[Any], answer: dict, *, model: str, source: Source,
             request_id: str | None = None, created: int | None = None) -> str:
    """One line of the log (JSON text ending in ``"\\n"``); see the module docstring for its fields.

    Args:
        tools: the request's tools, as sent.
        messages: the request's messages, as sent.
        answer: the answer as an assistant message (``content``, ``tool_calls``), normalised by :func:`answer_message`.
        model: the served model name.
        source: :data:`SERVE` or :data:`VLLM`.
        request_id: the response's id, if any.
        created: unix seconds (default: now).

    Raises:
        TypeError / ValueError: something in ``tools`` or ``messages`` is not JSON.
    """
    row = {"tools": list(tools),
           "messages": [*messages, answer_message(answer.get("content"), answer.get("tool_calls") or ())],
           "model": model, "created": int(time.time()) if created is None else created, "source": source,
           "id": request_id, "log_version": LOG_VERSION}
    return json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n"


def rotate(path: Path, backups: int) -> None:
    """Shift ``path`` to ``path.1``, ``path.1`` to ``path.2``, ... up to ``path.<backups>`` (the oldest is replaced);
    with ``backups=0`` the file is deleted. Missing files are skipped."""
    if backups < 1:
        path.unlink(missing_ok=True)
        return
    for i in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
    if path.exists():
        os.replace(path, path.with_name(f"{path.name}.1"))


class CallLog:
    """One JSON-lines call log and its writer thread (see the module docstring).

    Args:
        path: the log file; parent folders are created at the first write.
        max_bytes: the size past which the file rotates (>= 1).
        backups: rotated files kept (>= 0).
        queue_size: lines waiting for the writer before new ones are dropped (>= 1).

    Counters (read any time): ``written`` lines, ``dropped`` (queue full, line too long, closed) and ``failed``
    (not JSON, or the write failed).
    """

    def __init__(self, path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES,
                 backups: int = DEFAULT_BACKUPS, queue_size: int = DEFAULT_QUEUE_SIZE):
        if max_bytes < 1 or backups < 0 or queue_size < 1:
            raise ValueError(f"call log {path}: max_bytes={max_bytes} (>= 1), backups={backups} (>= 0), "
                             f"queue_size={queue_size} (>= 1)")
        self.path = Path(path)
        self.max_bytes, self.backups = max_bytes, backups
        self.written = self.dropped = self.failed = 0
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._fd: int | None = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def record(self, tools: Sequence[Any], messages: Sequence[Any], answer: dict, *, model: str, source: Source,
               request_id: str | None = None) -> bool:
        """Queue one finished request (nothing when it showed no tools); never blocks, never raises. Returns
        whether the line was queued."""
        if not tools:
            return False
        if self._closed:
            self._count("dropped", "the call log is closed; requests are no longer recorded")
            return False
        try:
            line = log_line(tools, messages, answer, model=model, source=source, request_id=request_id)
        except (TypeError, ValueError, RecursionError) as e:
            self._count("failed", "a request could not be written as JSON (%s); such requests are not recorded",
                        f"{type(e).__name__}: {e}"[:200])
            return False
        try:
            self._queue.put_nowait(line.encode("utf-8"))
        except queue.Full:
            self._count("dropped", "the call log's writer is behind (%d lines queued); lines are dropped until it "
                                   "catches up (a slow disk?)", self._queue.maxsize)
            return False
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, stop the writer and close the file; later records are dropped. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            logger.warning("call log %s: the writer did not drain in %.0f s; closing without it", self.path, timeout_s)
        self._thread.join(timeout_s)
        if self.dropped or self.failed:
            logger.info("call log %s: %d lines written, %d dropped, %d failed", self.path, self.written,
                        self.dropped, self.failed)

    # ------------------------------------------------------------------------------------- the writer thread

    def _run(self) -> None:
        while (data := self._queue.get()) is not _STOP:
            self._write(data)
        self._close_file()

    def _write(self, data: bytes) -> None:
        """Append one line, rotating first when it would take the file past ``max_bytes``."""
        if len(data) > self.max_bytes:
            self._count("dropped", "a line of %d bytes is longer than the call log's max_bytes (%d); dropped",
                        len(data), self.max_bytes)
            return
        try:
            size = self._open()
            if size and size + len(data) > self.max_bytes:
                self._rotate(len(data))
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
            self.written += 1
        except OSError as e:
            self._count("failed", "call log %s: %s; lines are not written until it works again", self.path, e)
            self._close_file()

    def _open(self) -> int:
        """The size of the file at ``path``, opened for appending (again, when another process rotated it)."""
        if self._fd is not None:
            try:
                same = os.path.samestat(os.fstat(self._fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                self._close_file()
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fstat(self._fd).st_size

    def _rotate(self, num_bytes: int) -> None:
        """Rotate and open the new file; under an exclusive lock on the file being rotated, so that of several
        writers (processes) sharing the path one rotates and the others find the new file."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            st = os.fstat(self._fd)
            if os.path.samestat(st, os.stat(self.path)) and st.st_size + num_bytes > self.max_bytes:
                rotate(self.path, self.backups)
        except FileNotFoundError:          # another writer moved it and has not opened the new one yet
            pass
        finally:
            self._close_file()             # releases the lock
        self._open()

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _count(self, counter: str, message: str, *args) -> None:
        """Add one to ``counter`` (callers' threads and the writer's); log ``message`` the first time."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)
            first = counter not in self._warned
            self._warned.add(counter)
        if first:
            logger.warning(message + " (logged once; CallLog.%s counts them)", *args, counter)
