"""Multi-step tool dialogues: ``ooospec agent-bench``, recorded dialogues replayed through the agent loop, on our
engine (:mod:`~ooospec.eval.agent.replay`) and inside vLLM (:mod:`~ooospec.eval.agent.in_vllm`).

May import: :mod:`ooospec.eval.bench`, :mod:`ooospec.eval.vllm`, :mod:`ooospec.eval.environment`, ``ooospec.runtime``.
"""
