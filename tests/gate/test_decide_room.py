"""The decider is one room, wired when the gate starts: its modules import at their top (no import
waits in a function for the first request), hand a part none of their own methods wrapped in a
lambda, and the room's package imports nothing, so the exchange reading `decision` loads nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOM = Path(__file__).resolve().parents[2] / "rediacc_core" / "gate" / "decide"
MODULES = sorted(ROOM.glob("*.py"))


def _late_imports(tree: ast.AST) -> list[int]:
    found = []
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [n.lineno for n in ast.walk(func) if isinstance(n, ast.Import | ast.ImportFrom)]
    return sorted(set(found))


def _self_calling_lambdas(tree: ast.AST) -> list[int]:
    """`lambda x: self.method(x)`: a method handed on through a wrapper (hand the method itself)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda) and isinstance(node.body, ast.Call):
            func = node.body.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                found.append(node.lineno)
    return found


def test_the_room_holds_the_deciders_parts() -> None:
    assert {p.stem for p in MODULES} >= {
        "decider", "decision", "body", "start_checks", "grant_refusals", "health_check", "allowances",
        "live_facts", "answers", "containers", "images",
    }  # fmt: skip
    assert not (ROOM.parent / "decide.py").exists() and (ROOM.parent / "server.py").exists()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_part_imports_at_its_top(path: Path) -> None:
    assert _late_imports(ast.parse(path.read_text())) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_part_hands_on_no_method_in_a_lambda(path: Path) -> None:
    assert _self_calling_lambdas(ast.parse(path.read_text())) == []


def test_the_rooms_package_imports_nothing() -> None:
    tree = ast.parse((ROOM / "__init__.py").read_text())
    assert [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)] == []


def test_the_walks_see_what_they_look_for() -> None:
    source = "def f(self):\n    import json\n    return lambda name: self.in_the_way(name)\n"
    tree = ast.parse(source)
    assert _late_imports(tree) == [2]
    assert _self_calling_lambdas(tree) == [3]
