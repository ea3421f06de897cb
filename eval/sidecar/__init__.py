"""Which sidecar to ship and what its wave costs: two adapters compared on transfer runs and held-out quality
(``compare``), trained sidecars' quality vs wave latency (``report``), the wave alone by engine (``engines``), and a
sidecar tuned on a toolbox's own calls (``own_calls``, ``own_calls_report``).

May import: :mod:`ooospec.eval.bench`, :mod:`ooospec.eval.transfer`, :mod:`ooospec.eval.environment`,
``ooospec.runtime``, ``ooospec.reporting``.
"""
