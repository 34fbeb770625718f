"""Where the real captures the parser tests read live: `REDIACC_REALDATA` when set, else the
checkout's own `tests/realdata` (tests run from the checkout's top, as tox runs them). A test run
elsewhere without them skips the tests that read them, saying where it looked."""

from __future__ import annotations

import os
from pathlib import Path

REALDATA = Path(os.environ.get("REDIACC_REALDATA") or "tests/realdata")


def capture(*parts: str) -> Path:
    """The capture at REALDATA/PARTS…, or a skip of the calling test when it is not there."""
    path = REALDATA.joinpath(*parts)
    if not path.exists():
        import pytest

        pytest.skip(
            f"real capture {path} not found (run the tests from the checkout's top, or set REDIACC_REALDATA)"
        )
    return path
