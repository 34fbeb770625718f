"""The floors of the house: every import in `rediacc_core` runs down, to a lower sub-floor, and no
import closes a circle.

Each module has a floor and a sub-floor within it (`HOUSE`, the most specific dotted prefix wins).
An import of a higher sub-floor fails; one within a sub-floor fails unless `WITHIN` names it with
why; so does any circle of imports, whatever floors it spans. Every import counts:
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

# The floors and their sub-floors, lowest first: (floor, sub-floor) and the rooms on it. A module
# imports the sub-floors below its own, never its own or above, unless `WITHIN` names the edge. A
# room ("gate.policy") holds its modules not listed themselves; the most specific room wins; the
# package itself, the public face, is "rediacc_core".
HOUSE: tuple[tuple[tuple[int, int], str], ...] = (
    # 0 the ground: leaf modules every floor may use
    ((0, 0), "errors values setting pids blocking unixhttp placement cdi.devnodes"),  # import no core module
    ((0, 1), "files leases remote.address cdi.names publishing"),
    ((0, 2), "machine cdi.spec"),  # a machine and its root; one CDI spec
    ((0, 3), "config hostpaths kernlog model statelock cdi.registry"),  # what a machine holds
    ((0, 4), "bindings cdi"),  # hardware identities; the CDI package's lazy names
    # 1 the contract: hooks, the plugin manager, the public face
    ((1, 0), "hookspecs"),
    ((1, 1), "plugins rediacc_core"),
    # 2 the gate's record-free parts: Go-exact decoding, policy, HTTP framing, the audit trail
    ((2, 0), "gate.wire gate.policy gate.policy.findings gate.http gate.audit"),  # the rooms' leaves
    ((2, 1), "gate.wire.decode gate.policy.fetches gate.policy.mounts gate.policy.publish gate.decision "
             "gate.audit.peer"),
    ((2, 2), "gate.policy.endpoints gate.policy.limits gate.http.messages gate.audit.log"),
    ((2, 3), "gate.policy.isolation gate.http.framing gate.audit.read"),
    ((2, 4), "gate.policy.rules gate.policy.settings gate.http.exchange"),
    # 3 the machine's records and how they change
    ((3, 0), "repos inventory spec_facts grants slurm.node slurm.access slurm.client runtime.settings "
             "telemetry_settings"),  # records, and settings declared beside the rooms that act on them
    ((3, 1), "holders health slurm.gres"),
    ((3, 2), "settings"),  # the settings file and the registry of every setting
    ((3, 3), "telemetry"),
    ((3, 4), "grants.records"),
    ((3, 5), "grants.live grants.release grants.units"),
    ((3, 6), "grants.checks grants.handover recheck"),
    ((3, 7), "grants.store setup"),
    # 4 the gate's engine: what it asks the daemon, its decisions, BuildKit's relay, the asyncio glue
    ((4, 0), "gate gate.allowances gate.containers gate.health_check gate.images gate.live_facts gate.views "
             "gate.buildkit.llb gate.buildkit.h2limits"),
    ((4, 1), "gate.start_checks gate.info gate.buildkit"),
    ((4, 2), "gate.grant_refusals gate.buildkit.relay"),
    ((4, 3), "gate.body gate.server"),
    ((4, 4), "gate.decide"),  # the facade: routing
    # 5 a repo's running parts
    ((5, 0), "runtime runtime.process runtime.guard runtime.openers runtime.logfiles runtime.boltdb "
             "runtime.rtnetlink runtime.health_watch"),
    ((5, 1), "runtime.layout runtime.netns runtime.dataroot runtime.workers"),
    ((5, 2), "runtime.containerd runtime.uplinkwatch"),
    ((5, 3), "runtime.daemon runtime.ports"),
    ((5, 4), "runtime.teardown runtime.filesmount"),
    ((5, 5), "runtime.lifecycle"),  # up and down
    ((5, 6), "runtime.holdings runtime.fork"),
    ((5, 7), "runtime.lapsed"),
    ((5, 8), "runtime.serve"),  # the gate process
    # 6 other machines, and Slurm's hooks and reconciler (they grant and revoke with --stop)
    ((6, 0), "remote remote.ssh remote.protocol slurm slurm.drains"),
    ((6, 1), "remote.link remote.agent remote.install slurm.hooks"),
    ((6, 2), "remote.agentcall remote.resident slurm.reconcile slurm.requests slurm.usage"),
    ((6, 3), "remote.tunnel slurm.round slurm.follow slurm.bridge"),
    ((6, 4), "remote.dispatch slurm.plugin"),
    # 7 the faces and composition roots
    ((7, 0), "cli.output cli.groups cli.check_docker testing.fakemachine testing.kit testing.realdata "
             "testing.dockerenv testing.sshd"),
    ((7, 1), "cli.fleet cli.gpu_health cli.machine_ssh cli.plugins cli.repo_lease cli.repo_run "
             "cli.repo_slurm cli.repo_ssh cli.completion cli.compose_bodies demo testing "
             "testing.pytest_plugin"),
    ((7, 2), "cli.machine cli.slurm cli.check_compose"),
    ((7, 3), "cli.repo_check cli.demo"),
    ((7, 4), "cli.repo"),
    ((7, 5), "cli"),  # the `rdc` group
    ((7, 6), "cli.__main__ launcher"),  # the console scripts
)  # fmt: skip
FLOORS: dict[str, tuple[int, int]] = {room: floor for floor, rooms in HOUSE for room in rooms.split()}

# Imports between two modules on one sub-floor, each with why the two share it. Any other such
# import fails: move the importer up a sub-floor (or what it imports down).
WITHIN: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(module: str) -> tuple[int, int] | None:
    name = module if module == "rediacc_core" else module.removeprefix("rediacc_core.")
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
    ("rediacc_core.cli.groups", "module_name"): 'a lazy command group loads the "module:attr" '
    "strings its callers hand it; each such string counts as an import of its writer",
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


def climbing(level: bool = False) -> set[tuple[str, str]]:
    """The imports that run up a sub-floor (or, with `level`, stay on their own)."""
    found = set()
    for module, targets in GRAPH.items():
        here = floor_of(module)
        for target in targets:
            there = floor_of(target)
            if here is not None and there is not None and (there == here if level else there > here):
                found.add((module, target))
    return found


def short(module: str) -> str:
    return module if module == "rediacc_core" else module.removeprefix("rediacc_core.")


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


def test_every_room_is_listed_once() -> None:
    rooms = [room for _, listed in HOUSE for room in listed.split()]
    assert sorted(room for room in set(rooms) if rooms.count(room) > 1) == []
    assert [floor for floor, _ in HOUSE] == sorted(floor for floor, _ in HOUSE)


def _floor_name(module: str) -> str:
    return ".".join(map(str, floor_of(module) or ()))


def test_no_import_climbs_a_floor() -> None:
    found = sorted(climbing())
    report = [f"{a} ({_floor_name(a)}) imports {b} ({_floor_name(b)}), line {GRAPH[a][b]}" for a, b in found]
    assert report == [], "move the shared piece down, or hand it in from the caller"


def test_readme_draws_the_same_sub_floors() -> None:
    rows = re.findall(r"^\| (\d+)\.(\d+) \| (`.*`) \|$", (REPO / "README.md").read_text(), re.M)
    drawn = [
        ((int(floor), int(sub)), " ".join(re.findall(r"`([^`]+)`", rooms))) for floor, sub, rooms in rows
    ]
    assert drawn == [(floor, " ".join(rooms.split())) for floor, rooms in HOUSE], (
        "README's sub-floor table is drawn from HOUSE: redraw it"
    )


def test_every_import_within_a_sub_floor_is_named() -> None:
    level = {(short(a), short(b)) for a, b in climbing(level=True)}
    report = [
        f"{a} imports {b}, both on {_floor_name('rediacc_core.' + a)}" for a, b in sorted(level - set(WITHIN))
    ]
    assert report == [], "put the importer a sub-floor up in HOUSE (or name the edge in WITHIN with why)"
    assert sorted(set(WITHIN) - level) == [], "an edge WITHIN names is gone: strike it"


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
LATE_IMPORTS = 210


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
    assert floor_of("rediacc_core.gate.policy.rules") == (2, 4)
    assert floor_of("rediacc_core.gate.policy.field_policy") == (2, 0)
    assert floor_of("rediacc_core.gate.decide") == (4, 4)
    assert floor_of("rediacc_core.remote.address") == (0, 1)
    assert floor_of("rediacc_core.remote.dispatch") == (6, 4)
    assert floor_of("rediacc_core") == (1, 1)
    assert floor_of("rediacc_core.nowhere") is None
