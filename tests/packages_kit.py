"""Installing the plugin distributions under `tests/packages/` the way a user does: with pip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PACKAGES = Path(__file__).parent / "packages"


def install(package: str, target: Path) -> Path:
    """`pip install` the distribution in `tests/packages/<package>` into the directory `target`.

    No dependencies: the core is the one under test, already importable.
    """
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(PACKAGES / package),
        ],
        check=True,
        capture_output=True,
    )
    return target


def env_with(site: Path, **variables: str) -> dict[str, str]:
    """The environment of an `rdc` process that finds what was installed in `site`, plus `variables`.

    REDIACC_LOAD_PLUGINS is inherited only when given here: by default every plugin found loads.
    """
    env = {k: v for k, v in os.environ.items() if k != "REDIACC_LOAD_PLUGINS"}
    env["PYTHONPATH"] = f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return {**env, **variables}
