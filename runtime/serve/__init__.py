"""HTTP servers of the runtime (HTTP only; the work they serve lives in ``ooospec.runtime``).

``sidecar_app``: the sidecar's OpenAI-compatible ``/v1/completions`` server (``ooospec sidecar serve``).
"""
