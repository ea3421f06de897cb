"""Decoding methods: ONE registry (``REGISTRY``) that the benches, the chat server and the agent loop all read.

Engine methods (drafters verified by the tree engine; output = greedy output of the target, token for token)::

    ar              no drafter: one token per forward, through the same KV-cache code (the exactness reference)
    pld             prompt-lookup n-gram drafter (:mod:`ooospec.runtime.drafters.pld`)
    toolspec        schema FSM of the request's tools + retrieval of earlier calls + prompt lookup
    ooospec         toolspec + sidecar hints (:mod:`ooospec.runtime.drafters.hints`), sent at the request's arrival
    ooospec-gold    toolspec + the gold call as hints at time zero (bench only: a ceiling of hints)
    ooospec-oracle  toolspec + the target's own greedy call (``ar``'s output) as hints at time zero (bench only:
                    the ceiling of what any sidecar's hints can give; gold can differ from what the target writes)
    NAME-fixed      NAME with a fixed node budget (``max_draft_nodes=32``) instead of the budget policy

Peers (stock implementations run on the same requests; adapters in :mod:`ooospec.eval`)::

    hf-greedy, hf-pld, hf-assisted    transformers' ``generate`` (HF backend), run by ``ooospec bench``
    llama.cpp, llama.cpp-pld          llama-cpp-python's ``Llama.generate`` (the target's GGUF), likewise
    vllm, vllm-ngram, vllm-suffix     vLLM's own decoding, run by ``ooospec vllm-bench`` (beside the engine methods
                                      marked ``vllm``, which it runs inside vLLM as a proposer); ``vllm-prefill``
                                      decodes one token: the prompt's forward, as a report column

A peer's ``drafters`` say what its stock implementation drafts with (``pld``: prompt lookup, ``assistant``: a draft
model, ``suffix``: vLLM's suffix tree); the peer that drafts nothing is its backend's stock greedy reference
(:data:`REFERENCES`), run on every example.

Hints come from a hint source (:data:`HINT_SOURCES`): ``sidecar`` (a running sidecar's call, sent at the request's
arrival), ``gold`` (the record's gold call) or ``oracle`` (the call ``ar`` wrote for the request), the last two at
time zero. Where the sidecar runs is a deployment (:mod:`ooospec.runtime.sidecar.deployments`). Code that needs one
method by its role names it through :data:`BASELINE`, :data:`TOOLSPEC` or :data:`OOOSPEC`; everything else is a query of
the registry (``method.uses_sidecar``, :func:`peers_of`, ...), so a method, hint source or deployment name is
spelled here and in :mod:`~ooospec.runtime.sidecar.deployments` only.

How a method's engine is built (its drafters, one engine per request or per stream) is
:mod:`ooospec.runtime.decoding`'s; this module is the table only and imports no other runtime module (the
backends' names aside).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ooospec.runtime.backends import ENGINE_BACKENDS

DrafterName = Literal["fsm", "hints", "retrieval", "pld", "assistant", "suffix"]
Backend = Literal["hf", "llama.cpp", "vllm"]
FIXED_NODES = 32    # the node budget of the "-fixed" methods


@dataclass(frozen=True)
class HintSource:
    """Where an engine method's hints come from."""

    name: str
    label: str          # its row in the report tables
    summary: str


ORACLE, GOLD, SIDECAR = "oracle", "gold", "sidecar"
# in the order of the report tables: the ceilings first (``ooospec bench --hints`` reads its choices here)
HINT_SOURCES: dict[str, HintSource] = {h.name: h for h in (
    HintSource(ORACLE, "oracle", "at time zero, the call the target itself writes (ar's output of the request)"),
    HintSource(GOLD, "gold", "at time zero, the record's gold call"),
    HintSource(SIDECAR, "real", "a running sidecar's call, asked at the request's arrival"),
)}


@dataclass(frozen=True)
class Method:
    """One decoding method: what it is built from, and where it is offered.

    Attributes:
        drafters: an engine method's drafters in priority order (``fsm``, ``hints``, ``retrieval``, ``pld``); a
            peer's: what its stock implementation drafts with (``pld``, ``assistant``, ``suffix``; none: greedy).
        hints: where an engine method's hints come from (a :data:`HINT_SOURCES` name).
        fixed_nodes: the fixed node budget of the ``-fixed`` variants (None: the budget policy).
        peer: the backend a peer's stock implementation runs on; None for ours.
        served: offered by ``ooospec serve`` and the agent loop (the rest are bench-only).
        vllm: an engine method ``ooospec vllm-bench`` also runs inside vLLM (drafts as a proposer, no tree policy).
        prefill_only: a peer that decodes one token: it times the prompt's forward, which no drafter shortens
            (reports show it as a column, not a method).
        deployment: where its sidecar runs when the method fixes it (a :data:`~ooospec.runtime.sidecar.deployments.
            DEPLOYMENTS` name; ``ooospec-dedicated``: the emulated device of its own); None: the run's.
    """

    name: str
    summary: str
    drafters: tuple[DrafterName, ...] = ()
    hints: str | None = None
    fixed_nodes: int | None = None
    peer: Backend | None = None
    served: bool = False
    vllm: bool = False
    prefill_only: bool = False
    deployment: str | None = None

    @property
    def is_engine(self) -> bool:
        return self.peer is None

    @property
    def per_request(self) -> bool:
        """Whether the engine depends on the request (its tools, its hints), so it is built per request."""
        return "fsm" in self.drafters or "hints" in self.drafters

    @property
    def takes_hints(self) -> bool:
        """Whether it drafts from hints (a :class:`~ooospec.runtime.drafters.hints.CallGuess` of the request's call)."""
        return "hints" in self.drafters

    @property
    def uses_sidecar(self) -> bool:
        """Whether its hints come from a running sidecar (the rest are known at arrival or absent)."""
        return self.hints == SIDECAR

    @property
    def warm_starts(self) -> bool:
        """Whether it can continue from a cached prompt prefix (``--warm-tools``): every engine method and the
        stock greedy peers; transformers' prompt lookup and assisted generation feed the whole prompt on top of a
        cached prefix (:func:`ooospec.eval.bench.peers.check_continued`), so they run cold only."""
        return self.peer != "hf" or not self.drafters

    def engine_kwargs(self) -> dict:
        return {"policy": "fixed", "max_draft_nodes": self.fixed_nodes} if self.fixed_nodes else {}


_TOOLSPEC: tuple[DrafterName, ...] = ("fsm", "retrieval", "pld")
_OOOSPEC: tuple[DrafterName, ...] = ("fsm", "hints", "retrieval", "pld")
# the methods other code names by their role
BASELINE = "ar"          # plain greedy through the engine: the exactness reference every speedup is against
TOOLSPEC = "toolspec"    # drafts without hints: served without a sidecar; what a hint method's gain is against
OOOSPEC = "ooospec"      # toolspec + sidecar hints: served with a sidecar

REGISTRY: dict[str, Method] = {m.name: m for m in (
    Method(BASELINE, "plain greedy decoding through the engine (the exactness reference)", served=True),
    Method("pld", "prompt-lookup n-gram drafts", drafters=("pld",)),
    Method(TOOLSPEC, "schema FSM + retrieval + prompt-lookup drafts", drafters=_TOOLSPEC, served=True, vllm=True),
    Method(OOOSPEC, "toolspec + sidecar hints", drafters=_OOOSPEC, hints=SIDECAR, served=True, vllm=True),
    Method("ooospec-dedicated", "EMULATED: ooospec with the sidecar on a device of its own as fast as this CPU (the "
           "wave timed alone first, its hints released to the target at that latency)", drafters=_OOOSPEC,
           hints=SIDECAR, vllm=True, deployment="dedicated"),
    Method("ooospec-wave-first", "ooospec with the sidecar on the target's cores, the target waiting for it: each "
           "request's wave runs first (inside the request's time), then the target with its hints from the first "
           "step", drafters=_OOOSPEC, hints=SIDECAR, vllm=True, deployment="wave-first"),
    Method("ooospec-gold", "toolspec + the gold call as hints at time zero (the ceiling)", drafters=_OOOSPEC,
           hints=GOLD),
    Method("ooospec-oracle", "toolspec + the target's own greedy call as hints at time zero (the ceiling of hints)",
           drafters=_OOOSPEC, hints=ORACLE, vllm=True),
    Method("pld-fixed", "pld with a fixed node budget", drafters=("pld",), fixed_nodes=FIXED_NODES),
    Method("toolspec-fixed", "toolspec with a fixed node budget", drafters=_TOOLSPEC, fixed_nodes=FIXED_NODES),
    Method("hf-greedy", "transformers generate, greedy", peer="hf"),
    Method("hf-pld", "transformers generate with prompt_lookup_num_tokens", drafters=("pld",), peer="hf"),
    Method("hf-assisted", "transformers assisted generation (--assistant)", drafters=("assistant",), peer="hf"),
    Method("llama.cpp", "llama-cpp-python Llama.generate, greedy, on the target's GGUF", peer="llama.cpp"),
    Method("llama.cpp-pld", "llama-cpp-python prompt-lookup speculation", drafters=("pld",), peer="llama.cpp"),
    Method("vllm", "vLLM's plain greedy decoding", peer="vllm"),
    Method("vllm-ngram", "vLLM's ngram speculation (prompt lookup)", drafters=("pld",), peer="vllm"),
    Method("vllm-suffix", "vLLM's suffix decoding (needs the arctic-inference package)", drafters=("suffix",),
           peer="vllm"),
    Method("vllm-prefill", "vLLM plain with one new token: the prompt's forward", peer="vllm", prefill_only=True),
)}
SERVED: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.served)
ENGINE_METHODS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.is_engine)
HINT_METHODS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.hints)
# what ``ooospec bench`` runs: our engine methods and the transformers / llama.cpp peers
BENCH_METHODS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.peer in (None, *ENGINE_BACKENDS))
# what ``ooospec vllm-bench`` runs: vLLM's own methods and ours inside vLLM
VLLM_BENCH_METHODS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.peer == "vllm" or m.vllm)
# backend -> its stock greedy peer (the reference every example runs)
REFERENCES: dict[str, str] = {m.peer: n for n, m in REGISTRY.items()
                              if m.peer and not m.drafters and not m.prefill_only}
HF_REFERENCE, LLAMACPP_REFERENCE, VLLM_REFERENCE = REFERENCES["hf"], REFERENCES["llama.cpp"], REFERENCES["vllm"]
VLLM_PREFILL = next(n for n, m in REGISTRY.items() if m.prefill_only)

# the selections the CLIs and the transfer stage run by default
DEFAULT_BENCH_METHODS: tuple[str, ...] = (BASELINE, "pld", TOOLSPEC, "hf-pld")
DEFAULT_TRANSFER_METHODS: tuple[str, ...] = ("pld", "hf-pld", "hf-assisted", TOOLSPEC, OOOSPEC, "ooospec-gold")
DEFAULT_VLLM_BENCH_METHODS: tuple[str, ...] = (VLLM_REFERENCE, "vllm-ngram", TOOLSPEC, "ooospec-oracle")


def peers_of(backend: Backend) -> tuple[str, ...]:
    """The peer methods whose stock implementation runs on ``backend``."""
    return tuple(n for n, m in REGISTRY.items() if m.peer == backend)


def uses_sidecar(names: Iterable[str]) -> bool:
    """Whether one of the methods ``names`` takes its hints from a sidecar (unknown names are not checked here)."""
    return any(REGISTRY[n].uses_sidecar for n in names if n in REGISTRY)


def drafting_with(drafter: DrafterName, names: Iterable[str]) -> list[str]:
    """The methods of ``names`` (in their order) that draft with ``drafter`` (unknown names are skipped)."""
    return [n for n in names if n in REGISTRY and drafter in REGISTRY[n].drafters]


def default_served(with_sidecar: bool) -> str:
    """The method ``ooospec serve`` runs when none is named: hints from the sidecar when there is one."""
    return OOOSPEC if with_sidecar else TOOLSPEC


def hint_method(source: str) -> str:
    """The engine method whose hints come from ``source`` (a :data:`HINT_SOURCES` name)."""
    return next(n for n, m in REGISTRY.items() if m.hints == source)


def get_method(name: str | Method, *, served: bool = False) -> Method:
    """The registry entry ``name`` (``served``: only methods ``ooospec serve`` offers); ValueError naming the
    known ones otherwise."""
    if isinstance(name, Method):
        return name
    known = SERVED if served else tuple(REGISTRY)
    if name not in known:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(known)}")
    return REGISTRY[name]
