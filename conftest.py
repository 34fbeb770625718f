"""Repository-wide test setup.

The real hardware captures live beside the repository in `../shared/realdata` (see its
SOURCES.md); tests and the plugins' test kits find them through `$REDIACC_REALDATA`.
"""

from __future__ import annotations

import os
from pathlib import Path

_BESIDE = Path(__file__).resolve().parent.parent / "shared" / "realdata"
os.environ.setdefault("REDIACC_REALDATA", str(_BESIDE))
