"""The directions of import: plugins use only the core's public face.

A vendor plugin is a separate distribution built against `rediacc_core`'s documented API (the names
`rediacc_core/__init__.py` exports); its test kit and its simulated hardware for `rdc demo` (modules
named `testing` and `demo`) may also use the core's kit for simulated machines, `rediacc_core.testing`.
Anything deeper is the core's to change without notice.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rediacc_core

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "plugins"
# The shipped plugins, and the example plugin docs/hooks.md quotes (what third parties copy).
SOURCES = sorted(
    [*PLUGINS.glob("*/rediacc_*/**/*.py"), *REPO.glob("tests/packages/example_vendor/rediacc_*/**/*.py")]
)


def _core_imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rediacc_core":
            found.append((node.lineno, node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == "rediacc_core"]
    return found


def test_there_are_plugin_sources_to_check() -> None:
    assert len(SOURCES) > 10


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_plugins_import_only_the_public_face(path: Path) -> None:
    allowed = {"rediacc_core"} | ({"rediacc_core.testing"} if path.stem in ("testing", "demo") else set())
    deeper = [
        f"{path.name}:{line} {module}" for line, module, _ in _core_imports(path) if module not in allowed
    ]
    assert not deeper, f"imports past rediacc_core's public face: {deeper}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_name_a_plugin_takes_is_exported(path: Path) -> None:
    public = set(rediacc_core.__all__)
    for _, module, names in _core_imports(path):
        if module == "rediacc_core":
            assert set(names) <= public, f"{path.name} takes {set(names) - public} not in __all__"
            for name in names:
                assert getattr(rediacc_core, name) is not None


# --- remote/ is transport, agent and protocol: the command line calls it, never the other way -------

REMOTE = sorted((REPO / "rediacc_core" / "remote").glob("*.py"))


def _imports_the_cli(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "rediacc_core.cli" or a.name.startswith("rediacc_core.cli.") for a in node.names)
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if node.module == "rediacc_core.cli" or node.module.startswith("rediacc_core.cli."):
            return True
        return node.module == "rediacc_core" and any(a.name == "cli" for a in node.names)
    return False


def test_there_are_remote_modules_to_check() -> None:
    assert {p.name for p in REMOTE} >= {"agent.py", "dispatch.py", "ssh.py"}


@pytest.mark.parametrize("path", REMOTE, ids=lambda p: p.name)
def test_remote_never_imports_the_cli(path: Path) -> None:
    # ast.walk reaches imports inside functions too: a lazy import is still a dependency.
    tree = ast.parse(path.read_text(), str(path))
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    found = [n.lineno for n in imports if _imports_the_cli(n)]
    assert not found, f"{path.name} imports rediacc_core.cli at line(s) {found}; hand the CLI in instead"


def test_the_check_sees_each_way_of_importing_the_cli() -> None:
    for text in (
        "import rediacc_core.cli",
        "from rediacc_core.cli import cli",
        "from rediacc_core.cli.repo import confirm_delete",
        "from rediacc_core import cli",
        "def f():\n    from rediacc_core import config, cli",
    ):
        assert any(_imports_the_cli(n) for n in ast.walk(ast.parse(text))), text
    assert not any(_imports_the_cli(n) for n in ast.walk(ast.parse("from rediacc_core import client")))
