"""The agent loop on the target: chat turns, sessions, tools.

One chat turn (:mod:`.chat`: render, continue the session, decode, parse the calls); a conversation's KV kept
across turns and the shared system + tools prefix cache (:mod:`.session`); the tools, their registry and the
speculative-execution cache (:mod:`.tools`); the loop call -> tool -> result -> continue (:mod:`.loop`).

May import: anything in ``runtime`` but the servers and vLLM.
"""
