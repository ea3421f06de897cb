"""The ``transfer`` DVC stage (``python -m ooospec.eval.transfer``): one frozen sidecar, every target x benchmark x
method, resumable per cell, and its report (markdown, HTML page, plots, notes). The named params sets of the stage
(``full.yaml``, ``warm*.yaml``, ``sidecar_*.yaml``) live beside it.

May import: :mod:`ooospec.eval.bench`, :mod:`ooospec.eval.environment`, ``ooospec.runtime``, ``ooospec.reporting``.
"""
