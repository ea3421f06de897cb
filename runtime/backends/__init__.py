"""Backends: the target model behind the engine, and the machine it runs on.

The interface the engine, sessions and benches ask of a target (:mod:`.target`); the transformers backend
(:mod:`.hf_target`) and the one owner of its KV cache (:mod:`.kv_cache`); llama.cpp (:mod:`.llamacpp`, its tree
batches :mod:`.llamacpp_kv`); what a forward costs (:mod:`.cost_model`); loading a target (:mod:`.models`); the
registry of model files and fetching them (:mod:`.fetch`); the CPU's flags, dtype and threads (:mod:`.hardware`).

May import: ``paths``, ``tree``, ``verify`` and each other. Never the drafters, the engine, the sidecar, the
agent loop, a server or vLLM.
"""

ENGINE_BACKENDS = ("hf", "llama.cpp")            # what the tree engine runs on (``methods.Backend`` adds vLLM)
BACKEND_CHOICES = ("auto", *ENGINE_BACKENDS)     # ``--backend``; auto: llama.cpp for a .gguf, else transformers
