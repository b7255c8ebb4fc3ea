"""The layers run one way, scripts -> recipe -> sam, mtp, and no module imports itself back through others: read from
the sources with ``ast`` (every import, at module level or inside a function), so a lazy import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = {"scripts": 2, "recipe": 1, "sam": 0, "mtp": 0}  # a module may import only from layers below or its own


def modules() -> dict[str, Path]:
    found = {}
    for top in LAYERS:
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a.b import c`` names a.b.c where that is a module)."""
    known = modules()

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets |= {owner(f"{base}.{alias.name}") or owner(base) for alias in node.names}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def test_the_graph_is_read_from_real_imports():
    graph = import_graph()
    assert {"recipe.dapo.rollout", "recipe.dapo.batch", "mtp.checkpoint"} <= graph["recipe.dapo.trainer"]
    assert "sam.automaton" in graph["sam.policy"]  # sam/ inside its own layer


def test_no_module_imports_a_layer_above_its_own():
    upward = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in targets
        if LAYERS[target.split(".")[0]] > LAYERS[module.split(".")[0]]
        or (LAYERS[module.split(".")[0]] == 0 and target.split(".")[0] != module.split(".")[0])
    ]
    assert not upward, upward


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("top", sorted(LAYERS))
def test_no_import_circles(top):
    assert not [c for c in cycles(import_graph()) if any(m.split(".")[0] == top for m in c)]
