"""Architecture checks on meshrt's import graph (standard library `ast` only).

The graph has one node per module under `meshrt/` (a package's `__init__.py`
is the package's module) and an edge for every import of another meshrt
module anywhere in the file: at module level, inside functions and methods,
in `try` blocks. Only imports under `if TYPE_CHECKING:` are left out: they
never run, they name types for annotations. `from pkg import name` points at
`pkg.name` when that is a module and at `pkg` otherwise; relative imports are
resolved. Importing a module is not counted as importing its parent
packages (their `__init__` runs first, but that is no dependency of theirs).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "meshrt"


def module_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of the dotted `name` that is a meshrt module."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in modules:
            return cand
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except the bodies of `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            todo.append(node.test)
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """meshrt module -> first line that imports it, for the module `name` at `path`."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: dict[str, int] = {}

    def add(target: str | None, line: int) -> None:
        if target is not None:
            out[target] = min(line, out.get(target, line))

    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_known(alias.name, modules), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = name.split(".") if is_pkg else name.split(".")[:-1]
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else _known(base, modules), node.lineno)
    return out


@functools.cache
def import_graph() -> dict[str, dict[str, int]]:
    """Module -> the meshrt modules it imports, each with its first line (do not mutate)."""
    modules = module_files()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components in discovery order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(sorted(comp))
    return comps


def _cycle_in(comp: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """One import cycle through the first module of a strongly connected component."""
    members = set(comp)
    start = comp[0]
    # breadth-first search back to start, inside the component
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])
    ) + f" -> {cycle[-1]}"


def _cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    problems = []
    for name, deps in graph.items():
        if name in deps:
            problems.append(f"{name} imports itself (line {deps[name]})")
    for comp in strongly_connected(graph):
        if len(comp) > 1:
            problems.append(
                f"import cycle among {', '.join(comp)}: {_describe(_cycle_in(comp, graph), graph)}"
            )
    return problems


def _is_tools(name: str) -> bool:
    return name == "meshrt.tools" or name.startswith("meshrt.tools.")


def test_no_import_cycles_outside_tools():
    """No import circle among the modules outside meshrt.tools (the graph without it)."""
    graph = {
        name: {d: line for d, line in deps.items() if not _is_tools(d)}
        for name, deps in import_graph().items()
        if not _is_tools(name)
    }
    problems = _cycles(graph)
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    """No module imports itself and no set of modules imports each other in a circle."""
    problems = _cycles(import_graph())
    assert not problems, "\n".join(problems)


def test_only_tools_import_tools():
    """Only the console entry points (meshrt.tools) may import meshrt.tools."""
    graph = import_graph()
    bad = [
        f"{name} imports {dep} (line {line})"
        for name, deps in graph.items()
        if not _is_tools(name)
        for dep, line in deps.items()
        if _is_tools(dep)
    ]
    assert not bad, "\n".join(bad)


def test_graph_resolves_imports():
    """The scan itself: known edges of the tree are found, typing-only ones are not."""
    graph = import_graph()
    assert "meshrt.analysis.liveness" in graph["meshrt.passes.color_routes"]
    assert "meshrt.passes" in graph["meshrt.universe"]  # `from meshrt.passes import get_all_passes`
    assert "meshrt.backend.csl.streams" in graph["meshrt.backend.csl.alloc"]  # in a function
    assert "meshrt.backend.csl.program" not in graph["meshrt.backend.csl.kernels"]  # TYPE_CHECKING
