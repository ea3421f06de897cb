"""The proposer's options: ``--additional-config '{"ooospec": {...}}'`` read into :class:`ProposerConfig`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ooospec.runtime.methods import REGISTRY, TOOLSPEC
from ooospec.runtime.sidecar.prompts import SERVED_NAME

# the registry methods a vLLM engine runs (chains, no tree policy): the served ones marked ``vllm``; a ceiling such as
# ooospec-oracle runs as the served method that takes hints, its hint text coming with each request
VLLM_METHODS = tuple(n for n, m in REGISTRY.items() if m.vllm and m.served)


@dataclass(frozen=True)
class ProposerConfig:
    """``--additional-config '{"ooospec": {...}}'``: the knobs of :class:`ChainProposer` (unknown keys are errors).

    Attributes:
        method: a registry method, ``toolspec`` or ``ooospec`` (``ooospec`` adds hints: ``ooospec_hint`` or the
            sidecar).
        sidecar_url: the sidecar server (``ooospec sidecar serve`` or vLLM serving the adapter); None = no waves.
        sidecar_model: the served sidecar's model name (``sidecar`` for ours, the ``--lora-modules`` name on vLLM).
        sidecar_layout: the prompt layout the adapter learned; None = ask the server (``/health``), and where it
            reports none (vLLM serving the adapter as a LoRA) the shipped adapter's layout.
        sidecar_wave: ``all`` (the index and every tool's arguments in one wave) or ``function-first`` (the index,
            then the arguments of the likeliest functions only: :class:`~ooospec.runtime.sidecar.client.SidecarClient`).
        sidecar_top_k: function-first's most candidate functions.
        sidecar_gate: ``off`` (every request's wave is sent) or the deployment the sidecar runs in
            (:data:`~ooospec.runtime.sidecar.deployments.SERVE_GATE_CHOICES`: ``shared`` = on the target's cores,
            ``split``,
            ``remote``): each wave is sent, cut or skipped by a :class:`~ooospec.runtime.sidecar.gate.WaveGate` from
            that deployment's prior and the server's own calibration (``/health``). Inside vLLM the gate does not
            learn from outcomes (no per-step timings reach the proposer): it decides from the prior.
        chain_cost_slope: ``T(n) = 1 + slope * (n - 1)`` one-token forwards (:class:`~.chain.ChainCost`); with
            ``chain_pricing="batch"`` the prior until the engine's own steps are fit.
        chain_pricing: ``batch`` (default): each request's chain priced at ``b_draft * B / (a + b_row * B)`` in
            a batch of ``B`` decoding requests, the step cost ``a + b_row * rows + b_draft * drafts`` learnt from
            the engine's steps (:mod:`~.step_cost`: under load chains shorten, and stop where drafts no longer
            pay; ``chain_cost_slope * B`` until then); ``fixed``: ``chain_cost_slope`` whatever the batch.
        draft_switch: at batches of ``draft_switch_min_batch`` and more, draft only where whole steps (the
            proposer's time and the engine's) commit more tokens per second drafting than not, both measured
            (:mod:`~.draft_switch`); False: always draft.
        max_requests: request states kept at most (the oldest is dropped: a preempted request that never returns,
            a client that disconnected and was never finished).
        log_interval_s: :meth:`ChainProposer.metrics` logged at INFO at most this often, while serving (0 = never).
    """

    method: str = TOOLSPEC
    sidecar_url: str | None = None
    sidecar_model: str = SERVED_NAME
    sidecar_layout: int | None = None
    sidecar_wave: str = "all"
    sidecar_top_k: int = 2
    sidecar_gate: str = "off"
    chain_cost_slope: float = 0.02
    chain_pricing: str = "batch"
    draft_switch: bool = True
    draft_switch_min_batch: int = 4
    max_requests: int = 4096
    log_interval_s: float = 30.0

    def __post_init__(self):
        if self.method not in VLLM_METHODS:
            raise ValueError(f"ooospec method {self.method!r} does not run in vLLM; choose one of {VLLM_METHODS}")
        if self.draft_switch_min_batch < 1:
            raise ValueError(f"draft_switch_min_batch must be >= 1, got {self.draft_switch_min_batch}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
        if self.chain_pricing not in ("batch", "fixed"):
            raise ValueError(f"chain_pricing must be 'batch' or 'fixed', got {self.chain_pricing!r}")
        from ooospec.runtime.sidecar.deployments import SERVE_GATE_CHOICES

        if self.sidecar_gate not in SERVE_GATE_CHOICES:
            raise ValueError(f"sidecar_gate must be one of {SERVE_GATE_CHOICES}, got {self.sidecar_gate!r}")
        if not (math.isfinite(self.log_interval_s) and self.log_interval_s >= 0):
            raise ValueError(f"log_interval_s must be >= 0 (0 = never), got {self.log_interval_s}")

    @classmethod
    def from_mapping(cls, d: Mapping | None) -> ProposerConfig:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ooospec option(s) {unknown} in additional_config; known: {sorted(known)}")
        return cls(**d)
