"""The public face is named once in code (`rediacc_core.__all__`) and README's list says the same."""

from __future__ import annotations

import re
from pathlib import Path

import rediacc_core

README = Path(__file__).resolve().parents[1] / "README.md"  # the checkout's: tox installs a wheel


def test_readme_names_exactly_the_public_face() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("`from rediacc_core import …` is the whole public face")
    paragraph = text[start : text.index("A plugin imports nothing deeper", start)]
    named = set(re.findall(r"`([A-Za-z_]+)(?:\(\))?`", paragraph)) - {"from"}
    public = set(rediacc_core.__all__) - {"__version__"}
    assert sorted(named ^ public) == []
