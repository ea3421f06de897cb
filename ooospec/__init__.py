"""ooo-spec: exact speculative decoding for LLM tool calls.

Subpackages: ``ooospec.runtime`` (decoding engine, drafters, sidecar), ``ooospec.pipelines`` (DVC stages),
``ooospec.eval`` (benchmarks and reports).
"""

__version__ = "0.1.0"
