"""Every hook is part of the public contract: each needs a documented example and a test."""

from __future__ import annotations

import inspect
import re
import tokenize
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


def _code_names(path: Path) -> set[str]:
    """The names a Python file uses in code: comments and strings do not count."""
    with path.open("rb") as handle:
        return {tok.string for tok in tokenize.tokenize(handle.readline) if tok.type == tokenize.NAME}


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook: str) -> None:
    # Test files and the kits they use (a fake vendor implementing the hook in tests/setup_kit.py).
    test_files = [*REPO.glob("tests/**/*.py"), *REPO.glob("plugins/*/tests/**/*.py")]
    users = [f for f in test_files if f.name != "test_hook_docs.py" and hook in _code_names(f)]
    assert users, f"no test implements or calls {hook} (a mention in a comment or string does not count)"


def test_a_hook_named_only_in_a_comment_or_string_has_no_test(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text(
        '# rdc_discover is tested elsewhere\nNOTE = "rdc_discover"\ndef rdc_setup_steps(): ...\n'
    )
    assert "rdc_discover" not in _code_names(source)
    assert "rdc_setup_steps" in _code_names(source)
