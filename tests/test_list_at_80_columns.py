"""`rdc repo list` on an 80-column terminal: no id or time is split mid-token, an id is cut to its
first 12 (whole with `-o wide`), and a DOCKER HOST column no repo fills is left out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rediacc_core.cli import cli
from rediacc_core.cli.output import table
from rediacc_core.testing import FakeMachine

ID = "0f5a3c1e-9b2d-4c7a-8e1f-2a3b4c5d6e7f"
TIME = "2026-12-05T21:28:14Z"


def test_ids_and_times_stay_whole_when_a_table_is_narrowed() -> None:
    text = table(["ID", "CREATED", "NOTES"], [[ID, TIME, "a long remark " * 6]], width=80)
    assert ID in text and TIME in text


def on_a_terminal(*args: str, env: dict[str, str]) -> str:
    """What rdc prints to an 80-column terminal (a pseudo-terminal made by `script`)."""
    if shutil.which("script") is None:
        pytest.skip("needs util-linux's script")
    rdc = Path(sys.executable).parent / "rdc"
    command = " ".join([str(rdc), *args])
    done = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env, "COLUMNS": "80", "LINES": "24"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.replace("\r", "")


def test_repo_list_fits_80_columns(rdc_config: Path, fake_machine: FakeMachine) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["machine", "add", "box", "--root", str(fake_machine.root)]).exit_code == 0
    assert runner.invoke(cli, ["repo", "create", "trainer@box"]).exit_code == 0
    env = {"REDIACC_CONFIG": str(rdc_config), "REDIACC_LOAD_PLUGINS": ""}

    listed = on_a_terminal("repo", "list", "box", env=env)

    [header, row] = [line for line in listed.splitlines() if line.strip()][:2]
    assert header.split() == ["REPO", "STATUS", "ID", "CREATED", "GPU", "GRANTS"]
    assert all(len(line) <= 80 for line in listed.splitlines())
    assert re.search(r" [0-9a-f]{8}-[0-9a-f]{3} ", row), row  # the first 12 of the id
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row), row
    wide = on_a_terminal("repo", "list", "box", "-o", "wide", env=env)
    assert re.search(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", wide)
