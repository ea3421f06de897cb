"""The bench harness on ooo-spec's own engine: ``ooospec bench``.

Owns the benchmark's examples (:mod:`~ooospec.eval.bench.data`), the method API and its methods (engine methods,
Hugging Face and llama.cpp peers, method ``ooospec`` with its hint sources), the timed run (``harness``), the
summaries every report shows, the bench report and the hint replay.

May import: :mod:`ooospec.eval.environment`, ``ooospec.runtime``, ``ooospec.reporting``; no other eval room.
"""
