"""The floors of the house: every import in `rediacc_core` runs to its own floor or one below, and no
import closes a circle.

Each module has a floor (`FLOORS`, the most specific dotted prefix wins). An import of a higher
floor fails, and so does any circle of imports, whatever floors it spans. Imports inside functions
count like any other (a late import is for start-up time, never to hide a loop); imports under
`if TYPE_CHECKING:` do not (they are read by the type checker only). A name taken from a package's
lazy public face (`from rediacc_core import Machine`) counts as an import of the module that holds
it. README's layout section draws the same floors.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "rediacc_core"

# Lowest first. A room may import its own floor and the floors below it.
FLOORS: dict[str, int] = {
    # 0 the ground: leaf modules every floor may use
    **dict.fromkeys(
        (
            "errors", "files", "statelock", "unixhttp", "hostpaths", "machine", "model", "cdi",
            "placement", "remote.address", "leases", "config", "pids", "blocking", "values",
            "publishing", "kernlog", "bindings",
        ),
        0,
    ),
    # 1 the contract: hooks, the plugin manager, the public face
    "": 1, "hookspecs": 1, "plugins": 1,
    # 2 the gate's record-free parts: Go-exact decoding, policy, HTTP framing, the audit trail
    "gate.wire": 2, "gate.policy": 2, "gate.http": 2, "gate.audit": 2,
    # 3 the machine's records and how they change
    "repos": 3, "grants": 3, "settings": 3, "inventory": 3, "setup": 3, "health": 3, "telemetry": 3,
    "recheck": 3, "spec_facts": 3, "slurm.gres": 3, "slurm.access": 3, "slurm.client": 3,
    # 4 the gate's engine: what it asks the daemon, its decisions, the asyncio glue
    "gate": 4,
    # 5 a repo's running parts
    "runtime": 5,
    # 6 other machines
    "remote": 6,
    # 6 Slurm's hooks and reconciler: they grant and revoke with --stop (the running parts)
    "slurm": 6,
    # 7 the faces and composition roots
    "cli": 7, "launcher": 7, "demo": 7, "testing": 7,
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(module: str) -> int | None:
    name = module.removeprefix("rediacc_core").removeprefix(".")
    if not name:
        return FLOORS[""]
    while name:
        if name in FLOORS:
            return FLOORS[name]
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_in(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those only the type checker reads."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for other in node.orelse:
                yield from imports_in(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from imports_in(node)


def lazy_names(package: str) -> dict[str, str]:
    """A package's public names made on first use (PEP 562), by the module that holds each: the
    imports under its `if TYPE_CHECKING:` say where they come from."""
    path = MODULES[package]
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module in MODULES:
                    found.update({alias.asname or alias.name: inner.module for alias in inner.names})
    return found


LAZY = {name: lazy_names(name) for name, path in MODULES.items() if path.name == "__init__.py"}


def imported_by(module: str, source: str | None = None) -> dict[str, int]:
    """The core modules `module` imports (or `source`, read as if it were `module`), each with the
    line of its first import."""
    path = MODULES.get(module)
    text = source if source is not None else path.read_text() if path else ""
    package = module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in imports_in(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = []
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    targets.append(full)
                else:
                    targets.append(LAZY.get(base, {}).get(alias.name, base))
        for target in targets:
            if target.split(".")[0] == "rediacc_core" and target != module:
                found.setdefault(target, node.lineno)
    if module == "rediacc_core":
        # The public face's own lazy names are imported by `__getattr__` through importlib.
        found.update({target: 0 for target in LAZY["rediacc_core"].values()})
    return found


GRAPH = {module: imported_by(module) for module in MODULES}


def climbing() -> set[tuple[str, str]]:
    found = set()
    for module, targets in GRAPH.items():
        here = floor_of(module)
        for target in targets:
            there = floor_of(target)
            if here is not None and there is not None and there > here:
                found.add((module, target))
    return found


def cycles() -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH.get(node, {}):
            if target not in GRAPH:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


# --- the house ---------------------------------------------------------------------------------------


def test_every_module_has_a_floor() -> None:
    assert [m for m in MODULES if floor_of(m) is None] == []


def test_no_import_climbs_a_floor() -> None:
    found = sorted(climbing())
    report = [
        f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)}), line {GRAPH[a][b]}" for a, b in found
    ]
    assert report == [], "move the shared piece down, or hand it in from the caller"


def test_no_import_closes_a_circle() -> None:
    left = [" -> ".join(c) for c in cycles()]
    assert left == [], "break each circle: move the shared piece down, or hand it in from the caller"


def test_gate_shows_its_parts_as_rooms() -> None:
    rooms = {p.name for p in (PACKAGE / "gate").iterdir() if (p / "__init__.py").exists()}
    assert rooms >= {"wire", "policy", "http", "audit", "buildkit"}


# --- the walk itself -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from rediacc_core.errors import RdcError", {"rediacc_core.errors"}),
        ("import rediacc_core.files", {"rediacc_core.files"}),
        ("from rediacc_core.gate.policy import rules", {"rediacc_core.gate.policy.rules"}),
        ("def f():\n    from rediacc_core import grants", {"rediacc_core.grants"}),
        ("class C:\n    def f(self):\n        if x:\n            import rediacc_core.repos",
         {"rediacc_core.repos"}),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rediacc_core import grants", set()),
        ("import typing\nif typing.TYPE_CHECKING:\n    import rediacc_core.grants\n"
         "else:\n    import rediacc_core.repos", {"rediacc_core.repos"}),
        ("from rediacc_core import Machine, Inventory", {"rediacc_core.machine", "rediacc_core.model"}),
        ("from rediacc_core.cdi import parse_qualified_name", {"rediacc_core.cdi.names"}),
        ("from . import metrics", {"rediacc_core.gate.audit.metrics"}),
        ("from .metrics import Counters", {"rediacc_core.gate.audit.metrics"}),
        ("import json\nfrom pathlib import Path", set()),
    ],
)  # fmt: skip
def test_the_walk_sees_every_import_but_the_type_checkers(source: str, expected: set[str]) -> None:
    assert set(imported_by("rediacc_core.gate.audit.log", source)) == expected


def test_floors_go_by_the_most_specific_room() -> None:
    assert floor_of("rediacc_core.gate.policy.rules") == 2
    assert floor_of("rediacc_core.gate.decide") == 4
    assert floor_of("rediacc_core.remote.address") == 0
    assert floor_of("rediacc_core.remote.dispatch") == 6
    assert floor_of("rediacc_core") == 1
    assert floor_of("rediacc_core.nowhere") is None
