"""Operating-system errors reach the operator as `Error:` naming the path and `What to do:`, never as a
bug report; Ctrl-C exits 130; `rdc repo up` without root is refused at once.

The permission cases run the real CLI as an unprivileged user (`nobody` through setpriv when the suite
runs as root), because root is never refused by file modes.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from setup_kit import FakeVendor
from signals_kit import ctrl_c_reaches_it

from rediacc_core import CdiSpecFile
from rediacc_core.cli import cli
from rediacc_core.cli.output import waiting
from rediacc_core.errors import (
    EXIT_INTERRUPTED,
    EXIT_PERMISSION,
    EXIT_STATE,
    EXIT_TOOL,
    PermissionDeniedError,
    from_os_error,
)
from rediacc_core.statelock import state_lock
from rediacc_core.testing import FakeMachine

NOBODY = 65534


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def fm(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> FakeMachine:
    box = make_fake_machine("box")
    assert rdc("machine", "add", "box", "--root", str(box.root)).exit_code == 0
    return box


@pytest.fixture
def nobodys_box(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeMachine, Path]]:
    """Machine `box` and the rdc config naming it, in a directory of /tmp that `nobody` can be let
    into: not under pytest's base directory, which any pytest session of this user that starts
    meanwhile makes private again (0o700)."""
    top = Path(tempfile.mkdtemp(prefix="rdc-os-errors-"))
    try:
        config = top / "rdc-config.yaml"
        monkeypatch.setenv("REDIACC_CONFIG", str(config))
        box = FakeMachine(top / "box-root", name="box")
        assert rdc("machine", "add", "box", "--root", str(box.root)).exit_code == 0
        yield box, config
    finally:
        shutil.rmtree(top, ignore_errors=True)


def unprivileged(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`rdc ARGS` in a new process without root (as `nobody` when this suite runs as root)."""
    argv = [sys.executable, "-m", "rediacc_core.cli", *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to drop root")
        argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
        # tox makes .tox private to root; without its venv, `nobody` would run a bare interpreter.
        open_to_everyone(Path(sys.prefix))
    full_env = {**os.environ, "REDIACC_LOAD_PLUGINS": "", **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=60, cwd="/")


def open_to_everyone(path: Path) -> None:
    """Let `nobody` reach `path` (the test's tmp directories are private to root)."""
    for part in [path, *path.parents]:
        if part == Path("/"):
            break
        part.chmod(part.stat().st_mode | 0o005)


def assert_two_line_report(stderr: str) -> None:
    assert "this is a bug" not in stderr and "unexpected" not in stderr
    lines = stderr.strip().splitlines()
    assert any(line.startswith("Error: ") for line in lines), stderr
    assert lines[-1].startswith("What to do: "), stderr


# --- permissions --------------------------------------------------------------------------------


def test_writing_without_permission_names_the_path_and_says_to_rerun_as_root(
    nobodys_box: tuple[FakeMachine, Path],
) -> None:
    fm, rdc_config = nobodys_box
    fm.mkdir("/etc/rediacc")
    fm.path("/etc/rediacc").chmod(0o755)  # root's, as on a real machine
    open_to_everyone(fm.root)
    open_to_everyone(rdc_config)
    rdc_config.chmod(0o644)

    result = unprivileged("repo", "create", "z@box")

    assert result.returncode == EXIT_PERMISSION, result.stderr
    assert_two_line_report(result.stderr)
    assert f"Error: permission denied: {fm.path('/etc/rediacc')}" in result.stderr
    assert "rerun the command as root (sudo rdc" in result.stderr


def test_repo_up_without_root_is_refused_at_once_not_after_the_start_timeout(
    nobodys_box: tuple[FakeMachine, Path],
) -> None:
    fm, rdc_config = nobodys_box
    assert rdc("repo", "create", "z@box").exit_code == 0
    open_to_everyone(fm.root)
    open_to_everyone(rdc_config)
    rdc_config.chmod(0o644)

    started = time.monotonic()
    result = unprivileged("repo", "up", "z@box")
    took = time.monotonic() - started

    assert result.returncode == EXIT_PERMISSION, result.stderr
    assert_two_line_report(result.stderr)
    assert "needs root" in result.stderr and "sudo rdc repo up z@box" in result.stderr
    assert took < 30  # the daemon's start timeout is 60 s: this is "at once", with room for a slow box
    assert not fm.path("/run/rediacc").exists()  # refused before anything was made


# --- things in the way --------------------------------------------------------------------------


def test_a_file_where_the_state_directory_belongs_is_a_state_error_naming_it(fm: FakeMachine) -> None:
    fm.write("/etc/rediacc", "not a directory\n")

    result = rdc("repo", "create", "z@box")

    assert result.exit_code == EXIT_STATE, result.output
    assert_two_line_report(result.stderr)
    assert str(fm.path("/etc/rediacc")) in result.stderr


def test_a_directory_where_the_inventory_belongs_is_a_state_error_naming_it(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    fm.mkdir("/etc/rediacc/gpu/inventory.json")

    result = rdc("machine", "setup", "box")

    assert result.exit_code == EXIT_STATE, result.output
    assert_two_line_report(result.stderr)
    inventory = fm.path("/etc/rediacc/gpu/inventory.json")
    assert f"Error: {inventory} is a directory where rdc expects a file" in result.stderr


def test_a_vendor_tool_that_cannot_be_run_is_a_tool_error_naming_it(
    vendor: FakeVendor, fm: FakeMachine
) -> None:
    tool = fm.standin("examplegen", "#!/bin/sh\nexit 0\n")
    tool.chmod(0o644)  # installed without its x bit
    vendor.specs = [CdiSpecFile("example.yaml", command=("examplegen", "cdi", "--output={output}"))]

    result = rdc("machine", "setup", "box")

    assert result.exit_code == EXIT_TOOL, result.output
    assert_two_line_report(result.stderr)
    assert "examplegen: cannot run it: Permission denied" in result.stderr


@pytest.mark.parametrize(
    ("exc", "code", "words"),
    [
        (PermissionError(13, "Permission denied", "/etc/cdi"), EXIT_PERMISSION, "denied: /etc/cdi"),
        (PermissionError(1, "Operation not permitted", "/dev/x"), EXIT_PERMISSION, "not permitted: /dev/x"),
        (FileExistsError(17, "File exists", "/run/r"), EXIT_STATE, "/run/r already exists"),
        (IsADirectoryError(21, "Is a directory", "/etc/f"), EXIT_STATE, "/etc/f is a directory"),
        (IsADirectoryError(21, "Is a directory", "/etc/.f.tmp", None, "/etc/f"), EXIT_STATE, "/etc/f is a"),
        (OSError(28, "No space left on device", "/var/x"), 1, "no space left on the device: /var/x"),
    ],
)
def test_each_os_error_maps_to_a_report_naming_its_path(exc: OSError, code: int, words: str) -> None:
    error = from_os_error(exc)
    assert error.exit_code == code
    assert words in error.what and error.todo
    assert isinstance(error, PermissionDeniedError) == (code == EXIT_PERMISSION)


# --- Ctrl-C -------------------------------------------------------------------------------------


def test_ctrl_c_while_waiting_for_the_state_lock_exits_130(fm: FakeMachine) -> None:
    env = {**os.environ, "REDIACC_LOAD_PLUGINS": "", "REDIACC_LOCK_TIMEOUT": "60"}
    with state_lock(fm.machine):
        child = subprocess.Popen(
            [sys.executable, "-m", "rediacc_core.cli", "repo", "create", "z@box"],
            env=env,
            preexec_fn=ctrl_c_reaches_it,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stderr is not None
            # It says it waits once it does, inside rdc's main(): Ctrl-C is rdc's to handle from then.
            first = child.stderr.readline()
            assert first.startswith("Waiting for the state lock of machine box (held by process"), first
            child.send_signal(signal.SIGINT)
            _, rest = child.communicate(timeout=30)
            stderr = first + rest
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()

    assert child.returncode == EXIT_INTERRUPTED, stderr
    assert stderr.strip().endswith("Interrupted.")


def test_a_command_waiting_for_the_state_lock_says_so_and_who_holds_it(fm: FakeMachine) -> None:
    env = {**os.environ, "REDIACC_LOAD_PLUGINS": "", "REDIACC_LOCK_TIMEOUT": "0.2"}
    with state_lock(fm.machine):
        result = subprocess.run(
            [sys.executable, "-m", "rediacc_core.cli", "repo", "create", "z@box"],
            env=env,
            preexec_fn=ctrl_c_reaches_it,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 15
    held = f"(held by process {os.getpid()})"
    assert result.stderr.startswith(f"Waiting for the state lock of machine box {held} …\n")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_wait_shows_the_seconds_waited() -> None:
    terminal = _Terminal()
    with waiting("Waiting for the state lock of machine box", terminal, interval=0.001):
        deadline = time.monotonic() + 10
        while terminal.getvalue().count("\r") < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    text = terminal.getvalue()
    assert text.startswith("\rWaiting for the state lock of machine box … 0s")
    assert re.search(r"… waited \d+s\n$", text)  # whole seconds: 0 unless the host stalled it
