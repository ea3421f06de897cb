"""ooo-spec inside vLLM: the drafters as a ``custom_class`` speculative method (one chain per request and step).

* :mod:`~ooospec.runtime.vllm.chain`: candidates -> the one chain vLLM verifies, and acceptance back (pure).
* :mod:`~ooospec.runtime.vllm.proposer`: :class:`ChainProposer` (no vLLM import) and :class:`OoOSpecProposer`, the
  class vLLM builds (``speculative_config.model = "ooospec.runtime.vllm.OoOSpecProposer"``).
* :mod:`~ooospec.runtime.vllm.options`: the proposer's knobs (``additional_config["ooospec"]``).
* :mod:`~ooospec.runtime.vllm.step_cost` and :mod:`~ooospec.runtime.vllm.draft_switch`: what a step costs by the
  rows and drafts it verifies (the chain price), and whether drafting pays at all at this batch (measured both ways).
* :mod:`~ooospec.runtime.vllm.xargs`: a request's ``extra_args``, checked and bounded before anything is built.
* :mod:`~ooospec.runtime.vllm.plugin`: the ``vllm.general_plugins`` entry point that hands the proposer request ids
  and ``extra_args``, and records chat requests in the call log when ``OOOSPEC_CALL_LOG`` is set.

Importing this package does not import vLLM.

May import: the drafters, the budget, ``methods``, ``decoding``, ``schemas``, ``formats``, ``call_log`` and the
sidecar (client, prompts, gate); nothing else in ``runtime`` imports it.
"""

from ooospec.runtime.vllm.proposer import ChainProposer, OoOSpecProposer, ProposerConfig

__all__ = ["ChainProposer", "OoOSpecProposer", "ProposerConfig"]
