"""The benchmark requests inside vLLM: ``ooospec vllm-bench`` (offline, batch 1), ``ooospec vllm-load`` (the OpenAI
server under concurrent load) and their exactness check, the vLLM report, the vLLM substrate (T(n) per weight
format), the README's results table (``headline``) and the transfer matrix inside vLLM (``matrix``, over
``transfer_cells.sh``). The shell scripts beside these modules run the CPU and GPU matrices.

May import: :mod:`ooospec.eval.bench`, :mod:`ooospec.eval.environment`, ``ooospec.runtime``, ``ooospec.reporting``,
``ooospec.pipelines.tracking`` (W&B set-up).
"""
