"""Where ooo-spec finds its files, in a checkout and in an installed wheel alike.

Every default location lives here; no other module spells one.

- Shipped files (the sidecar adapter, the training recipes) sit under :data:`PACKAGE_ROOT`, the folder that
  holds ``runtime/``. In a checkout that is the repository root; in an installed wheel it is
  ``site-packages/ooospec``, where pyproject's ``package-dir`` puts ``adapters/`` as ``ooospec.adapters`` and
  ``recipes/`` as ``ooospec.recipes``. The same relative path therefore works in both layouts.
- Data the DVC pipeline makes (the benchmarks) is never shipped: it is found relative to the working directory
  (``data/dedupe/eval``, where ``dvc repro dedupe`` writes it) unless a flag names another folder.
- Caches (models, hardware probes, forward costs, wheels) live under :func:`cache_dir`.

    from ooospec.runtime import paths
    paths.sidecar_adapter_dir()                   # $OOOSPEC_SIDECAR_ADAPTER, else the shipped adapter
    paths.resolve_benchmark("apibank-l1")         # data/dedupe/eval/apibank-l1.jsonl, or an error naming the flag
    paths.resolve_recipe("recipes/cpu_default.yaml")   # as given if it exists, else the shipped copy
    paths.cache_dir() / "hardware.json"           # $OOOSPEC_CACHE, else ~/.cache/ooospec
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # the repository root, or site-packages/ooospec when installed

ADAPTER_ENV = "OOOSPEC_SIDECAR_ADAPTER"
CACHE_ENV = "OOOSPEC_CACHE"
DEFAULT_CACHE = "~/.cache/ooospec"
BENCHMARK_DIR = Path("data/dedupe/eval")            # relative to the working directory: `dvc repro dedupe` output
BENCHMARK_DIR_FLAG = "--benchmark-dir"
DEFAULT_RECIPE = "recipes/cpu_default.yaml"         # relative to the repository root, or the shipped copy


# ------------------------------------------------------------------------------------------- shipped files


def shipped_adapter_dir(root: Path = PACKAGE_ROOT) -> Path:
    """The sidecar adapter shipped with the package: ``<root>/adapters/sidecar``.

    Args:
        root: the folder holding ``runtime/`` (default :data:`PACKAGE_ROOT`; tests pass a simulated layout).
    Returns:
        the adapter folder; it has an ``adapter_config.json``.
    """
    path = root / "adapters" / "sidecar"
    if not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"the shipped sidecar adapter is missing: {path / 'adapter_config.json'} not found. A checkout has it "
            f"in git under adapters/sidecar; an installed ooo-spec ships it as package data (reinstall it if it "
            f"is gone). Or point at another adapter with --sidecar-adapter DIR / ${ADAPTER_ENV}")
    return path


def sidecar_adapter_dir(adapter: str | os.PathLike | None = None) -> Path:
    """``adapter`` if given, else ``$OOOSPEC_SIDECAR_ADAPTER`` if set, else :func:`shipped_adapter_dir`."""
    if adapter is not None:
        return Path(adapter)
    if os.environ.get(ADAPTER_ENV):
        return Path(os.environ[ADAPTER_ENV])
    return shipped_adapter_dir()


def shipped_recipes_dir(root: Path = PACKAGE_ROOT) -> Path:
    """The training recipes shipped with the package: ``<root>/recipes``."""
    return root / "recipes"


def resolve_recipe(recipe: str | os.PathLike, root: Path = PACKAGE_ROOT) -> Path:
    """A recipe path as given when it exists, else for ``recipes/<name>`` or ``<name>`` the shipped recipe.

    ``recipes/cpu_default.yaml`` (params.yaml's form, relative to the repository root) thus works from any
    working directory: in the repository it is the file there, elsewhere the copy shipped in the package.
    Any other path must exist as given.

    Raises:
        FileNotFoundError: no such recipe; the message lists the recipes next to it (or the shipped ones).
    """
    path = Path(recipe)
    if path.is_file():
        return path
    folder = path.parent
    if not path.is_absolute() and str(folder) in (".", "recipes"):
        folder = shipped_recipes_dir(root)
        if (folder / path.name).is_file():
            return folder / path.name
    known = sorted(p.name for p in folder.glob("*.yaml"))
    raise FileNotFoundError(f"recipe {str(path)!r} not found (recipes there, in {folder}: {known})")


# ---------------------------------------------------------------------------------------------- benchmarks


def resolve_benchmark(dataset: str, benchmark_dir: str | os.PathLike | None = None,
                      flag: str = BENCHMARK_DIR_FLAG) -> Path:
    """A JSONL path as given, or a benchmark name -> ``<benchmark_dir>/<name>.jsonl``.

    Args:
        dataset: a path to a JSONL file of records, or a benchmark name (``apibank-l1``).
        benchmark_dir: the folder of ``<name>.jsonl`` benchmarks; default :data:`BENCHMARK_DIR` under the
            working directory (where ``dvc repro dedupe`` writes them in a checkout).
        flag: the command-line flag that sets ``benchmark_dir``, named in the errors.
    Raises:
        FileNotFoundError: the file, the folder or the benchmark in it is missing; the message says which
            and names ``flag``.
    """
    as_path = Path(dataset)
    if as_path.suffix == ".jsonl" or as_path.is_file():
        if not as_path.is_file():
            raise FileNotFoundError(f"--dataset {dataset}: no such file")
        return as_path
    folder = BENCHMARK_DIR if benchmark_dir is None else Path(benchmark_dir)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"benchmark {dataset!r}: no benchmark folder {folder} (looked in {folder.absolute()}). Pass {flag} DIR "
            f"(a folder of <name>.jsonl records; `dvc repro dedupe` builds data/dedupe/eval in a checkout), "
            f"or a path to a JSONL file of records")
    path = folder / f"{dataset}.jsonl"
    if not path.is_file():
        have = sorted(p.stem for p in folder.glob("*.jsonl"))
        raise FileNotFoundError(
            f"benchmark {dataset!r}: {path} not found (available in {folder}: {have or 'none'}); build the "
            f"benchmarks with `dvc repro dedupe`, pass {flag} DIR, or a path to a JSONL file of records")
    return path


# ------------------------------------------------------------------------------------------------- caches


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """``cache`` if given, else ``$OOOSPEC_CACHE``, else ``~/.cache/ooospec``."""
    if cache is not None:
        return Path(cache).expanduser()
    return Path(os.environ.get(CACHE_ENV, DEFAULT_CACHE)).expanduser()


def read_json_cache(path: Path) -> dict:
    """A JSON cache file's table; ``{}`` when it is missing or unreadable (a cache is never an error)."""
    if not path.is_file():
        return {}
    try:
        table = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return table if isinstance(table, dict) else {}


def write_json_cache(path: Path, table: dict) -> bool:
    """Write a JSON cache file atomically (per-process temp file, then rename); False (and a warning) when the
    folder is not writable, since a cache is never an error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as e:
        logging.getLogger(__name__).warning("could not write the cache %s: %s", path, e)
        return False
    return True

