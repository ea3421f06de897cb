"""The sidecar: a small model that predicts a request's call, and everything that talks to it.

Its contract with training, torch-free (:mod:`.prompts`: layouts, slot queries, the served name); its waves on
transformers (:mod:`.wave`) and on llama.cpp (:mod:`.llamacpp`), and which of the two answers (:mod:`.engines`);
what a client sends and gets back, and function-first waves (:mod:`.protocol`); the client that sends a wave per
request in the background (:mod:`.client`); starting and probing a server process (:mod:`.process`); the wave
gate (:mod:`.gate`: its online state; its pricing model, :mod:`.gate_pricing`; its decision per request,
:mod:`.gate_decision`) and what a finished request tells it (:mod:`.outcome`); where the sidecar runs
(:mod:`.deployments`).

May import: the backends, the drafters (hints), ``formats``, ``paths``, ``schemas``, ``calls``, ``tree``,
``verify``. Never the agent loop (type hints aside), a server or vLLM.
"""
