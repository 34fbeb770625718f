"""The floors of the house: every import in `rediacc_core` runs down, to a lower sub-floor, and no
import closes a circle.

Each module has a floor and a sub-floor within it (`HOUSE`, the most specific dotted prefix wins).
An import of a higher sub-floor fails; one within a sub-floor fails unless `WITHIN` names it with
why; so does any circle of imports, whatever floors it spans. Every import counts: one inside a
function, one under `if TYPE_CHECKING:` (a type a lower floor names lives on that floor), and one
by name in a string: a "module:attr" or "module" string (the CLI's lazy command maps), an f-string
that begins "module:", an `importlib.import_module` literal, and the modules such a call reads from
the module's own literals (a table it looks a name up in, `f"{__name__}.{name}"` completed by the
module's strings). An `import_module` the walk cannot resolve fails unless `DYNAMIC` says why its
targets are held anyway. A name taken from a package's lazy public face (`from rediacc_core import
Machine`) counts as an import of the module that holds it. README's layout section draws the same
floors and sub-floors.

A late import (inside a function) is for start-up time only, never to hide a loop: each module that
makes one says in `LATE` what waiting keeps out of which start-up, and how many it may make; one of
a module that importing the module loads anyway saves nothing and fails.
"""

from __future__ import annotations

import ast
import functools
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
    # import no core module
    ((0, 0), "errors values setting pids blocking unixhttp commands cdi.devnodes entrypoints"),
    ((0, 1), "files leases remote.address cdi.names publishing"),
    ((0, 2), "machine cdi.spec"),  # a machine and its root; one CDI spec
    ((0, 3), "config hostpaths kernlog model statelock cdi.registry"),  # what a machine holds
    ((0, 4), "bindings cdi"),  # hardware identities; the CDI package's lazy names
    # 1 the contract: hooks, the plugin manager, the public face
    ((1, 0), "hookspecs"),
    ((1, 1), "plugins rediacc_core"),
    # 2 the gate's record-free parts: Go-exact decoding, policy, HTTP framing, the audit trail
    ((2, 0), "gate.wire gate.policy gate.policy.findings gate.http gate.audit"),  # the rooms' leaves
    ((2, 1), "gate.wire.decode gate.policy.fetches gate.policy.mounts gate.policy.publish "
             "gate.decide.decision gate.audit.peer"),
    ((2, 2), "gate.policy.limits gate.http.messages gate.audit.log"),
    ((2, 3), "gate.policy.isolation gate.http.framing gate.audit.read"),
    ((2, 4), "gate.policy.rules gate.policy.settings gate.http.exchange"),
    ((2, 5), "gate.policy.endpoints"),  # each route with its checks
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
    ((4, 0), "gate gate.decide gate.decide.allowances gate.decide.containers gate.decide.health_check "
             "gate.decide.images gate.decide.live_facts "
             "gate.buildkit.llb gate.buildkit.h2limits"),
    ((4, 1), "gate.decide.start_checks gate.decide.answers gate.buildkit"),
    ((4, 2), "gate.decide.grant_refusals gate.buildkit.relay"),
    ((4, 3), "gate.decide.body gate.server"),
    ((4, 4), "gate.decide.decider"),  # the facade: routing
    # 5 a repo's running parts
    ((5, 0), "runtime runtime.process runtime.guard runtime.openers runtime.logfiles runtime.boltdb "
             "runtime.rtnetlink runtime.health_watch"),
    ((5, 1), "runtime.layout runtime.dataroot runtime.workers"),  # where a repo's parts live
    ((5, 2), "runtime.netns runtime.status"),  # its namespace; which of its parts run
    ((5, 3), "runtime.containerd runtime.uplinkwatch"),
    ((5, 4), "runtime.daemon runtime.ports"),
    ((5, 5), "runtime.teardown runtime.filesmount"),
    ((5, 6), "runtime.lifecycle"),  # up and down
    ((5, 7), "runtime.holdings runtime.fork"),
    ((5, 8), "runtime.lapsed"),
    ((5, 9), "runtime.serve"),  # the gate process
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
    ((7, 2), "cli.machine_gpu cli.slurm cli.check_compose"),
    ((7, 3), "cli.machine cli.repo_check cli.demo"),
    ((7, 4), "cli.repo cli.machine_config"),
    ((7, 5), "cli"),  # the `rdc` group
    ((7, 6), "cli.__main__ cli.reference launcher"),  # the console scripts
)  # fmt: skip
FLOORS: dict[str, tuple[int, int]] = {room: floor for floor, rooms in HOUSE for room in rooms.split()}

# Imports between two modules on one sub-floor, each with why the two share it. Any other such
# import fails: move the importer up a sub-floor (or what it imports down).
WITHIN: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def tree_of(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


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
    found: dict[str, str] = {}
    for node in ast.walk(tree_of(package)):
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

# `importlib.import_module` calls whose argument the walk cannot resolve from the module's own
# literals, each with why its targets are still held to the floors. Any other such call fails the
# test: name the module in a literal, or in a literal table the call reads.
DYNAMIC: dict[tuple[str, str], str] = {
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
            targets = from_tables(module, tree, argument)
            yield from ((target, node.lineno) for target in targets)
            if not targets and (module, ast.unparse(argument)) not in DYNAMIC:
                yield f"<unresolved.import_module({ast.unparse(argument)})>", node.lineno


def from_tables(module: str, tree: ast.AST, argument: ast.expr) -> list[str]:
    """The modules an `import_module` argument can name, read from the module's literals: a lookup
    in a table assigned at the top of the module (`_ELSEWHERE[name]`: the table's values), or an
    f-string of `__name__` and one name (`f"{__name__}.{module}"`: each string of the module that
    completes it to a module of the core)."""
    if isinstance(argument, ast.Subscript) and isinstance(argument.value, ast.Name):
        for statement in getattr(tree, "body", []):
            targets = (
                statement.targets
                if isinstance(statement, ast.Assign)
                else [getattr(statement, "target", None)]
            )
            if any(isinstance(t, ast.Name) and t.id == argument.value.id for t in targets) and isinstance(
                getattr(statement, "value", None), ast.Dict
            ):
                return [
                    value.value.partition(":")[0]
                    for value in statement.value.values
                    if isinstance(value, ast.Constant) and isinstance(value.value, str)
                ]
    if isinstance(argument, ast.JoinedStr):
        pieces = [
            str(value.value) if isinstance(value, ast.Constant) else module if _is_name(value.value) else None
            for value in argument.values
            if isinstance(value, ast.Constant | ast.FormattedValue)
        ]
        if pieces.count(None) == 1:
            at = pieces.index(None)
            head, tail = "".join(map(str, pieces[:at])), "".join(map(str, pieces[at + 1 :]))
            names = {
                n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
            return sorted({f"{head}{name}{tail}" for name in names} & set(MODULES))
    return []


def _is_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "__name__"


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
    tree = tree_of(module) if source is None and path is not None else ast.parse(text)
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


def test_every_room_is_listed_once_and_is_there() -> None:
    rooms = [room for _, listed in HOUSE for room in listed.split()]
    assert sorted(room for room in set(rooms) if rooms.count(room) > 1) == []
    gone = [room for room in rooms if room != "rediacc_core" and f"rediacc_core.{room}" not in MODULES]
    assert gone == [], "a room HOUSE lists is gone (moved or removed): list where it is now"
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
        for node in ast.walk(tree_of(module))
        if isinstance(node, ast.Call) and _called(node) == "import_module" and node.args
    }
    assert sorted(set(DYNAMIC) - seen) == []


# Every module that imports inside a function, with how many such imports it may make and why they
# wait: what each keeps out of which start-up (milliseconds of import measured on this project's
# 2-core host, after the module's own imports). A late import is for start-up time only (README,
# "Layout"): a new one needs its reason here, and a count may fall, never rise.
LATE: dict[str, tuple[int, str]] = {
    "rediacc_core": (3, "pluggy and the hook specs (14 ms), the typed model (20 ms), each on first use: "
                     "a command forwarded to an SSH machine loads neither"),
    "config": (3, "PyYAML (9 ms) only when a config file is read or saved: a machine with none pays nothing; "
               "difflib only for a mistyped name"),
    "files": (2, "jsonschema (34 ms) only when a document is checked against its schema; tempfile only for a "
              "write: `rdc`'s reads write nothing"),
    "statelock": (2, "filelock (15 ms) only when the lock is taken: every command imports this module"),
    "inventory": (3, "the typed model (11 ms) and the hardware identities only when a document is turned "
                  "into records: a name check reads the inventory's rows"),
    "plugins": (4, "importlib.metadata (10 ms), pluggy and the hook specs (2 ms after the public face) "
                "only when plugins load: `rdc --version` lists them by their metadata files"),
    "entrypoints": (1, "importlib.metadata (10 ms) only where sys.path holds what the direct reading does "
                    "not cover (a zip): `rdc --version` reads the metadata files itself"),
    "gate.policy.settings": (4, "each setting's check loads its policy room (41 ms in all) only when a "
                             "value is checked: every reader of the settings file loads these declarations"),
    "gate.policy.pins": (1, "atomic writes (8 ms) only when a pin is recorded: a decision only reads pins"),
    "health": (2, "the typed model (8 ms) only when events are parsed: the gate's start check reads records"),
    "telemetry": (1, "the typed model (8 ms) only for an export: a grant's record writes telemetry's files"),
    "grants.units": (2, "the inventory and the typed model (17 ms) only when a grant names hardware"),
    "grants.checks": (2, "the CDI registry with jsonschema (51 ms) only when a name is checked against the "
                      "specs: a revoke or a read checks none"),
    "grants.store": (2, "the plugins (10 ms) only when the caller hands none in; the CDI registry (43 ms) "
                     "only for a revoke's device nodes"),
    "gate.server": (1, "uvloop (2 ms) only when the gate starts its loop, and only where it is installed"),
    "runtime.guard": (2, "the guard runs at every `runc create`: calendar (2 ms) only for a lease's end, "
                      "PyYAML (10 ms) only for a YAML spec"),
    "runtime.daemon": (8, "the guard's wrapper and PyYAML (13 ms), the gate's rules (37 ms), the settings "
                       "(9 ms), an HTTP client (8 ms), each only where a daemon starts: teardown and the "
                       "files mount use this module to unmount; ctypes only for an unmount"),
    "runtime.netns": (1, "the settings only to choose a path at up: a `repo down` tears the namespace "
                      "down without them"),
    "runtime.lifecycle": (5, "the CDI specs with jsonschema (52 ms), the files mount and teardown (6 ms) "
                          "only for up and down: `repo delete` and `machine remove` look before they change "
                          "through this module"),
    "runtime.layout": (1, "the kernel path's module (3 ms: subprocess, shutil) only for a namespace that is "
                       "up: `rdc repo list` of repos that are down reads no path record"),
    "runtime.process": (1, "subprocess (3 ms) only to start a child: `rdc repo list` reads pidfiles through "
                        "this module"),
    "runtime.holdings": (5, "teardown (6 ms), the CDI registry (42 ms) and the audit log (13 ms) only when a "
                         "device's holders are looked for: a grant with no holder needs none"),
    "grants.records": (1, "telemetry only when a write exports: every read imports this module"),
    "machine": (2, "subprocess and shutil only when a tool runs or is looked for: every `rdc` start "
                "imports this"),
    "pids": (1, "subprocess only where a child of ours is waited for: reads import this module"),
    "repos": (2, "difflib only for a repo not found or a mistyped name"),
    "remote.protocol": (1, "importlib.metadata (14 ms) only when the versions are asked"),
    "remote.agent": (1, "the config and placement (21 ms) only when the agent runs a command"),
    "remote.resident": (3, "importlib.metadata (13 ms) only to stamp an install, the socket listener (6 ms) "
                        "only in the resident itself, subprocess (1 ms) only to start one"),
    "remote.dispatch": (11, "click (10 ms), the repo store (4 ms), tunnels (14 ms), PyYAML (8 ms) and a "
                        "thread pool (3 ms) only when a command is forwarded: a local one pays nothing; "
                        "the SSH call (agentcall) likewise"),
    "slurm.hooks": (9, "the grant store, plugins and holders (36 ms) only for a job with GPUs, the audit "
                    "log and running parts (24 ms) only when a line is written: most prologs grant nothing"),
    "slurm.reconcile": (2, "the grant store and plugins (21 ms) only when a lease is renewed"),
    "launcher": (10, "the console scripts load only the path they take: the CLI, or the dispatcher "
                 "(9 ms) for a forwarded command; the agent, or the resident; pkgutil and the plugins "
                 "only to warm the resident"),
    "testing.realdata": (1, "pytest (65 ms) only when a capture runs: `rdc demo` imports the test kit"),
    # the CLI: each command imports what only it runs (`tests/test_cli_imports.py` holds the budgets)
    "cli": (7, "a command forwarded to an SSH machine loads no command module: the dispatcher (7 ms), "
            "completion (3 ms), the plugins (18 ms) for `--version`, the delete prompt (38 ms)"),
    "cli.output": (5, "PyYAML (15 ms) only for `-o yaml`, the config (15 ms) only for a named machine; "
                   "shutil and textwrap only for output to a terminal or a cell too wide"),
    "cli.completion": (4, "the CDI registry (62 ms) and grants (25 ms) only while a shell asks to complete"),
    "cli.gpu_health": (4, "the plugins (13 ms) and the typed model (10 ms) only to show or clear health, "
                       "the settings (3 ms) only for a card held back: `machine gpu list` reads none"),
    "cli.plugins": (1, "the plugins (16 ms) only for `rdc plugins`"),
    "cli.demo": (4, "the demo machine and setup (574 ms) only for `rdc demo`"),
    "cli.machine": (13, "setup and the plugins (147 ms), the running parts (15 ms), Slurm's follow-up "
                    "(33 ms), SSH machines (33 ms), the GPU tables (10 ms) only for the commands that "
                    "change them: `rdc machine list` loads none; the settings (3 ms) only for the list: "
                    "every `rdc machine gpu …` imports this module, for its group"),
    "cli.machine_gpu": (2, "the fleet's view only for `--all`, Slurm's follow-up (33 ms) only when "
                        "`gpu clear` cleared a card"),
    "cli.repo": (24, "the grant store (14 ms), plugins (8 ms), holders (18 ms), running parts (16 ms) and "
                 "lease tables (81 ms), each only for the command that changes or shows them: "
                 "`rdc repo list` loads none of them; shutil only for a failed fork"),
    "cli.repo_run": (4, "the gate process (85 ms) only for `repo up --foreground` and `repo gate run`; the "
                     "audit reader and containerd only for their commands"),
    "cli.repo_slurm": (3, "Slurm's access records (1 ms) only for `repo slurm`"),
    "cli.repo_ssh": (1, "a repo's paths (4 ms) only for a local repo's DOCKER_HOST"),
    "cli.repo_check": (2, "the Compose reader (2 ms) only for `repo check --compose`"),
    "cli.slurm": (8, "Slurm's rooms (gres 62 ms, hooks 20 ms, the bridge 9 ms) only for the command that "
                  "runs them: `rdc --help` loads none"),
}  # fmt: skip


def late_import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements made inside a function, at any depth."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            yield from walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    return walk(tree, False)


def late_imports() -> dict[str, int]:
    """How many import statements each module of the core makes inside a function."""
    found = {short(m): sum(1 for _ in late_import_nodes(tree_of(m))) for m in MODULES}
    return {module: count for module, count in found.items() if count}


def test_every_late_import_has_its_reason() -> None:
    found = late_imports()
    unexplained = sorted(
        f"{module}: {count} late, {LATE[module][0] if module in LATE else 'none'} with a reason"
        for module, count in found.items()
        if count > LATE.get(module, (0, ""))[0]
    )
    assert unexplained == [], (
        "import at the top unless a measured start-up cost needs it late; then say so in LATE"
    )
    assert sorted(set(LATE) - set(found)) == [], "a module in LATE imports nothing late now: strike it"


@functools.cache
def top_level_imports(module: str) -> list[str]:
    """The core modules `module` imports when it is imported: not in a function, not for types."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = tree_of(module)
    late = {id(node) for node in late_import_nodes(tree)}
    return [
        target
        for node, type_only in imports_in(tree)
        if not type_only and id(node) not in late
        for target in resolve(module, package, node)
        if target in MODULES
    ]


def loaded_on_import(module: str) -> set[str]:
    """The core modules importing `module` loads: its packages and its top-level imports, through."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        parts = todo.pop().split(".")
        for here in [".".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            if here not in seen and here in MODULES:
                seen.add(here)
                todo += top_level_imports(here)
    return seen


# Late imports of what the module's own imports load anyway, so waiting saves nothing, each with why
# it stays: none now (issue 41 moved the last ones to the top of their modules).
LOADED_ANYWAY: set[tuple[str, str]] = set()


def test_no_late_import_of_what_is_loaded_anyway() -> None:
    found: set[tuple[str, str]] = set()
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        nodes = list(late_import_nodes(tree_of(module)))
        if not nodes:
            continue
        loaded = loaded_on_import(module)
        for node in nodes:
            found.update((short(module), short(t)) for t in resolve(module, package, node) if t in loaded)
    assert sorted(found - LOADED_ANYWAY) == [], (
        "importing the module loads these already: import them at the top"
    )
    assert sorted(LOADED_ANYWAY - found) == [], "moved to the top: strike it from LOADED_ANYWAY"


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


def test_an_import_module_reads_the_tables_it_looks_up() -> None:
    lookup = 'import importlib\nAT = {"x": "rediacc_core.repos"}\nimportlib.import_module(AT[name])'
    assert set(imported_by("rediacc_core.gate.audit", lookup)) == {"rediacc_core.repos"}
    typed = (
        'import importlib\nAT: dict[str, str] = {"x": "rediacc_core.repos"}\nimportlib.import_module(AT[n])'
    )
    assert set(imported_by("rediacc_core.gate.audit", typed)) == {"rediacc_core.repos"}
    homes = 'import importlib\nHOMES = {"metrics": ("Counters",)}\nimportlib.import_module(f"{__name__}.{m}")'
    assert set(imported_by("rediacc_core.gate.audit", homes)) == {"rediacc_core.gate.audit.metrics"}
    computed = "import importlib\nimportlib.import_module(f'{a}.{b}')"
    assert set(imported_by("rediacc_core.gate.audit", computed)) == {"<unresolved.import_module(f'{a}.{b}')>"}


def test_floors_go_by_the_most_specific_room() -> None:
    assert floor_of("rediacc_core.gate.policy.rules") == (2, 4)
    assert floor_of("rediacc_core.gate.policy.field_policy") == (2, 0)
    assert floor_of("rediacc_core.gate.decide.decider") == (4, 4)
    assert floor_of("rediacc_core.remote.address") == (0, 1)
    assert floor_of("rediacc_core.remote.dispatch") == (6, 4)
    assert floor_of("rediacc_core") == (1, 1)
    assert floor_of("rediacc_core.nowhere") is None
