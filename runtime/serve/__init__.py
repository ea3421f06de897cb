"""HTTP servers of the runtime (HTTP only; the work they serve lives in ``ooospec.runtime``).

``sidecar_app``: the sidecar's OpenAI-compatible ``/v1/completions`` server (``ooospec sidecar serve``).
``chat_app``: the target's OpenAI-compatible ``/v1/chat/completions`` server with tools (``ooospec serve``).
``admission``: what one request may cost (body, lists, wave work, queue), checked before it runs; disconnects.
``http``: what both share (OpenAI-style errors, the loopback check, the uvicorn server config).

May import: anything in ``runtime`` but vLLM; nothing in ``runtime`` imports the servers.
"""
