"""The benchmark requests inside vLLM: ``ooospec vllm-bench`` (offline, batch 1), ``ooospec vllm-load`` (the OpenAI
server under concurrent load) and their exactness check, the vLLM report, and the vLLM substrate (T(n) per weight
format). The shell scripts beside these modules run the CPU and GPU matrices.

May import: :mod:`ooospec.eval.bench`, :mod:`ooospec.eval.environment`, ``ooospec.runtime``, ``ooospec.reporting``.
"""
