"""Where the real captures the parser tests read live: `REDIACC_REALDATA`, else the checkout's
sibling `shared/realdata` (as the project's machines lay it out). `.ci/run` insists on them; a test
run elsewhere without them skips the tests that read them, saying where it looked."""

from __future__ import annotations

import os
from pathlib import Path

REALDATA = Path(os.environ.get("REDIACC_REALDATA", "../shared/realdata"))


def capture(*parts: str) -> Path:
    """The capture at REALDATA/PARTS…, or a skip of the calling test when it is not there."""
    path = REALDATA.joinpath(*parts)
    if not path.exists():
        import pytest

        pytest.skip(f"real capture {path} not found (set REDIACC_REALDATA to the realdata directory)")
    return path
