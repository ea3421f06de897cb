"""The layout of the package, read statically with ``ast`` (imports inside functions count; ``if TYPE_CHECKING:``
blocks do not):

- folders: ``runtime/`` imports neither ``pipelines/`` nor ``eval/``; ``pipelines/`` does not import ``eval/``;
- ``runtime/`` has no import cycle, keeps at most :data:`MAX_TOP_LEVEL` modules at its top, and each of its rooms
  (subpackages) opens with a docstring and imports only what :data:`ROOM_MAY_NOT_IMPORT` allows;
- ``eval/`` likewise: at most :data:`MAX_TOP_LEVEL` modules at its top, rooms with docstrings saying what they may
  import, and :data:`EVAL_ROOM_MAY_NOT_IMPORT` holds;
- the house limits: no module over :data:`MAX_MODULE_LINES` lines, no function over :data:`MAX_FUNCTION_LINES`;
- ``runtime/methods.py`` is the method table only: it imports no other runtime module;
- the engines read a drafter's members, never ``getattr`` / ``hasattr`` (the contract is
  :class:`~ooospec.runtime.drafters.base.Drafter`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"runtime": "ooospec.runtime", "pipelines": "ooospec.pipelines", "eval": "ooospec.eval"}
FOLDER_MAY_NOT_IMPORT = {"runtime": ("ooospec.pipelines", "ooospec.eval"), "pipelines": ("ooospec.eval",)}
MAX_TOP_LEVEL = 15
# room -> the runtime rooms and top-level modules it must not import (at run time)
ROOM_MAY_NOT_IMPORT = {
    "formats": ("drafters", "backends", "sidecar", "agent", "serve", "vllm", "engine", "budget", "decoding"),
    "drafters": ("backends", "sidecar", "agent", "serve", "vllm", "engine", "budget", "decoding"),
    "backends": ("drafters", "sidecar", "agent", "serve", "vllm", "engine", "budget", "decoding"),
    "sidecar": ("agent", "serve", "vllm"),
    "agent": ("serve", "vllm"),
    "vllm": ("serve", "agent"),
}
# eval room -> the eval rooms it must not import: ``bench`` is the floor, ``transfer`` the headline
EVAL_ROOM_MAY_NOT_IMPORT = {
    "bench": ("agent", "vllm", "transfer", "sidecar", "substrate"),
    "vllm": ("agent", "transfer", "sidecar", "substrate"),
    "substrate": ("agent", "vllm", "transfer", "sidecar"),
    "transfer": ("agent", "vllm", "sidecar", "substrate"),
    "agent": ("transfer", "sidecar", "substrate"),
    "sidecar": ("agent", "vllm", "substrate"),
}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
DRAFTER_READERS = ("runtime/engine.py", "runtime/budget.py", "runtime/decoding.py", "runtime/vllm/proposer.py",
                   "runtime/vllm/chain.py")


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join([FOLDERS[folder], *rest])
    return name.removesuffix(".__init__")


def run_time_imports(tree: ast.Module) -> set[str]:
    """Every module a file imports at run time: ``import a.b``, ``from a import b`` (as ``a.b`` and ``a``)."""
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert not node.level, f"relative import of {node.module} (line {node.lineno})"
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    return {module_name(p): run_time_imports(ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
            for folder in FOLDERS for p in files(folder)}


def test_folders_import_downward_only(imports):
    bad = [(m, i) for m, names in imports.items() for folder, banned in FOLDER_MAY_NOT_IMPORT.items()
           if m.startswith(FOLDERS[folder]) for i in names if i.startswith(banned)]
    assert not bad, f"upward imports: {bad}"


def test_runtime_has_no_import_cycle(imports):
    modules = {m for m in imports if m.startswith("ooospec.runtime")}
    graph = {m: {i for i in imports[m] if i in modules and i != m and not m.startswith(i + ".")} for m in modules}
    # a package's __init__ is imported on the way to its modules: only edges to modules count
    graph = {m: {i for i in deps if not (ROOT / "runtime" / Path(*i.split(".")[2:]) / "__init__.py").is_file()}
             for m, deps in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_runtime_rooms_say_what_they_may_import():
    rooms = sorted(p.parent.name for p in (ROOT / "runtime").glob("*/__init__.py"))
    assert set(ROOM_MAY_NOT_IMPORT) <= set(rooms) | {"formats"}
    for room in rooms:
        doc = ast.get_docstring(ast.parse((ROOT / "runtime" / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"runtime/{room}/__init__.py: a docstring saying what it may import"


@pytest.mark.parametrize("room", sorted(ROOM_MAY_NOT_IMPORT))
def test_each_room_imports_what_its_docstring_allows(imports, room):
    prefix = f"ooospec.runtime.{room}"
    banned = tuple(f"ooospec.runtime.{b}" for b in ROOM_MAY_NOT_IMPORT[room])
    bad = [(m, i) for m, names in imports.items() if m == prefix or m.startswith(prefix + ".")
           for i in names if i in banned or i.startswith(tuple(b + "." for b in banned))]
    assert not bad, f"runtime/{room} imports what it may not: {bad}"


def test_the_method_table_imports_no_runtime_module(imports):
    light = {"ooospec.runtime.backends", "ooospec.runtime.backends.ENGINE_BACKENDS"}   # a constant of the package
    assert not {i for i in imports["ooospec.runtime.methods"] if i.startswith("ooospec.")} - light


@pytest.mark.parametrize("path", DRAFTER_READERS)
def test_engines_read_drafter_members_not_getattr(path):
    tree = ast.parse((ROOT / path).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("getattr", "hasattr") and n.args and "drafter" in ast.unparse(n.args[0]).lower()]
    assert not calls, f"{path}: {[ast.unparse(c) for c in calls]}"


@pytest.mark.parametrize("folder", ["runtime", "eval"])
def test_folder_is_rooms_not_one_floor(folder):
    top = sorted(p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules at {folder}/'s top: {top}"


@pytest.mark.parametrize("room", sorted(EVAL_ROOM_MAY_NOT_IMPORT))
def test_each_eval_room_imports_what_its_docstring_allows(imports, room):
    doc = ast.get_docstring(ast.parse((ROOT / "eval" / room / "__init__.py").read_text()))
    assert doc and "May import" in doc, f"eval/{room}/__init__.py: a docstring saying what it may import"
    prefix = f"ooospec.eval.{room}"
    banned = tuple(f"ooospec.eval.{b}" for b in EVAL_ROOM_MAY_NOT_IMPORT[room])
    bad = [(m, i) for m, names in imports.items() if m == prefix or m.startswith(prefix + ".")
           for i in names if i in banned or i.startswith(tuple(b + "." for b in banned))]
    assert not bad, f"eval/{room} imports what it may not: {bad}"


def test_every_eval_room_has_rules():
    rooms = {p.parent.name for p in (ROOT / "eval").glob("*/__init__.py")}
    assert rooms == set(EVAL_ROOM_MAY_NOT_IMPORT), f"rooms vs rules: {sorted(rooms ^ set(EVAL_ROOM_MAY_NOT_IMPORT))}"


def test_modules_and_functions_stay_small():
    """No module over :data:`MAX_MODULE_LINES` lines, no function over :data:`MAX_FUNCTION_LINES` (the house limits;
    a function is counted from its ``def`` to its last line)."""
    big, long_functions = [], []
    for folder in (*FOLDERS, "ooospec"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            name = path.relative_to(ROOT).as_posix()
            if (lines := text.count("\n")) > MAX_MODULE_LINES:
                big.append(f"{name} ({lines} lines)")
            long_functions += [f"{name}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
                               for n in ast.walk(ast.parse(text))
                               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                               and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not big and not long_functions, f"modules too long: {big}; functions too long: {long_functions}"
