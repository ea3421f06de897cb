"""The layout of ``eval/``: libraries, thin command lines, one table renderer (read statically with ``ast``).

- the modules of ``eval/`` import each other without a cycle;
- no module of ``eval/`` imports a command-line module (:data:`CLI_MODULES`);
- only command-line modules and the report modules with a small command-line front import ``argparse``;
- every markdown table of ``eval/`` and ``pipelines/`` is rendered by ``ooospec/reporting.md_table`` (a literal table
  separator such as ``|---|`` appears nowhere else, except in :data:`TABLE_EXCEPTIONS`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "eval"
PACKAGE = "ooospec.eval"

# command lines and stage entry points: flags, printing, writing files; nothing in eval/ imports them
CLI_MODULES = {"bench.cli", "agent.cli", "transfer.stage", "sidecar.report", "sidecar.compare", "substrate.cli",
               "bench.hint_replay", "vllm.bench", "sidecar.engines", "vllm.load", "sidecar.own_calls", "vllm.substrate",
               "vllm.numerics", "vllm.matrix", "vllm.load_probe"}
# report modules whose job is rendering (others import them) and which also carry a small command-line front
REPORT_MODULES_WITH_CLI = {"bench.report", "transfer.report", "vllm.report", "sidecar.own_calls_report",
                           "substrate.roofline", "substrate.quantized", "substrate.call_quality", "vllm.headline"}
# hand-written markdown tables left as they are, by (file, top-level definition): why each is not md_table's
TABLE_EXCEPTIONS = {
    ("pipelines/export_adapter.py", "DATA_LICENSES"): "static license text, copied verbatim into the model card",
    ("pipelines/export_adapter.py", "eval_section"): "its empty cells are written `| |`; md_table would write "
                                                     "`|  |` and change the published model card",
}
TABLE_SEPARATOR = re.compile(r"\|\s*:?-{3,}:?\s*\||-{3,}:?\|")


def eval_modules() -> dict[str, ast.Module]:
    """``{name: tree}`` for every module of ``eval/``, named from ``eval/`` (``bench.harness``, ``environment``)."""
    return {".".join(p.relative_to(EVAL).with_suffix("").parts): ast.parse(p.read_text(encoding="utf-8"),
                                                                          filename=str(p))
            for p in sorted(EVAL.rglob("*.py")) if p.name not in {"__init__.py", "__main__.py"}}


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement (inside functions too), except those under ``if TYPE_CHECKING:``."""
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for stmt in node.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skipped]


def eval_imports(tree: ast.Module, known: set[str]) -> set[str]:
    """The ``eval/`` modules one module imports, named from ``eval/`` (``from ooospec.eval.bench import harness``,
    ``from ooospec.eval.bench.data import x``, ``import ooospec.eval.environment``)."""
    out = set()
    for node in _runtime_imports(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif node.level:
            raise AssertionError(f"relative import in eval/ (line {node.lineno}); use ooospec.eval.*")
        else:
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            rest = n.removeprefix(PACKAGE + ".")
            if n.startswith(PACKAGE + ".") and rest in known:
                out.add(rest)
    return out


def imports_argparse(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == "argparse" for a in n.names)
               or isinstance(n, ast.ImportFrom) and n.module == "argparse" for n in _runtime_imports(tree))


def import_graph() -> dict[str, set[str]]:
    trees = eval_modules()
    return {name: eval_imports(tree, set(trees)) - {name} for name, tree in trees.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, a]``), or None."""
    state: dict[str, int] = {}   # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def table_literals(path: Path) -> list[tuple[str, int]]:
    """``(top-level definition, line)`` of every string literal in ``path`` that holds a table separator."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owner = top.name
        elif isinstance(top, ast.Assign) and isinstance(top.targets[0], ast.Name):
            owner = top.targets[0].id
        elif isinstance(top, ast.AnnAssign) and isinstance(top.target, ast.Name):
            owner = top.target.id
        else:
            owner = f"<line {top.lineno}>"
        for node in ast.walk(top):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and TABLE_SEPARATOR.search(node.value):
                out.append((owner, node.lineno))
    return out


# --------------------------------------------------------------------------------------------- the helpers


def test_find_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_table_separators_are_recognised(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('X = "| a |\\n|---|---:|"\ndef f():\n    return "|" + "---|" * 3\nY = "a --- b | c"\n')
    assert table_literals(path) == [("X", 1), ("f", 3)]


# --------------------------------------------------------------------------------------------- eval/


def test_every_eval_module_is_classified_and_exists():
    names = set(eval_modules())
    assert CLI_MODULES | REPORT_MODULES_WITH_CLI <= names
    assert {"bench.harness", "bench.method_api", "bench.ooospec_method"} <= names


def test_eval_modules_import_each_other_without_a_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle among eval/ modules: {' -> '.join(cycle)}"


def test_no_eval_module_imports_a_command_line_module():
    bad = {name: sorted(deps & CLI_MODULES) for name, deps in import_graph().items() if deps & CLI_MODULES}
    assert not bad, f"eval/ modules import command-line modules (move what they need into a library): {bad}"


def test_only_command_lines_import_argparse():
    users = {name for name, tree in eval_modules().items() if imports_argparse(tree)}
    libraries = users - CLI_MODULES - REPORT_MODULES_WITH_CLI
    assert not libraries, (f"library modules of eval/ import argparse: {sorted(libraries)}; take typed arguments "
                           "(a dataclass) and leave the flags to the command line")


def test_the_harness_is_a_library():
    graph = import_graph()
    assert "bench.harness" in graph["bench.cli"] and "bench.report" in graph["bench.cli"]
    assert not graph["bench.harness"] & (CLI_MODULES | REPORT_MODULES_WITH_CLI)


def test_markdown_tables_go_through_md_table():
    files = sorted(EVAL.rglob("*.py")) + sorted((ROOT / "pipelines").rglob("*.py"))
    found = {(p.relative_to(ROOT).as_posix(), owner): line for p in files for owner, line in table_literals(p)}
    unexpected = {f"{f}:{line} ({owner})" for (f, owner), line in found.items() if (f, owner) not in TABLE_EXCEPTIONS}
    assert not unexpected, ("hand-written markdown tables; render them with ooospec.reporting.md_table: "
                            + ", ".join(sorted(unexpected)))
    stale = set(TABLE_EXCEPTIONS) - set(found)
    assert not stale, f"TABLE_EXCEPTIONS names tables that are gone: {sorted(stale)}"


# --------------------------------------------------------------------------------------------- eval/reports/

MAX_TOPIC_REPORTS = 5


def test_reports_are_the_transfer_headline_and_a_few_topics():
    """``eval/reports/`` holds the transfer report and at most :data:`MAX_TOPIC_REPORTS` topic folders; each opens
    with a README whose first block (after its title) is the command that regenerates it."""
    folders = sorted(p for p in (ROOT / "eval" / "reports").iterdir() if p.is_dir())
    names = {p.name for p in folders}
    assert "transfer" in names and len(names - {"transfer"}) <= MAX_TOPIC_REPORTS, sorted(names)
    for folder in folders:
        readme = folder / "README.md"
        assert readme.is_file(), f"{folder.relative_to(ROOT)}: no README.md"
        lines = [line for line in readme.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert lines[0].startswith("# ") and lines[1].startswith("```bash"), (
            f"{readme.relative_to(ROOT)}: the title, then the command that regenerates it")
