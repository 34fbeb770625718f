"""The floors of the house: every import in `rediacc_core` runs to its own floor or one below, and no
import closes a circle.

Each module has a floor (`FLOORS`, the most specific dotted prefix wins). An import of a higher
floor fails, and so does any circle of imports, whatever floors it spans. Every import counts:
one inside a function (a late import is for start-up time, never to hide a loop, and their number
may not grow), one under `if TYPE_CHECKING:` (a type a lower floor names lives on that floor), and
one by name in a string: a "module:attr" or "module" string (the CLI's lazy command maps), an
f-string that begins "module:", and an `importlib.import_module` literal. An `import_module` of a
computed name fails unless `DYNAMIC` says why its targets are held anyway. A name taken from a
package's lazy public face (`from rediacc_core import Machine`) counts as an import of the module
that holds it. README's layout section draws the same floors.
"""

from __future__ import annotations

import ast
import re
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
            "commands", "remote.address", "leases", "config", "pids", "blocking", "values",
            "publishing", "kernlog", "bindings", "setting",
        ),
        0,
    ),
    # 1 the contract: hooks, the plugin manager, the public face
    "": 1, "hookspecs": 1, "plugins": 1,
    # 2 the gate's record-free parts: Go-exact decoding, policy, HTTP framing, the audit trail
    "gate.wire": 2, "gate.policy": 2, "gate.decision": 2, "gate.http": 2, "gate.audit": 2,
    # 3 the machine's records and how they change
    "repos": 3, "holders": 3, "grants": 3, "settings": 3, "inventory": 3, "setup": 3, "health": 3,
    "telemetry": 3, "recheck": 3, "spec_facts": 3, "slurm.gres": 3, "slurm.access": 3, "slurm.client": 3,
    "slurm.node": 3,
    # settings declared beside the rooms that read the settings file, on its reader's floor
    "telemetry_settings": 3, "runtime.settings": 3,
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


def imports_in(tree: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement at any depth, each with whether only the type checker reads it."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for inner in node.body:
                yield from imports_in(ast.Module(body=[inner], type_ignores=[]), True)
            for other in node.orelse:
                yield from imports_in(ast.Module(body=[other], type_ignores=[]), type_only)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_only
        yield from imports_in(node, type_only)


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

# A string that names a module of the core, alone or with an attribute ("rediacc_core.cli.repo:repo").
IMPORT_STRING = re.compile(r"rediacc_core((\.\w+)+(:\w+)?|:\w+)")
# The head of an f-string that names one ("rediacc_core.cli.repo_lease:{name}").
IMPORT_HEAD = re.compile(r"(rediacc_core(\.\w+)*):")

# `importlib.import_module` calls whose argument is not a literal, each with why its targets are
# still held to the floors. Any other such call fails the test: name the module in a literal.
DYNAMIC: dict[tuple[str, str], str] = {
    ("rediacc_core", "_ELSEWHERE[name]"): "the public face's lazy names: its TYPE_CHECKING imports "
    "say where each lives, and they count as imports",
    ("rediacc_core.cdi", "f'{__name__}.{module}'"): "the package's lazy names, likewise declared "
    "by its TYPE_CHECKING imports",
    ("rediacc_core.cli.groups", "module_name"): "a lazy command group loads the module a record of "
    "rediacc_core.commands names, always one of rediacc_core.cli (test_commands loads each)",
    ("rediacc_core.launcher", "module.name"): "the resident agent's warm-up walks every module; "
    "the launcher is on the top floor, where every floor may be imported",
}


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _not_imports(tree: ast.AST) -> set[int]:
    """Strings that name a module but import nothing: a `python -m` argument (a process of its own)
    and a package handed to `importlib.resources.files` (its data files)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            found.update(
                id(after)
                for before, after in zip(node.elts, node.elts[1:], strict=False)
                if isinstance(before, ast.Constant) and before.value == "-m"
            )
        elif isinstance(node, ast.Call) and _called(node) == "files":
            found.update(id(argument) for argument in node.args)
    return found


def string_imports(module: str, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """The modules `tree` imports by name in a string: "module:attr" or "module" strings (the lazy
    command maps), f-strings that begin "module:", and `importlib.import_module` arguments. A
    non-literal argument not listed in `DYNAMIC` yields an unresolved target."""
    skip = _not_imports(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if IMPORT_STRING.fullmatch(node.value):
                yield node.value.partition(":")[0], node.lineno
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                match = IMPORT_HEAD.match(head.value)
                if match:
                    yield match.group(1), node.lineno
        elif isinstance(node, ast.Call) and _called(node) == "import_module" and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Constant):
                continue  # read as a string above
            if (module, ast.unparse(argument)) not in DYNAMIC:
                yield f"<unresolved.import_module({ast.unparse(argument)})>", node.lineno


def resolve(module: str, package: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
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
    return targets


def edges_of(module: str, source: str | None = None) -> dict[str, tuple[int, bool]]:
    """The core modules `module` imports (or `source`, read as if it were `module`), each with the
    line of its first import and whether every import of it is read by the type checker only."""
    path = MODULES.get(module)
    text = source if source is not None else path.read_text() if path else ""
    package = module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(text)
    found: dict[str, tuple[int, bool]] = {}

    def add(target: str, line: int, type_only: bool) -> None:
        if target.partition(".")[0] not in ("rediacc_core", "<unresolved") or target == module:
            return
        first_line, was_type_only = found.get(target, (line, True))
        found[target] = (min(first_line, line), was_type_only and type_only)

    for node, type_only in imports_in(tree):
        for target in resolve(module, package, node):
            add(target, node.lineno, type_only)
    for target, line in string_imports(module, tree):
        add(target, line, False)
    return found


def imported_by(module: str, source: str | None = None) -> dict[str, int]:
    """The core modules `module` imports, type-only imports included, each with its first line."""
    return {target: line for target, (line, _) in edges_of(module, source).items()}


EDGES = {module: edges_of(module) for module in MODULES}
GRAPH = {module: {t: line for t, (line, _) in edges.items()} for module, edges in EDGES.items()}


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


def test_every_import_by_string_names_a_module() -> None:
    unresolved = sorted(
        f"{module} line {line}: {target}"
        for module, edges in EDGES.items()
        for target, (line, _) in edges.items()
        if target not in MODULES
    )
    assert unresolved == [], "name the module in a literal, or list the call in DYNAMIC with why"


def test_every_listed_dynamic_import_is_still_there() -> None:
    seen = {
        (module, ast.unparse(node.args[0]))
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and _called(node) == "import_module" and node.args
    }
    assert sorted(set(DYNAMIC) - seen) == []


# Import statements inside functions in the core today. A late import is for start-up time only
# (README, "Layout"): this number may fall, never rise. Lower it when you remove one.
LATE_IMPORTS = 226


def late_imports() -> dict[str, int]:
    """How many import statements each module of the core makes inside a function."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, module: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                found[module] = found.get(module, 0) + 1
            walk(child, module, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    for module, path in MODULES.items():
        walk(ast.parse(path.read_text()), module, False)
    return found


def test_late_imports_do_not_grow() -> None:
    found = late_imports()
    most = sorted(found.items(), key=lambda item: -item[1])[:5]
    assert sum(found.values()) <= LATE_IMPORTS, (
        f"import at the top of the module unless a measured start-up cost needs it late; most: {most}"
    )


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
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rediacc_core import grants",
         {"rediacc_core.grants"}),
        ("import typing\nif typing.TYPE_CHECKING:\n    import rediacc_core.grants\n"
         "else:\n    import rediacc_core.repos", {"rediacc_core.grants", "rediacc_core.repos"}),
        ('COMMANDS = {"up": "rediacc_core.cli.repo_run:up", "x": "rediacc_core.cli.repo_check"}',
         {"rediacc_core.cli.repo_run", "rediacc_core.cli.repo_check"}),
        ('LAZY = {n: f"rediacc_core.cli.repo_lease:{n}" for n in ("request",)}',
         {"rediacc_core.cli.repo_lease"}),
        ('import importlib\nimportlib.import_module("rediacc_core.repos")', {"rediacc_core.repos"}),
        ('from importlib import import_module\nimport_module(name)', {"<unresolved.import_module(name)>"}),
        ('subprocess.run([sys.executable, "-m", "rediacc_core.runtime.ports"])', set()),
        ('resources.files("rediacc_core.cdi").joinpath("schema")', set()),
        ("from rediacc_core import Machine, Inventory", {"rediacc_core.machine", "rediacc_core.model"}),
        ("from rediacc_core.cdi import parse_qualified_name", {"rediacc_core.cdi.names"}),
        ("from . import metrics", {"rediacc_core.gate.audit.metrics"}),
        ("from .metrics import Counters", {"rediacc_core.gate.audit.metrics"}),
        ("import json\nfrom pathlib import Path", set()),
    ],
)  # fmt: skip
def test_the_walk_sees_every_import(source: str, expected: set[str]) -> None:
    assert set(imported_by("rediacc_core.gate.audit.log", source)) == expected


def test_floors_go_by_the_most_specific_room() -> None:
    assert floor_of("rediacc_core.gate.policy.rules") == 2
    assert floor_of("rediacc_core.gate.decide") == 4
    assert floor_of("rediacc_core.remote.address") == 0
    assert floor_of("rediacc_core.remote.dispatch") == 6
    assert floor_of("rediacc_core") == 1
    assert floor_of("rediacc_core.nowhere") is None
