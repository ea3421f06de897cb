"""Session-wide test settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_ooospec_cache(tmp_path_factory):
    """Probes and calibrations made by tests (hardware.json, forward_cost.json) go to a temporary cache, never to
    the user's ``~/.cache/ooospec``."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OOOSPEC_CACHE", str(tmp_path_factory.mktemp("ooospec_cache")))
    yield
    mp.undo()
