"""Where the sidecar runs next to the target: ONE table (:data:`DEPLOYMENTS`) that ``ooospec serve --sidecar-gate``,
``ooospec bench --sidecar-deploy / --sidecar-gate``, the agent bench and the transfer stage read.

Each deployment has a name, a one-line summary, the wave gate's prior for it
(:class:`~ooospec.runtime.sidecar.gate_pricing.Estimates`: what a wave costs the target there) and, where ``ooospec
bench`` can set it up on one CPU box, how the bench places the sidecar server and the target (:class:`Placement`;
the baselines always run at the bench's own threads)::

    deployment   sidecar server (bench)           target during an ooospec call        wave gate prior
    shared       all cores, bench threads         all cores, bench threads             skip (interference 1)
    split        pinned to the last core, 1 thr.  pinned to the other cores            send (interference 0.05)
    wave-first   all cores, bench threads         all cores, after the wave is ready   skip (all of it is cost)
                 (method ooospec-wave-first: the same in vLLM; its client-side gate prices a hint token at vLLM's
                 chain marginal, eval/vllm/runs.py VLLM_CHAIN_MARGINAL, and sends where the target is slow)
    dedicated    EMULATED (method ooospec-dedicated, beside the run's ooospec): the wave timed   send (interf. 0)
                 alone first on the run's server; the target then sees its hints at the measured latency
    remote       another machine or an idle accelerator (not set up by the bench)      send

``dedicated`` is the seeds' deployment (the sidecar on a device of its own) emulated on one box: a device exactly
as fast as this CPU, idle otherwise. Its rows are an emulation and every report labels them so; they are never a
measurement of a shared-core deployment.

A server never makes the target wait for a wave, so ``ooospec serve`` offers the deployments that do not
(:data:`SERVE_DEPLOYMENTS`); the bench offers those it can place (:data:`BENCH_DEPLOYMENTS`). Torch-free: CLIs read
their choices here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from ooospec.runtime.sidecar.gate_pricing import Estimates


@dataclass(frozen=True)
class Placement:
    """How ``ooospec bench`` places a sidecar server it starts, and the target during an ``ooospec`` call."""

    server_cpus: Literal["last", "all"]      # the server pinned to the last core, or on all of them
    server_threads: Literal["one", "bench"]  # its torch threads: one, or the bench's
    target_cpus: Literal["rest", "all"]      # the target pinned to the other cores during the call, or on all


@dataclass(frozen=True)
class Deployment:
    """One way to run the sidecar next to the target (see the module docstring)."""

    name: str
    summary: str
    prior: Estimates                        # the wave gate's prior (runtime/sidecar/gate_pricing.py)
    placement: Placement | None = None      # None: the bench cannot set it up on its own box
    target_waits: bool = False              # the target starts decoding only once the wave is ready
    emulated: bool = False                  # the bench replays the wave's measured latency (not a real placement)


# Calibrated on data/transfer-full/cells/qwen2.5-coder-{0.5b,1.5b}/apibank-l1.json (2 shared Xeon cores, bf16,
# shared deployment): server prefill 0.37 s for 372 tokens, decode 0.36 s for 5 forwards of 9 branches;
# ooospec - toolspec + hint savings = 0.88-0.95 x the wave's compute (interference); gold hints at time zero save
# 0.53 s for 28.5 hint-accepted tokens at T(1) = 0.19 s (marginal ~0.1); real hints were accepted at 0.21-0.23 per
# call token after the bank was ready. The hit rate (a slots wave's joined call is the call the target commits): the
# shipped sidecar's joined call matches the gold call on 62% of held-out requests (eval/reports/sidecar/table.md)
# and the 0.5B / 1.5B targets write the gold call on 38% / 46% of the transfer matrix's requests, so ~0.3.
_SHARED_CORES = Estimates(
    interference=1.0, latency_factor=1.05, prefill_per_token=0.0011, decode_forward=0.045, decode_per_query=0.003,
    forwards={"index": 2.0, "slots": 5.0}, accept_rate={"index": 0.05, "slots": 0.2}, marginal=0.1, step_s=0.19,
    call_tokens=55.0, target_prefill=1.0, target_token_s=0.1, client_s=0.005, chars_per_token=3.0, hit_rate=0.3)
_ALL_CORES = Placement(server_cpus="all", server_threads="bench", target_cpus="all")

SHARED = Deployment("shared", "the sidecar on the target's cores", _SHARED_CORES, _ALL_CORES)
SPLIT = Deployment("split", "the sidecar on a core of its own, the target on the others",
                   replace(_SHARED_CORES, interference=0.05),
                   Placement(server_cpus="last", server_threads="one", target_cpus="rest"))
WAVE_FIRST = Deployment("wave-first", "the target's cores, and the target decodes only once the wave is ready",
                        replace(_SHARED_CORES, target_waits=True), _ALL_CORES, target_waits=True)
DEDICATED = Deployment("dedicated", "EMULATED: the sidecar on a device of its own as fast as this CPU (the wave timed "
                       "alone, its hints released to the target at that latency)",
                       replace(_SHARED_CORES, interference=0.0, target_prefill=1.0), target_waits=True,
                       emulated=True)
REMOTE = Deployment("remote", "the sidecar on another machine or an idle accelerator",
                    replace(_SHARED_CORES, interference=0.0, prefill_per_token=0.0002, decode_forward=0.015,
                            decode_per_query=0.0002))

DEPLOYMENTS: dict[str, Deployment] = {d.name: d for d in (SHARED, SPLIT, WAVE_FIRST, DEDICATED, REMOTE)}
DEFAULT_DEPLOYMENT = SHARED.name
BENCH_DEPLOYMENTS: tuple[str, ...] = tuple(n for n, d in DEPLOYMENTS.items() if d.placement is not None)
SERVE_DEPLOYMENTS: tuple[str, ...] = tuple(n for n, d in DEPLOYMENTS.items() if not d.target_waits)

# ``--sidecar-gate``: off, or the deployment whose prior the gate starts from. ``ooospec serve`` names the
# deployment; the benches place the sidecar themselves, so their ``on`` means the deployment they placed it in.
GATE_OFF, GATE_ON = "off", "on"
SERVE_GATE_CHOICES: tuple[str, ...] = (GATE_OFF, *SERVE_DEPLOYMENTS)
BENCH_GATE_CHOICES: tuple[str, ...] = (GATE_ON, GATE_OFF)


def get_deployment(name: str, known: tuple[str, ...] = tuple(DEPLOYMENTS)) -> Deployment:
    """The deployment ``name`` (one of ``known``); ValueError naming the known ones otherwise."""
    if name not in known:
        raise ValueError(f"unknown sidecar deployment {name!r}; known: {', '.join(known)}")
    return DEPLOYMENTS[name]
