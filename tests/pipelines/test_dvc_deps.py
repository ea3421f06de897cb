"""Every DVC stage that runs ``python -m ooospec.<module>`` depends on every file of that module's import closure.

The closure is computed statically (``ast``) inside the ``ooospec`` package: ``import`` and ``from ... import``
statements anywhere in a module (inside functions too), relative imports, the ``__init__.py`` of every package
on the way, and string literals that name a module of the package (``importlib.import_module`` tables such as
``pipelines/sources/__init__.py``). The console script ``ooospec/cli.py`` is the one exception: its table names
every command's module but runs one, so through it only the commands named in an argv literal
(``[sys.executable, "-m", "ooospec.cli", "sidecar", ...]``) or in the stage's cmd are followed. Module names map
to files through pyproject's ``[tool.setuptools.package-dir]`` (``ooospec.runtime.x`` -> ``runtime/x.py``). A dep
on a folder covers every file below it.

Stages come from every ``dvc.yaml`` of the repo (the default pipeline and ``pipelines/full/dvc.yaml``), read by
DVC itself so ``wdir``, ``foreach`` and ``${...}`` are resolved the way ``dvc repro`` resolves them.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
CLI_MODULE = "ooospec.cli"  # [project.scripts] ooospec = "ooospec.cli:main"
MODULE_IN_CMD = re.compile(r"-m\s+(ooospec(?:\.\w+)+)(?:\s+([\w-]+))?")
CD = re.compile(r"\s*cd\s+(\S+)\s*&&")
SCRIPT_IN_CMD = re.compile(r"(?:^|[;&|(]\s*)ooospec\s+([\w-]+)")


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """pyproject's package-dir: ``{"ooospec.runtime": root/"runtime", ...}``."""
    with open(root / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {pkg: root / folder for pkg, folder in mapping.items()}


def module_file(name: str, dirs: dict[str, Path]) -> Path | None:
    """The file of module ``name`` (``ooospec.runtime.x`` -> ``runtime/x.py``; a package -> its ``__init__.py``),
    or None when it is not a module of the package (an attribute, or outside ``ooospec``)."""
    if name in dirs:
        init = dirs[name] / "__init__.py"
        return init if init.is_file() else None
    parent, _, leaf = name.rpartition(".")
    if parent not in dirs:  # the longest mapped package holds it; subpackages are mapped one by one
        return None
    for candidate in (dirs[parent] / f"{leaf}.py", dirs[parent] / leaf / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _package_of(name: str, path: Path) -> str:
    """The package a module's relative imports start from: itself for an ``__init__.py``, else its parent."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def cli_commands(dirs: dict[str, Path]) -> dict[str, str]:
    """The console script's dispatch table, read from ``ooospec/cli.py``:
    ``{"sidecar": "ooospec.sidecar_cli", ...}``."""
    tree = ast.parse(module_file(CLI_MODULE, dirs).read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign)
                                                                        else None)
        if isinstance(target, ast.Name) and target.id == "COMMANDS" and isinstance(node.value, ast.Dict):
            return {k.value: v.elts[0].value for k, v in zip(node.value.keys, node.value.values)}
    raise AssertionError(f"{CLI_MODULE}: no COMMANDS dict literal")


def entry_modules(cmd: str, commands: dict[str, str]) -> set[str]:
    """The package modules a stage's cmd runs: ``python -m ooospec.x.y``, and for the console script
    (``ooospec sub`` or ``python -m ooospec.cli sub``) the CLI plus the subcommand's module."""
    out = set()
    for module, sub in MODULE_IN_CMD.findall(cmd):
        out.add(module)
        if module == CLI_MODULE and sub in commands:
            out.add(commands[sub])
    for sub in SCRIPT_IN_CMD.findall(cmd):
        out |= {CLI_MODULE, commands[sub]} if sub in commands else set()
    return out


def _argv_command(node: ast.List | ast.Tuple, commands: dict[str, str]) -> str | None:
    """``[..., "-m", "ooospec.cli", "sidecar", ...]`` -> ``"ooospec.sidecar_cli"``."""
    words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
    for i in range(len(words) - 2):
        if words[i] == "-m" and words[i + 1] == CLI_MODULE and words[i + 2] in commands:
            return commands[words[i + 2]]
    return None


def imported_names(name: str, path: Path, top: str = "ooospec",
                   commands: dict[str, str] | None = None) -> set[str]:
    """Absolute names of every module (or module attribute) ``path`` imports, wherever the import statement is.

    ``from ooospec.runtime import sidecar_prompts`` gives ``ooospec.runtime`` and ``ooospec.runtime.sidecar.prompts``
    (the second is kept only if it is a module); ``from . import x`` inside ``ooospec.pipelines.sources`` gives
    ``ooospec.pipelines.sources`` and ``ooospec.pipelines.sources.x``. A string literal naming a module of the
    package ``top`` (``"ooospec.pipelines.sources.apibank"``) counts as an import of it. Imports under
    ``if TYPE_CHECKING:`` do not count.
    """
    literal = re.compile(re.escape(top) + r"(?:\.\w+)+")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):   # `if TYPE_CHECKING:` imports are annotations only, never run
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and literal.fullmatch(node.value):
            if name != CLI_MODULE:  # the console script's table: see the module docstring
                out.add(node.value)
        elif isinstance(node, (ast.List, ast.Tuple)) and commands and (sub := _argv_command(node, commands)):
            out.add(sub)
    return out


def import_closure(entry: str, dirs: dict[str, Path] | None = None) -> set[Path]:
    """Every file of the package that ``python -m entry`` may import (``entry`` and its packages' ``__init__.py``
    included; a package's ``__main__.py`` too)."""
    dirs = dirs or package_dirs()
    top = min(dirs, key=len)  # the import root: "ooospec"
    commands = cli_commands(dirs) if module_file(CLI_MODULE, dirs) else {}
    seen: set[Path] = set()
    todo = [entry]
    init = module_file(entry, dirs)
    if init is not None and init.name == "__init__.py" and (init.parent / "__main__.py").is_file():
        todo.append(entry + ".__main__")   # `python -m package` runs its __main__.py
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__.py and a/b/__init__.py first
            prefix = ".".join(parts[:i])
            path = module_file(prefix, dirs)
            if path is None or path in seen:
                continue
            seen.add(path)
            todo.extend(imported_names(prefix, path, top, commands))
    return seen


def covered(path: str, deps: list[str]) -> bool:
    """Whether a dep names ``path`` or a folder above it (paths relative to the repo root, ``/``-separated)."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)


def python_stages(root: Path = ROOT) -> list[tuple[str, list[str], list[str]]]:
    """``(stage address, modules run by its cmd, deps relative to the repo root)`` for every stage of every
    dvc.yaml whose cmd runs ``python -m ooospec...``."""
    from dvc.repo import Repo

    commands = cli_commands(package_dirs(root))
    out = []
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            cmds = stage.cmd if isinstance(stage.cmd, list) else [stage.cmd or ""]
            modules = sorted({m for c in cmds for m in entry_modules(c, commands)})
            if not modules:
                continue
            deps = [Path(os.path.relpath(d.fs_path, root)).as_posix() for d in stage.deps]
            dvcfile = Path(os.path.relpath(stage.dvcfile.path, root)).as_posix()
            out.append((f"{dvcfile}:{stage.name}", modules, deps))
    return sorted(out)


# --------------------------------------------------------------------------------------------- the helpers

def _toy_package(tmp_path: Path) -> dict[str, Path]:
    files = {
        "pkg/__init__.py": "",
        "lib/__init__.py": "from . import base\n",
        "lib/base.py": "X = 1\n",
        "lib/lazy.py": "def f():\n    from .deep import g\n    return g\n",
        "lib/deep.py": "from ..lib.base import X\n",
        "lib/table.py": "MODS = {'a': 'pkg.lib.plugin'}\n",
        "lib/plugin.py": "",
        "lib/unused.py": "",
        "app/__init__.py": "",
        "app/main.py": "import json\nfrom pkg.lib import lazy, table\nfrom pkg.lib.base import X as Y\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return {"pkg": tmp_path / "pkg", "pkg.lib": tmp_path / "lib", "pkg.app": tmp_path / "app"}


def test_closure_follows_function_relative_and_literal_imports(tmp_path):
    dirs = _toy_package(tmp_path)
    got = {p.relative_to(tmp_path).as_posix() for p in import_closure("pkg.app.main", dirs)}
    assert got == {"pkg/__init__.py", "app/__init__.py", "app/main.py", "lib/__init__.py", "lib/base.py",
                   "lib/lazy.py", "lib/deep.py", "lib/table.py", "lib/plugin.py"}


def test_a_folder_dep_covers_the_files_below_it():
    assert covered("runtime/formats/hermes.py", ["runtime/formats"])
    assert covered("runtime/formats/hermes.py", ["runtime/"])
    assert not covered("runtime/formats_extra.py", ["runtime/formats"])
    assert covered("pipelines/params.py", ["pipelines/params.py"])


def test_the_package_maps_to_its_folders():
    dirs = package_dirs()
    assert module_file("ooospec.runtime.sidecar.prompts", dirs) == ROOT / "runtime" / "sidecar" / "prompts.py"
    assert module_file("ooospec.runtime.formats", dirs) == ROOT / "runtime" / "formats" / "__init__.py"
    assert module_file("ooospec.runtime.sidecar.prompts.FORMS", dirs) is None
    assert ROOT / "pipelines" / "params.py" in import_closure("ooospec.pipelines.train_sidecar", dirs)


# --------------------------------------------------------------------------------------------- the pipelines

STAGES = python_stages()


def test_some_stages_run_modules_of_the_package():
    names = {address for address, _, _ in STAGES}
    assert {"dvc.yaml:train_sidecar", "dvc.yaml:eval_sidecar"} <= names
    assert any(a.startswith("pipelines/full/dvc.yaml:") for a in names)


@pytest.mark.parametrize("address, modules, deps", STAGES, ids=[s[0] for s in STAGES])
def test_stage_depends_on_its_import_closure(address, modules, deps):
    dirs = package_dirs()
    needed = sorted({p.relative_to(ROOT).as_posix() for m in modules for p in import_closure(m, dirs)})
    missing = [p for p in needed if not covered(p, deps)]
    assert not missing, (f"{address} runs {', '.join(modules)} but its deps miss {len(missing)} imported "
                         "file(s); add them (or a folder above them) to its deps:\n  " + "\n  ".join(missing))


CODE_FOLDERS = ("pipelines/", "runtime/", "eval/", "ooospec/")


def _is_code_dep(dep: str) -> bool:
    """A dep on the package's code: a ``.py`` file, or a folder holding some, under one of the package folders."""
    if not (dep + "/").startswith(CODE_FOLDERS):
        return False
    path = ROOT / dep
    return dep.endswith(".py") or (path.is_dir() and any(path.rglob("*.py")))


@pytest.mark.parametrize("address, modules, deps", STAGES, ids=[s[0] for s in STAGES])
def test_stage_has_no_code_deps_it_does_not_import(address, modules, deps):
    """A code dep outside the import closure re-runs the stage (a transfer matrix, a training run) for nothing."""
    dirs = package_dirs()
    needed = {p.relative_to(ROOT).as_posix() for m in modules for p in import_closure(m, dirs)}
    extra = [d for d in deps if _is_code_dep(d) and not any(covered(n, [d]) for n in needed)]
    assert not extra, (f"{address} runs {', '.join(modules)} but depends on code it never imports; drop from its "
                       "deps:\n  " + "\n  ".join(extra))


def _stage_paths(root: Path = ROOT) -> list[tuple[str, str, list[str], list[str]]]:
    """``(stage address, cmd, outs and metrics, data deps)`` of every stage of every dvc.yaml, paths relative to where
    the cmd runs (the stage's wdir, or the folder a leading ``cd DIR &&`` moves to: pipelines/own/dvc.yaml's stages
    run from the repository root); data deps = deps that are neither the package's code nor params."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    out = []
    with Repo(str(root)) as repo:
        for stage in repo.index.stages:
            cmd = " ".join(stage.cmd) if isinstance(stage.cmd, list) else (stage.cmd or "")
            if not cmd:
                continue
            cwd = stage.wdir          # where the cmd runs: the wdir, or where a leading `cd DIR &&` takes it
            if (m := CD.match(cmd)) is not None:
                cwd = os.path.normpath(os.path.join(stage.wdir, m.group(1)))
            outs = [Path(os.path.relpath(o.fs_path, cwd)).as_posix() for o in stage.outs]
            data = [Path(os.path.relpath(d.fs_path, cwd)).as_posix() for d in stage.deps
                    if not isinstance(d, ParamsDependency)
                    and not _is_code_dep(Path(os.path.relpath(d.fs_path, root)).as_posix())]
            dvcfile = Path(os.path.relpath(stage.dvcfile.path, root)).as_posix()
            out.append((f"{dvcfile}:{stage.name}", cmd, outs, data))
    return sorted(out)


STAGE_PATHS = _stage_paths()
OUTPUTS = [(address, cmd, outs) for address, cmd, outs, _ in STAGE_PATHS]
INPUTS = [(address, cmd, data) for address, cmd, _, data in STAGE_PATHS]


# data deps a stage reads without its cmd naming them, by (stage name, dep): each is named elsewhere, once
INPUT_EXCEPTIONS = {
    ("ingest", "pipelines/sources.lock.json"): "the pinned raw-file hashes shipped with the package "
                                               "(ingest.LOCK_FILE); `--write-lock` rewrites them",
    ("train_sidecar", "recipes"): "the recipe params' train_sidecar.recipe names",
    ("train_sidecar", "recipes/cpu_qwen2.5-coder-0.5b.yaml"): "the recipe the stage's params file names",
    ("transfer", "data/dedupe/eval"): "the benchmarks params' transfer.benchmarks names",
    ("transfer", "adapters/sidecar"): "the adapter params' transfer.sidecar_adapter names",
    ("ingest", "data/user"): "your call logs, which ingest.user_sources[].path names (pipelines/own/params.yaml)",
    ("ingest", "eval/own_toolbox/apibank.calls.jsonl"): "the replayed call log, which the experiment's "
                                                        "ingest.user_sources[].path names",
    ("transfer", "data/own/dedupe/eval/calls.jsonl"): "your held-out requests, which transfer.benchmarks names",
    ("transfer", "models/own/sidecar/hub"): "the tuned adapter, which transfer.sidecar_adapter names",
    ("transfer", "data/own_toolbox/dedupe/eval/apibank-log.jsonl"): "the stand-in's held-out requests "
                                                                    "(transfer.benchmarks)",
    ("transfer", "models/own_toolbox/q05-all/hub"): "the tuned adapter (transfer.sidecar_adapter)",
}


def _named(path: str, cmd: str) -> bool:
    """Whether ``cmd`` names ``path``: the path, a folder above it, or (a folder path) a file in it; ``KEY=PATH``
    words name their PATH."""
    words = {w.rstrip("/").rpartition("=")[2] for w in cmd.split()}
    return any(path == w or path.startswith(w + "/") or w.startswith(path + "/") for w in words)


@pytest.mark.parametrize("address, cmd, data", INPUTS, ids=[s[0] for s in INPUTS])
def test_every_data_dep_is_a_path_the_cmd_names(address, cmd, data):
    """A stage reads only what its cmd names: a data dep the cmd does not pass is a default path hidden in the
    module (dvc.yaml and the module would both spell it)."""
    stage = address.rpartition(":")[2].partition("@")[0]
    hidden = [d for d in data if not _named(d, cmd) and (stage, d) not in INPUT_EXCEPTIONS]
    assert not hidden, f"{address} reads {hidden} without its cmd naming them (pass them as arguments)"


@pytest.mark.parametrize("address, cmd, outs", OUTPUTS, ids=[s[0] for s in OUTPUTS])
def test_every_output_is_a_path_the_cmd_names(address, cmd, outs):
    """Paths are declared once, in dvc.yaml: a stage writes only where its cmd says (the path, a folder above it, or
    for a folder output the files in it), never to a default hidden in the module."""
    hidden = [o for o in outs if not _named(o, cmd)]
    assert not hidden, f"{address} writes {hidden} without its cmd naming them (pass them as arguments)"
