"""HTTP servers of the runtime (HTTP only; the work they serve lives in ``ooospec.runtime``).

``sidecar_app``: the sidecar's OpenAI-compatible ``/v1/completions`` server (``ooospec sidecar serve``).
``chat_app``: the target's OpenAI-compatible ``/v1/chat/completions`` server with tools (``ooospec serve``).
``http``: what both share (OpenAI-style errors, the bounded body read, the loopback check).
"""
