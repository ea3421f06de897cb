"""``python -m ooospec.eval.substrate``: the substrate report (:mod:`ooospec.eval.substrate.cli`)."""

from ooospec.eval.substrate.cli import main

raise SystemExit(main())
