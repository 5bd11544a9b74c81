"""No import cycle between the modules of services/ (issue 28).

Read from the source with `ast`, without importing anything: every import counts,
at module level, inside a function (a deferred import is still a dependency) and
under `if TYPE_CHECKING:` (a cycle of names is a cycle of design, even when Python
never runs it). Importing `a.b.c` also runs the packages `a.b` and `a` first, so
those are edges too, except where the importer is inside them (its own packages
have started already); importing one of them by name is an edge all the same.

Where a pluggable part has several implementations, the service's component.py
chooses and builds it: no package's `__init__.py` imports its own implementations.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module under `root/package`, by dotted name (namespace packages included:
    a folder without `__init__.py` is still a package)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imported(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The modules of `known` that importing `name` (at `path`) may run."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            targets.add(source)
            # `from package import module` imports the module; `from module import name`
            # only the module.
            targets.update(
                f"{source}.{alias.name}"
                for alias in node.names
                if f"{source}.{alias.name}" in known
            )
    own = set(_ancestors(name))
    edges: set[str] = set()
    for target in targets:
        # The packages on the way run first, except those the importer is inside.
        edges.update(p for p in _ancestors(target) if p in known and p not in own)
        if target in known:
            edges.add(target)
    edges.discard(name)
    return edges


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same tree it imports."""
    known = module_names(root, package)
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm,
    iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def a_path(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module, for the failure message."""
    members = set(component)
    start = component[0]
    trail = [start]
    seen = {start}
    while True:
        node = trail[-1]
        nexts = sorted(n for n in graph[node] if n in members)
        if start in nexts and len(trail) > 1:
            return [*trail, start]
        unseen = [n for n in nexts if n not in seen]
        if not unseen:
            # Every module of a component reaches the start; take the way back.
            back = _shortest(graph, node, start, members)
            return trail + back[1:]
        trail.append(unseen[0])
        seen.add(unseen[0])


def _shortest(
    graph: Mapping[str, Iterable[str]], src: str, dst: str, members: set[str]
) -> list[str]:
    previous: dict[str, str] = {}
    frontier = [src]
    while frontier:
        following = []
        for node in frontier:
            for n in sorted(graph[node]):
                if n in members and n not in previous and n != src:
                    previous[n] = node
                    following.append(n)
        if dst in previous:
            break
        frontier = following
    path = [dst]
    while path[-1] != src:
        path.append(previous[path[-1]])
    return path[::-1]


def test_the_checker_finds_a_cycle_through_a_deferred_import(tmp_path: Path) -> None:
    """The two known shapes of issue 28: a factory importing its implementation inside a
    function while the implementation imports the factory's module; and a package's
    `__init__.py` importing a back-end that imports the package."""
    pkg = tmp_path / "pkg"
    (pkg / "index").mkdir(parents=True)
    (pkg / "embeddings.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.openai_embeddings import E\n"
        "def make():\n    from pkg.openai_embeddings import E\n    return E()\n"
    )
    (pkg / "openai_embeddings.py").write_text("from pkg.embeddings import make\nclass E: ...\n")
    (pkg / "index" / "__init__.py").write_text(
        "def make_index():\n    from pkg.index.edge import Edge\n    return Edge()\n"
    )
    (pkg / "index" / "edge.py").write_text("from pkg.index import make_index\nclass Edge: ...\n")
    (pkg / "fine.py").write_text("from pkg.index import edge\nfrom . import embeddings\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.fine"] == {"pkg.index", "pkg.index.edge", "pkg.embeddings"}
    assert cycles(graph) == [
        ["pkg.embeddings", "pkg.openai_embeddings"],
        ["pkg.index", "pkg.index.edge"],
    ]
    assert a_path(graph, ["pkg.index", "pkg.index.edge"]) == [
        "pkg.index",
        "pkg.index.edge",
        "pkg.index",
    ]


def test_no_import_cycle_in_services() -> None:
    graph = import_graph(ROOT, "services")
    found = [" -> ".join(a_path(graph, c)) for c in cycles(graph)]
    assert found == [], "import cycles (break them: see this module's docstring)"
