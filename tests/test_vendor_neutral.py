"""The core knows no vendor: everything vendor-specific lives in a plugin."""

from __future__ import annotations

import re
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "rediacc_core"
VENDOR_WORDS = re.compile(r"nvidia|\bamd\b|amdgpu|kfd|\bdri\b|/dev/dri|rocm|cuda", re.I)


def test_core_sources_name_no_vendor() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*")):
        if not path.is_file() or path.suffix not in {".py", ".json", ".service", ".toml", ".yaml", ""}:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if VENDOR_WORDS.search(line):
                offenders.append(f"{path.relative_to(CORE.parent)}:{number}: {line.strip()}")
    assert not offenders, "vendor names in the core:\n" + "\n".join(offenders)


def test_core_never_imports_a_plugin() -> None:
    imports = re.compile(r"^\s*(from|import)\s+rediacc_(nvidia|dri|amd)\b", re.M)
    offenders = [str(p) for p in CORE.rglob("*.py") if imports.search(p.read_text(encoding="utf-8"))]
    assert not offenders
