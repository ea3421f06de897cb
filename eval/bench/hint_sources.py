"""Where method ``ooospec``'s hints come from in a run: the options, the started source, the adapter behind it.

    options = HintOptions(sidecar_gate=True)                 # the shipped adapter's sidecar, started for the run
    proc, hints = start_hints(options, bench_threads=2)      # the caller stops proc (None: nothing was started)
    env["sidecar_adapter"] = sidecar_adapter_record(options)   # which adapter made the hints

The sources themselves (:class:`~ooospec.eval.bench.ooospec_method.SidecarHints` and the time-zero ceilings) are in
:mod:`ooospec.eval.bench.ooospec_method`; this module picks one from :class:`HintOptions` (``ooospec bench
--hints/--sidecar-*``, the transfer stage's params) and, for the sidecar, launches its server when none is named.
How a request's guess is built from a source (a bank of known calls, a wave) is the runtime's, shared with the chat
model and the vLLM proposer: :mod:`ooospec.runtime.drafters.hint_source`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ooospec.pipelines.records import sha256_file
from ooospec.runtime import methods
from ooospec.runtime.methods import SIDECAR
from ooospec.runtime.paths import sidecar_adapter_dir
from ooospec.runtime.sidecar.deployments import BENCH_DEPLOYMENTS, DEFAULT_DEPLOYMENT, get_deployment
from ooospec.runtime.sidecar.prompts import SERVED_NAME
from ooospec.runtime.sidecar.protocol import check_wave_options


@dataclass(frozen=True)
class HintOptions:
    """Where method ``ooospec`` takes its hints from (``ooospec bench --hints/--sidecar-*``, the transfer stage).

    ``source="gold"``: the gold call at time zero, no sidecar; ``source="oracle"``: the call ``ar`` wrote for the
    same request, at time zero, no sidecar (the ceilings). ``source="sidecar"``: the sidecar
    server at ``sidecar_url``, or, when None, one started for the run from ``sidecar_adapter`` (None:
    ``$OOOSPEC_SIDECAR_ADAPTER``, else the shipped adapter) at ``dtype``, placed as deployment ``sidecar_deploy``
    (one of :data:`~ooospec.runtime.sidecar.deployments.BENCH_DEPLOYMENTS`); ``sidecar_model`` is the served model name.
    ``sidecar_gate``: send each request's wave only when it pays, cut to the queries that pay (a
    :class:`~ooospec.runtime.sidecar.gate.WaveGate` from the deployment's prior); False: always the full wave.
    ``warm_tools``: the bench's ``--warm-tools``: the started server keeps block KV across waves and each
    request's toolbox is prefilled before its clock starts; False (cold): the started server keeps none.
    ``sidecar_wave``, ``sidecar_top_k``, ``sidecar_min_prob``: the client's wave mode (``all``, or
    ``function-first``: the index query, then only the candidate tools' argument queries;
    :mod:`~ooospec.runtime.sidecar.protocol`) and its candidates. ``sidecar_engine``: what answers the waves of a
    server started for the run (``transformers``, ``llama.cpp`` or ``auto``).
    """

    source: str = SIDECAR
    sidecar_url: str | None = None
    sidecar_model: str = SERVED_NAME
    sidecar_adapter: str | None = None
    sidecar_deploy: str = DEFAULT_DEPLOYMENT
    sidecar_gate: bool = False
    dtype: str = "auto"
    warm_tools: bool = False
    sidecar_wave: str = "all"
    sidecar_top_k: int = 2
    sidecar_min_prob: float = 0.1
    sidecar_engine: str = "transformers"

    def __post_init__(self):
        if self.source not in methods.HINT_SOURCES:
            raise ValueError(f"hint source {self.source!r}: expected one of {list(methods.HINT_SOURCES)}")
        get_deployment(self.sidecar_deploy, BENCH_DEPLOYMENTS)   # ValueError naming the ones the bench can place
        check_wave_options(self.sidecar_wave, self.sidecar_top_k, self.sidecar_min_prob)


def start_hints(options: HintOptions, bench_threads: int):
    """``(server process or None, hint source)`` for method ``ooospec``; the caller stops the process.

    Args:
        options: where the hints come from.
        bench_threads: the threads the bench runs at (the deployment places the server around them).
    """
    from ooospec.eval.bench.ooospec_method import TIME_ZERO_HINTS, SidecarHints, server_placement

    if options.source != SIDECAR:
        return None, TIME_ZERO_HINTS[options.source]()
    from ooospec.runtime.sidecar.client import SidecarClient
    from ooospec.runtime.sidecar.process import launch_sidecar

    deploy = get_deployment(options.sidecar_deploy)
    proc, url = None, options.sidecar_url
    if url is None:
        cpus, server_threads = server_placement(deploy, bench_threads)
        print(f"starting the sidecar ({options.sidecar_adapter or 'shipped adapter'}, deployment {deploy.name}: "
              f"cpus {cpus or 'all'}, {server_threads} thread(s))", file=sys.stderr)
        # cold runs start every wave from nothing; warm runs keep the block KV (a toolbox is prefilled once)
        proc = launch_sidecar(options.sidecar_adapter, threads=server_threads, cpus=cpus, dtype=options.dtype,
                              prefix_cache_tokens=None if options.warm_tools else 0, engine=options.sidecar_engine)
        url = proc.url
    client = SidecarClient(url, model=options.sidecar_model, wave=options.sidecar_wave, top_k=options.sidecar_top_k,
                           min_prob=options.sidecar_min_prob)
    hints = SidecarHints(client, deploy, bench_threads)
    if options.sidecar_gate:
        from ooospec.runtime.sidecar.gate import WaveGate

        hints.client.gate = WaveGate(deploy.prior)
    return proc, hints


ADAPTER_WEIGHTS = "adapter_model.safetensors"   # the peft weights file in a sidecar adapter folder


def adapter_record(adapter: str | os.PathLike) -> dict:
    """``{"path", "sha256", "layout_version"}`` of the sidecar adapter folder ``adapter``: its absolute path, the
    sha256 (hex) of its :data:`ADAPTER_WEIGHTS` and its ``sidecar.json`` ``layout_version`` (None for a file
    that is missing, and for a ``sidecar.json`` that cannot be read)."""
    from ooospec.runtime.sidecar.prompts import read_metadata

    path = Path(adapter).resolve()
    weights = path / ADAPTER_WEIGHTS
    return {"path": str(path), "sha256": sha256_file(weights) if weights.is_file() else None,
            "layout_version": read_metadata(path, strict=False).get("layout_version")}


def sidecar_adapter_record(options: HintOptions) -> dict | None:
    """Which adapter made the sidecar hints of a run with ``options`` (the results' ``env.sidecar_adapter``):
    :func:`adapter_record` of ``sidecar_adapter`` (None: ``$OOOSPEC_SIDECAR_ADAPTER``, else the shipped adapter,
    as :func:`start_hints` launches it) plus ``url``, the already running server if one was named. For such a
    server without ``sidecar_adapter`` the adapter is unknown: ``path``, ``sha256`` and ``layout_version`` are
    None. None when the hints come from no sidecar (``gold``, ``oracle``)."""
    if options.source != SIDECAR:
        return None
    if options.sidecar_url is not None and options.sidecar_adapter is None:
        return {"path": None, "sha256": None, "layout_version": None, "url": options.sidecar_url}
    return {**adapter_record(sidecar_adapter_dir(options.sidecar_adapter)), "url": options.sidecar_url}
