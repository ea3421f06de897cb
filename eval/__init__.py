"""Evaluation: benchmarks, the transfer stage and the reports, in rooms (as ``runtime/`` is).

- :mod:`ooospec.eval.bench` -- the bench harness on our own engine: examples, methods, peers, timed runs, summaries;
- :mod:`ooospec.eval.vllm` -- the same requests inside vLLM: offline runs, the server under load, the vLLM substrate;
- :mod:`ooospec.eval.agent` -- multi-step tool dialogues replayed through the agent loop;
- :mod:`ooospec.eval.transfer` -- the ``transfer`` DVC stage and its report (the headline);
- :mod:`ooospec.eval.sidecar` -- which sidecar to ship, its wave by engine, the own-calls learning curve;
- :mod:`ooospec.eval.substrate` -- what a verification forward costs per backend and weight format, the roofline;
- :mod:`ooospec.eval.environment` -- what a measurement ran on (every room records it).

The rooms import downward only (``tests/test_layering.py``): ``bench`` is the floor; ``vllm``, ``substrate`` and
``transfer`` build on it; ``agent`` on ``bench`` and ``vllm``; ``sidecar`` on ``bench`` and ``transfer``.
"""
