"""Drafters: what proposes draft tokens; never what verifies or commits them.

The contract the engines read (:mod:`.base`: :class:`~.base.Drafter` with every member and its default,
:class:`~.base.DraftContext`, the shared observe and fault helpers), the schema FSM of a request's tools
(:mod:`.schema_fsm`, over the incremental call parser :mod:`.call_state`), retrieval of earlier calls
(:mod:`.retrieval`), prompt lookup (:mod:`.pld`), the sidecar's hints (:mod:`.hints`) and where a
request's hints come from (:mod:`.hint_source`).

May import: ``schemas``, ``calls``, ``formats`` and each other. Never a backend, the engine, the sidecar, the
agent loop, a server or vLLM: a drafter sees token ids, not a model (type hints aside).
"""
