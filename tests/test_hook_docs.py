"""Every hook is part of the public contract: each is documented as its hookspec says, with an example
quoted from a real plugin (`tests/packages/example_vendor`), and each has a test."""

from __future__ import annotations

import inspect
import re
import tokenize
from pathlib import Path

import pytest

import rediacc_core
from rediacc_core import hookspecs
from rediacc_core.gate.policy.endpoints import ROUTES

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "hooks.md"
EXAMPLE = REPO / "tests" / "packages" / "example_vendor"
HOOKS = sorted(
    name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("rdc_")
)
FENCED = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def _section(hook: str) -> str:
    found = re.search(rf"^## {hook}\n(.*?)(?=^## |\Z)", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert found, f"docs/hooks.md has no '## {hook}' section"
    return found.group(1)


def signature(hook: str) -> str:
    """The hookspec's signature as the docs spell it: `rdc_x(name: Type, ...) -> Return`.

    The hookspecs postpone their annotations, so these are the annotations exactly as written.
    """
    sig = inspect.signature(getattr(hookspecs, hook))
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{hook}({params}) -> {sig.return_annotation}"


def test_there_are_hooks() -> None:
    assert "rdc_discover" in HOOKS and "rdc_request_rules" in HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_docstring(hook: str) -> None:
    assert (getattr(hookspecs, hook).__doc__ or "").strip(), f"{hook} needs a docstring in hookspecs.py"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_documented_example(hook: str) -> None:
    examples = [code for lang, code in FENCED.findall(_section(hook)) if lang == "python"]
    assert any(f"def {hook}(" in code for code in examples), f"the {hook} section needs an example of it"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_documented_signature_is_the_hookspecs(hook: str) -> None:
    # Parameter names, their types and the return type, as hookspecs.py declares them.
    assert f"`{signature(hook)}`" in _section(hook), f"docs/hooks.md must show `{signature(hook)}`"


def test_the_docs_document_no_hook_that_does_not_exist() -> None:
    documented = re.findall(r"^## (rdc_\w+)$", DOC.read_text(encoding="utf-8"), re.M)
    assert sorted(documented) == HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_the_readme_table_shows_every_hook_as_the_hookspec_declares_it(hook: str) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8").replace("\\|", "|")  # a table escapes |
    assert f"| `{signature(hook)}`" in readme, f"README's plugin table must show `{signature(hook)}`"


def test_signatures_are_rendered_from_the_hookspec() -> None:
    assert (
        signature("rdc_hardware_units")
        == "rdc_hardware_units(name: str, inventory: Inventory) -> list[str] | None"
    )
    assert signature("rdc_setup_options") == "rdc_setup_options() -> list[click.Option]"


def _quoted_blocks() -> list[tuple[str, str]]:
    return FENCED.findall(DOC.read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("lang", "code"), _quoted_blocks(), ids=lambda v: v.splitlines()[0][:40] if "\n" in v else v
)
def test_every_example_is_quoted_from_the_example_plugin(lang: str, code: str) -> None:
    """The docs show the code the tests run: a block not found verbatim in the package is stale."""
    sources = {"python": "rediacc_example_vendor/__init__.py", "toml": "pyproject.toml"}
    assert lang in sources, f"a ```{lang} block in docs/hooks.md has no source to be quoted from"
    assert code in (EXAMPLE / sources[lang]).read_text(encoding="utf-8"), (
        f"this block of docs/hooks.md is not in {EXAMPLE.name}/{sources[lang]} word for word:\n{code}"
    )


def test_the_example_plugin_implements_every_hook() -> None:
    source = (EXAMPLE / "rediacc_example_vendor" / "__init__.py").read_text(encoding="utf-8")
    assert re.findall(r"^@hookimpl\ndef (rdc_\w+)\(", source, re.M) == [
        name for name in re.findall(r"^## (rdc_\w+)$", DOC.read_text(encoding="utf-8"), re.M)
    ]


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


def test_the_request_rules_hook_names_exactly_the_routes_that_reach_plugins() -> None:
    doc = hookspecs.rdc_request_rules.__doc__ or ""
    sentence = doc.split("Called for every request", 1)[1].split("after the repo's", 1)[0]
    named = set(re.findall(r"`([a-z]+(?:-[a-z]+)*)`", sentence))
    decoded = {route.name for route in ROUTES if route.action == "inspect" and route.body is not None}
    assert sorted(named ^ decoded) == []


def test_the_hook_docs_name_may_block_where_plugins_import_it() -> None:
    assert "may_block" in rediacc_core.__all__
    for text in (hookspecs.rdc_request_rules.__doc__ or "", DOC.read_text(encoding="utf-8")):
        assert "rediacc_core.may_block()" in text and "gate.images.may_block" not in text
