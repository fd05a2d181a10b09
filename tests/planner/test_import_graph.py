"""The project's import graph: no circle among the modules of planner/ and runtime/, and planner/ never imports
runtime/ or torch. Every import statement counts, also those inside functions (a late import still ties the two
modules together); only those under `if TYPE_CHECKING:` (never run) are left out."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("planner", "runtime")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name `name`'s source imports (for `from X import Y`: X and X.Y, as Y may be a module)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project's modules it imports (a dotted name resolved to its longest known module prefix)."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        edges = set()
        for dotted in imported_names(name, path):
            parts = dotted.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in mods:
                    edges.add(".".join(parts[:i]))
                    break
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, a circle in each."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _describe(comps: list[list[str]], graph: dict[str, set[str]]) -> str:
    return "; ".join(" <-> ".join(c) + " (" + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
                     + ")" for c in comps)


def test_cycle_finder_finds_a_circle_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_count_and_type_checking_ones_do_not(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planner.plan import Plan\n"
                   "def f():\n    from planner.cost import evaluate\n    import runtime.train\n")
    names = imported_names("planner.m", src)
    assert "planner.cost" in names and "runtime.train" in names
    assert "planner.plan" not in names


def test_planner_modules_import_no_circle():
    graph = {k: {m for m in v if m.startswith("planner")} for k, v in import_graph().items() if k.startswith("planner")}
    found = cycles(graph)
    assert not found, f"import circles in planner/: {_describe(found, graph)}"


def test_runtime_and_planner_modules_import_no_circle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, f"import circles: {_describe(found, graph)}"


def test_planner_imports_neither_runtime_nor_torch():
    mods = _modules()
    bad = []
    for name, path in mods.items():
        if name.split(".")[0] != "planner":
            continue
        for dotted in imported_names(name, path):
            if dotted.split(".")[0] in ("runtime", "torch"):
                bad.append(f"{name} imports {dotted}")
    assert not bad, "; ".join(sorted(set(bad)))


def test_plan_is_on_top_no_module_imports_the_command_line():
    """planner/cli.py is the top of the graph: the subcommands take their argument helpers from planner.arguments."""
    graph = import_graph()
    importers = sorted(k for k, v in graph.items() if "planner.cli" in v and k not in ("planner.cli", "planner.__main__"))
    assert not importers, f"modules importing planner.cli: {', '.join(importers)}"
