"""The import graph of broker/, policies/, workers/ and providers/, read from the source.

Every ``import`` and ``from ... import`` counts, at module level and inside functions alike (a
lazy import is still a dependency; it only hides a cycle until the function runs). Imports
under ``if TYPE_CHECKING:`` are kept for the layering rules but left out of the cycle check:
they never execute. Run as a script to print the graph's cycles and the rules' offenders:

    python -m tests.unit.test_imports
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "policies", "workers", "providers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the four packages: dotted name -> source file."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import node, anywhere in the tree, with whether it sits under TYPE_CHECKING."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, typing_only = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, typing_only
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack += [(child, True) for child in node.body]
            stack += [(child, typing_only) for child in node.orelse]
            continue
        stack += [(child, typing_only) for child in ast.iter_child_nodes(node)]


def _resolve(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The project modules an import statement names (``from pkg import sub`` names pkg.sub
    when sub is a module, else pkg itself)."""
    known = modules()
    if isinstance(node, ast.Import):
        targets = {a.name for a in node.names}
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        targets = set()
        for alias in node.names:
            sub = f"{base}.{alias.name}" if base else alias.name
            targets.add(sub if sub in known else base)
    out = set()
    for target in targets:
        # ``import broker.store.base`` names broker.store.base; an unknown tail (a name inside a
        # module) falls back to the longest known prefix.
        parts = target.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts:
            out.add(".".join(parts))
    out.discard(module)
    return out


@cache
def graph(include_typing: bool = False) -> dict[str, frozenset[str]]:
    """module -> the project modules it imports."""
    out: dict[str, frozenset[str]] = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node, typing_only in _imports(tree):
            if typing_only and not include_typing:
                continue
            edges |= _resolve(name, path.name == "__init__.py", node)
        out[name] = frozenset(edges)
    return out


def cycles(g: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
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
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(g):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def offenders(importers: Iterable[str], forbidden: Iterable[str]) -> dict[str, list[str]]:
    """Direct imports from modules under ``importers`` of modules under ``forbidden``."""
    importers, forbidden = tuple(importers), tuple(forbidden)
    g = graph(include_typing=True)
    out = {}
    for module in sorted(g):
        if _under(module, importers):
            bad = sorted(t for t in g[module] if _under(t, forbidden))
            if bad:
                out[module] = bad
    return out


# Each rule: (name, importers, forbidden).
RULES = {
    "workers": (("workers",), ("broker.control", "broker.cycle", "broker.cloud", "broker.money",
                               "broker.sim", "broker.bench", "policies")),
    "client": (("broker.client",), ("broker.cycle.actuator", "broker.cycle.scheduler",
                                    "broker.control", "policies")),
    "commands": (("broker.bus.commands",), ("broker.bus.runtime", "broker.control",
                                            "broker.cycle", "broker.store", "broker.cloud",
                                            "policies", "workers")),
    "vocabulary": (("broker.store", "broker.model", "broker.config"), ("policies",)),
    "policies": (("policies",), ("broker.store", "broker.cycle.actuator", "broker.control",
                                 "broker.cloud", "providers")),
}


# -- tests ----------------------------------------------------------------------------------


def test_the_graph_sees_every_kind_of_import() -> None:
    g = graph()
    assert "broker.store.base" in g["broker.store"]  # from broker.store.base import ...
    assert "broker.model" in g["broker.store.transitions"]
    assert len(modules()) > 40


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_workers_import_no_control_scheduler_actuator_or_policies() -> None:
    assert offenders(*RULES["workers"]) == {}


def test_the_client_imports_no_actuator_control_scheduler_or_policies() -> None:
    assert offenders(*RULES["client"]) == {}


def test_commands_import_only_celery_and_the_app() -> None:
    assert offenders(*RULES["commands"]) == {}


def test_store_model_and_config_import_nothing_from_policies() -> None:
    assert offenders(*RULES["vocabulary"]) == {}


def test_policies_import_no_store_actuator_or_providers() -> None:
    assert offenders(*RULES["policies"]) == {}


if __name__ == "__main__":
    for comp in cycles(graph()):
        print("cycle:", " ".join(comp))
        for m in comp:
            print(f"  {m} -> {', '.join(sorted(t for t in graph()[m] if t in comp))}")
    for rule, (importers, forbidden) in RULES.items():
        for module, bad in offenders(importers, forbidden).items():
            print(f"rule {rule}: {module} imports {', '.join(bad)}")
