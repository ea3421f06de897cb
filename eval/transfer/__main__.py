"""``python -m ooospec.eval.transfer``: the ``transfer`` stage (:mod:`ooospec.eval.transfer.stage`)."""

from ooospec.eval.transfer.stage import main

raise SystemExit(main())
