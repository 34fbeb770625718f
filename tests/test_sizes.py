"""Sizes that keep the code readable: no class over 250 lines and no function over 100, in the core,
the plugins and the benchmark. A part that outgrows them holds more than one job; split it by job.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p
    for p in [
        *REPO.glob("rediacc_core/**/*.py"),
        *REPO.glob("plugins/*/rediacc_*/**/*.py"),
        *REPO.glob("bench/*.py"),
    ]
    if ".tox" not in p.parts
)
MOST_LINES = {ast.ClassDef: 250, ast.FunctionDef: 100, ast.AsyncFunctionDef: 100}


def oversized(source: str) -> Iterator[str]:
    for node in ast.walk(ast.parse(source)):
        limit = MOST_LINES.get(type(node))
        if limit is None:
            continue
        assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > limit:
            yield f"{node.name}: {lines} lines (at most {limit})"


def test_there_are_sources_to_measure() -> None:
    assert len(SOURCES) > 150


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_class_or_function_outgrows_its_limit(path: Path) -> None:
    assert list(oversized(path.read_text())) == []


def test_the_measure_counts_a_class_from_its_line_to_its_last() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(250))
    assert list(oversized(f"class Fits:\n{body[: body.rindex(chr(10))]}\n")) == []
    assert list(oversized(f"class Big:\n{body}\n")) == ["Big: 251 lines (at most 250)"]
