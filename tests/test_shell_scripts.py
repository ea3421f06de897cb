"""Every shell script the README and reports tell users to run parses (``bash -n``): a script that is only ever run
on a machine this suite never sees (a GPU, a vLLM venv) must at least not fail on its first line there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for folder in ("eval", "pipelines") for p in (ROOT / folder).rglob("*.sh")) + [ROOT / ".ci" / "run"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_script_parses(script):
    done = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_scripts_are_found():
    assert {"gpu_bench.sh", "dedicated_rows.sh", "run"} <= {p.name for p in SCRIPTS}
