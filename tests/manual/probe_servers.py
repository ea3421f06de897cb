"""A manual probe of two RUNNING servers with the hostile requests of the README's reliability table (pytest does not
collect it; the in-process regression tests are tests/runtime/serve/test_admission.py and test_server_fuzz.py)::

    ooospec sidecar serve --port 8799 --threads 1 &
    ooospec serve --target qwen2.5-coder-0.5b --port 8798 --threads 1 &
    python tests/manual/probe_servers.py

Prints each request's status, seconds and the worst ``/health`` latency while it ran, then what a half-sent body
and a client leaving a non-streamed chat request do.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

SIDECAR, CHAT = 8799, 8798
TWO_M = b",".join([b"1"] * 2_000_000)


def post(port: int, path: str, raw: bytes, timeout: float = 120) -> tuple[int, bytes, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.time()
    conn.request("POST", path, body=raw, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    return resp.status, out[:200], round(time.time() - t0, 2)


def health(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


def worst_health_during(port: int, fn):
    """``(fn(), worst /health seconds while fn ran)``."""
    worst, stop = [0.0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            t0 = time.time()
            health(port)
            worst[0] = max(worst[0], time.time() - t0)
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        return fn(), round(worst[0], 2)
    finally:
        stop.set()
        watcher.join()


def sidecar(body: bytes):
    return lambda: post(SIDECAR, "/v1/completions", body)


def chat(body: bytes):
    return lambda: post(CHAT, "/v1/chat/completions", body)


HI = b'"messages":[{"role":"user","content":"hi"}]'
CASES = {
    "1 lone surrogate (sidecar)": (SIDECAR, sidecar(b'{"model":"sidecar","prompt":["\\ud800"],"max_tokens":4}')),
    "2 2M ints as prompt (sidecar)": (SIDECAR, sidecar(b'{"model":"sidecar","prompt":[' + TWO_M + b"]}")),
    "2 2M ints as stop (chat)": (CHAT, chat(b'{"model":"m",' + HI + b',"stop":[' + TWO_M + b"]}")),
    "3 1024 prompts (sidecar)": (SIDECAR, sidecar(json.dumps(
        {"model": "sidecar", "prompt": [f"p{i} a b c d" for i in range(1024)], "max_tokens": 8}).encode())),
    "9 NaN temperature (sidecar)": (SIDECAR, sidecar(b'{"model":"sidecar","prompt":["x"],"temperature":NaN}')),
    "9 NaN temperature (chat)": (CHAT, chat(b'{"model":"m",' + HI + b',"temperature":NaN}')),
    "malformed JSON (chat)": (CHAT, chat(b'{"model":')),
    "wrong types (chat)": (CHAT, chat(b'{"model":3,"messages":"hi","tools":5}')),
}


def main() -> None:
    for name, (port, fn) in CASES.items():
        (status, body, secs), worst = worst_health_during(port, fn)
        print(f"{name:32s} -> {status} in {secs}s; worst /health {worst}s; {body[:100]!r}")

    sock = socket.create_connection(("127.0.0.1", CHAT))          # 10: a half-sent body, then the client leaves
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"model\":")
    time.sleep(1)
    sock.close()
    print("10 half-sent body (chat): worst /health", worst_health_during(CHAT, lambda: time.sleep(1))[1], "s")

    body = json.dumps({"model": health(CHAT)["model"], "max_tokens": 2048,
                       "messages": [{"role": "user", "content": "Write a very long story."}]}).encode()
    sock = socket.create_connection(("127.0.0.1", CHAT))          # 4: a non-streamed turn whose client leaves
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(2)
    sock.close()
    ran = health(CHAT)["running"]
    t0 = time.time()
    while health(CHAT)["running"] and time.time() - t0 < 60:
        time.sleep(0.2)
    print(f"4 client left a non-streamed chat turn (running at the disconnect: {ran}): nothing running "
          f"{time.time() - t0:.1f}s later")


if __name__ == "__main__":
    main()
