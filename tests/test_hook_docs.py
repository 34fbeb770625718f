"""Every hook is part of the public contract: each needs a documented example and a test."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from rediacc_core import hookspecs

REPO = Path(__file__).resolve().parents[1]
HOOKS = sorted(
    name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("rdc_")
)


def test_there_are_hooks() -> None:
    assert "rdc_discover" in HOOKS and "rdc_request_rules" in HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_docstring(hook: str) -> None:
    assert (getattr(hookspecs, hook).__doc__ or "").strip(), f"{hook} needs a docstring in hookspecs.py"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_documented_example(hook: str) -> None:
    doc = (REPO / "docs" / "hooks.md").read_text(encoding="utf-8")
    section = re.search(rf"^## {hook}\n(.*?)(?=^## |\Z)", doc, re.S | re.M)
    assert section, f"docs/hooks.md has no '## {hook}' section"
    assert "```python" in section.group(1), f"the {hook} section in docs/hooks.md needs an example"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook: str) -> None:
    test_files = [*REPO.glob("tests/**/test_*.py"), *REPO.glob("plugins/*/tests/**/test_*.py")]
    users = [f for f in test_files if f.name != "test_hook_docs.py" and hook in f.read_text(encoding="utf-8")]
    assert users, f"no test mentions {hook}"
