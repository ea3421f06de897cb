"""runtime/paths.py: shipped files found in a checkout and in an installed wheel; benchmarks, recipes, caches."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

from ooospec.runtime import paths

REPO = Path(__file__).resolve().parents[2]


def load_paths_module(root: Path, name: str):
    """A copy of runtime/paths.py placed at ``root/runtime/paths.py`` and imported from there."""
    (root / "runtime").mkdir(parents=True)
    file = root / "runtime" / "paths.py"
    file.write_text(Path(paths.__file__).read_text())
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def add_shipped_files(root: Path) -> None:
    (root / "adapters" / "sidecar").mkdir(parents=True)
    (root / "adapters" / "sidecar" / "adapter_config.json").write_text("{}")
    (root / "recipes").mkdir()
    (root / "recipes" / "cpu_default.yaml").write_text("base: smollm2-135m\n")


def write_records(path: Path, n: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(n)))


# ------------------------------------------------------------------------------------------- shipped files


@pytest.mark.parametrize("layout", ["repo", "venv/lib/python3.11/site-packages/ooospec"],
                         ids=["checkout", "installed"])
def test_shipped_files_are_found_from_any_working_directory(tmp_path, monkeypatch, layout):
    root = tmp_path / layout
    module = load_paths_module(root, f"paths_{layout.replace('/', '_').replace('.', '_')}")
    add_shipped_files(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv(paths.ADAPTER_ENV, raising=False)
    assert module.PACKAGE_ROOT == root.resolve()
    assert module.shipped_adapter_dir() == root.resolve() / "adapters" / "sidecar"
    assert module.sidecar_adapter_dir() == module.shipped_adapter_dir()
    assert module.resolve_recipe(paths.DEFAULT_RECIPE) == root.resolve() / "recipes" / "cpu_default.yaml"


def test_pyproject_installs_every_package_where_a_checkout_has_it():
    """paths.PACKAGE_ROOT relies on it: installed ``ooospec/<x>`` is the checkout's ``<x>`` for every package."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir = setuptools["package-dir"]
    for package in setuptools["packages"]:
        if package != "ooospec":
            assert package_dir[package] == package.removeprefix("ooospec.").replace(".", "/"), package
    shipped = {"ooospec.adapters.sidecar": REPO / "adapters" / "sidecar", "ooospec.recipes": REPO / "recipes"}
    for package, folder in shipped.items():
        patterns = setuptools["package-data"][package]
        files = [f for f in folder.iterdir() if f.is_file()]
        assert files, folder
        assert all(any(f.match(p) for p in patterns) for f in files), (package, patterns)


def test_the_checkout_has_the_shipped_adapter_and_default_recipe():
    assert (paths.shipped_adapter_dir() / "adapter_config.json").is_file()
    assert paths.resolve_recipe(paths.DEFAULT_RECIPE).resolve() == REPO / "recipes" / "cpu_default.yaml"


def test_a_missing_shipped_adapter_says_how_to_point_at_another(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"adapter_config.json not found.*--sidecar-adapter"):
        paths.shipped_adapter_dir(tmp_path)


def test_adapter_precedence_given_then_env_then_shipped(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.ADAPTER_ENV, raising=False)
    assert paths.sidecar_adapter_dir() == paths.shipped_adapter_dir()
    monkeypatch.setenv(paths.ADAPTER_ENV, str(tmp_path / "env"))
    assert paths.sidecar_adapter_dir() == tmp_path / "env"
    assert paths.sidecar_adapter_dir(tmp_path / "given") == tmp_path / "given"


def test_recipe_paths_other_than_recipes_name_must_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert paths.resolve_recipe("cpu_default.yaml") == paths.shipped_recipes_dir() / "cpu_default.yaml"
    with pytest.raises(FileNotFoundError, match="recipes there"):
        paths.resolve_recipe(tmp_path / "cpu_default.yaml")   # a path elsewhere never falls back
    with pytest.raises(FileNotFoundError, match=r"cpu_default.yaml"):
        paths.resolve_recipe("recipes/nope.yaml")              # lists the shipped recipes
    local = tmp_path / "recipes" / "cpu_default.yaml"
    local.parent.mkdir()
    local.write_text("base: x\n")
    assert paths.resolve_recipe("recipes/cpu_default.yaml") == Path("recipes/cpu_default.yaml")   # the CWD's first


# ---------------------------------------------------------------------------------------------- benchmarks


def test_benchmark_names_resolve_under_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no benchmark folder data/dedupe/eval.*Pass --benchmark-dir DIR"):
        paths.resolve_benchmark("apibank-l1")
    write_records(tmp_path / "data/dedupe/eval/apibank-l1.jsonl")
    assert paths.resolve_benchmark("apibank-l1") == Path("data/dedupe/eval/apibank-l1.jsonl")
    with pytest.raises(FileNotFoundError, match=r"available in data/dedupe/eval: \['apibank-l1'\].*dvc repro dedupe"
                                                r".*--benchmark-dir"):
        paths.resolve_benchmark("bfcl-java")


def test_benchmark_dir_and_jsonl_paths(tmp_path):
    write_records(tmp_path / "benchmarks" / "bfcl-java.jsonl")
    assert paths.resolve_benchmark("bfcl-java", tmp_path / "benchmarks") == tmp_path / "benchmarks" / "bfcl-java.jsonl"
    with pytest.raises(FileNotFoundError, match="no benchmark folder .*Pass --records-dir DIR"):
        paths.resolve_benchmark("bfcl-java", tmp_path / "nope", flag="--records-dir")
    records = tmp_path / "two.jsonl"
    write_records(records)
    assert paths.resolve_benchmark(str(records)) == records
    with pytest.raises(FileNotFoundError, match="--dataset .*missing.jsonl: no such file"):
        paths.resolve_benchmark(str(tmp_path / "missing.jsonl"))


def test_bench_and_sidecar_cli_name_the_flag_when_the_benchmarks_are_missing(tmp_path, monkeypatch):
    from ooospec import sidecar_cli
    from ooospec.eval.bench import cli as bench

    monkeypatch.chdir(tmp_path)
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    with pytest.raises(SystemExit, match="--benchmark-dir"):
        bench.run_cli(p.parse_args(["--target", "smollm2-135m", "--dataset", "apibank-l1"]))
    write_records(tmp_path / "mine" / "apibank-l1.jsonl")
    args = p.parse_args(["--target", "t", "--dataset", "apibank-l1", "--benchmark-dir", "mine"])
    assert paths.resolve_benchmark(args.dataset, args.benchmark_dir) == Path("mine/apibank-l1.jsonl")
    p = argparse.ArgumentParser()
    sidecar_cli.add_arguments(p)
    with pytest.raises(SystemExit, match="--benchmark-dir"):
        sidecar_cli.run_cli(p.parse_args(["predict", "--dataset", "apibank-l1", "--out", "preds.jsonl"]))


# -------------------------------------------------------------------------------------------------- caches


def test_cache_dir_is_the_argument_then_the_env_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.CACHE_ENV, raising=False)
    assert paths.cache_dir() == Path("~/.cache/ooospec").expanduser()
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "env"))
    assert paths.cache_dir() == tmp_path / "env"
    assert paths.cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_the_modules_that_cache_use_the_one_cache_dir(tmp_path, monkeypatch):
    from ooospec import llamacpp_install
    from ooospec.runtime.backends import cost_model, fetch, hardware

    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path))
    assert fetch.model_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m"
    assert hardware._cache_file() == tmp_path / "hardware.json"
    assert cost_model._cache_file() == tmp_path / "forward_cost.json"
    assert llamacpp_install.wheel_dir().is_relative_to(tmp_path / "wheels")
