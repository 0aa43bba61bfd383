"""The repo's own modules import each other as a DAG: no cycle through any `import x` / `from x import y`
that names a module of common, speech, vocoder, tts, vae or bench, at module level or inside a function (a deferred
import hides a cycle from Python, not from the design). Read with `ast`, nothing is imported; imports made
by name at run time (`importlib.import_module`) are not seen."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "speech", "vocoder", "tts", "vae", "bench")


def repo_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """dotted module name -> file, for every .py under the packages (a package is its __init__.py)."""
    mods = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The repo module an imported dotted name lands in (its longest prefix that is one), or None."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported repo module, line, inside a function) for every import statement of one file."""
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                targets = [_resolve(a.name, mods) for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: from the package, up level - 1 packages
                    base = module.split(".") if is_pkg else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    source = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    source = child.module or ""
                # `from pkg import sub` imports the submodule pkg.sub when there is one, else a name of pkg
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else _resolve(source, mods)
                           for a in child.names]
            else:
                targets = []
            out.extend((t, child.lineno, in_function) for t in targets if t and t != module)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return out


def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES,
                 functions: bool = True) -> dict[str, dict[str, str]]:
    """module -> {imported module: 'file:line' of the first such import}; ``functions=False`` keeps
    only the imports that run when the module is imported."""
    mods = repo_modules(root, packages)
    graph: dict[str, dict[str, str]] = {m: {} for m in mods}
    for module, path in mods.items():
        for target, line, in_function in imports_of(module, path, mods):
            if functions or not in_function:
                where = f"{path.relative_to(root)}:{line}" + (" (in a function)" if in_function else "")
                graph[module].setdefault(target, where)
    return graph


def find_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as the path
    [a, b, ..., a] through its imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in components:  # a shortest way back to the first module, inside the component (BFS)
        start = min(comp)
        parent: dict[str, str] = {}
        frontier, end = [start], None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        end = v
                        break
                    if w in comp and w not in parent:
                        parent[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [end]
        while path[-1] != start:
            path.append(parent[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


def describe(cycle: list[str], graph: dict[str, dict[str, str]]) -> str:
    return " -> ".join(f"{a} [{graph[a][b]}]" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_the_repo_imports_form_a_dag():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


def test_the_module_level_imports_form_a_dag():  # the cycles Python itself would trip over
    graph = import_graph(functions=False)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


def test_the_learning_benchmark_and_its_reference_comparisons_import_no_cycle():
    """The cycle this test was written for: learning -> vits_reference -> learning (and through
    reference_checks). What they share lives in bench.learning_base, which imports no other bench module."""
    graph = import_graph()
    three = ("bench.learning", "bench.reference_checks", "bench.vits_reference")
    sub = {m: {t: w for t, w in graph[m].items() if t in three} for m in three}
    assert not find_cycles(sub), "\n".join(describe(c, sub) for c in find_cycles(sub))
    assert not [t for t in graph["bench.learning_base"] if t.startswith("bench")]
    assert "bench.learning" not in graph["bench.vits_reference"]
    assert "bench.learning" not in graph["bench.reference_checks"]


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import os\nfrom pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from .. import b\n    return b\n")
    (pkg / "b.py").write_text("class K:\n    import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a, b\n")  # imports into the cycle, not part of it
    graph = import_graph(tmp_path, ("pkg",))
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.c", "pkg.b", "pkg.a"]]
    assert "pkg/sub/c.py:2 (in a function)" in describe(find_cycles(graph)[0], graph)
    assert find_cycles(import_graph(tmp_path, ("pkg",), functions=False)) == []
