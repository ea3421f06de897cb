"""What a verification forward costs, per backend and weight format, against this CPU's roofs
(``python -m ooospec.eval.substrate``): llama.cpp and our engine's T(n) (``cli``), the roofline table and the many-core
model (``roofline``), the quantized-target table (``quantized``) and a format's own tool-call quality
(``call_quality``). vLLM's T(n) is measured in :mod:`ooospec.eval.vllm.substrate`.

May import: :mod:`ooospec.eval.bench`, :mod:`ooospec.eval.environment`, ``ooospec.runtime``, ``ooospec.reporting``.
"""
