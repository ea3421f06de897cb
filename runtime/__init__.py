"""The runtime: greedy-exact speculative decoding of tool calls, and what serves it.

At the top, the engine loop and what it is made of: :mod:`.engine` (propose -> tree -> one forward -> accept),
:mod:`.budget` (which draft nodes to verify), :mod:`.tree`, :mod:`.verify`; the method table (:mod:`.methods`) and
the engines built from it (:mod:`.decoding`); the metrics (:mod:`.metrics`); tool schemas and calls
(:mod:`.schemas`, :mod:`.calls`); where files live (:mod:`.paths`); the call log of served requests
(:mod:`.call_log`, which both servers write). The rooms:

* :mod:`.drafters`: what proposes drafts (schema FSM, retrieval, prompt lookup, hints; the contract);
* :mod:`.backends`: the target model (transformers, llama.cpp), its cost and the machine;
* :mod:`.sidecar`: the sidecar's waves, client, gate and deployments;
* :mod:`.agent`: chat turns, sessions, tools and the agent loop;
* :mod:`.formats`: tool-call formats; :mod:`.serve`: the HTTP servers; :mod:`.vllm`: the drafters inside vLLM.

Each room's docstring says what it may import; ``tests/test_layering.py`` holds them to it.
"""
