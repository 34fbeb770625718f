"""Ctrl-C at any moment of `rdc repo up` and `rdc repo down` leaves a state `rdc repo list` names
truthfully: every process of the repo is a part it lists (or a child of one), `down` only when none
runs, `up` only when every part does, and a word on stderr says where the repo stands.

The SIGINT goes to rdc's whole process group, as a terminal's Ctrl-C does (so the tools it runs in
the foreground, `ip` and `iptables`, get it too). Each command is first timed whole; the interrupts
then fall at 20 points spread over it, from its first moments to its last."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E

from rediacc_core.errors import EXIT_INTERRUPTED
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import layout, status

POINTS = 20
LANDED: list[str] = []  # the commands an interrupt reached while they worked, one entry each
LABEL = "intr"


def rdc_argv(*args: str) -> list[str]:
    return ["rdc", *args]


def start(e2e: E2E, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "REDIACC_CONFIG": str(e2e.config_path)}
    # SIGINT as a terminal leaves it to a foreground command, even where this test runs as a
    # background job (whose SIGINT the shell ignores, and Python would keep ignoring).
    return subprocess.Popen(
        rdc_argv(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def timed(e2e: E2E, *args: str) -> float:
    began = time.monotonic()
    done = start(e2e, *args)
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    return time.monotonic() - began


def interrupted(e2e: E2E, after: float, *args: str) -> tuple[int, str]:
    """Run rdc, send its process group SIGINT `after` seconds in; its exit code and stderr."""
    running = start(e2e, *args)
    time.sleep(after)
    with contextlib.suppress(ProcessLookupError):  # it finished first
        os.killpg(running.pid, signal.SIGINT)
    _, err = running.communicate(timeout=120)
    return running.returncode, err


def processes_of(repo: Repo, runtime: layout.RepoRuntime) -> dict[int, int]:
    """Every process whose command line names the repo's run directory, data directory or namespace
    (the gate, its workers, dockerd, containerd, the uplink, the port keeper): pid -> parent pid."""
    marks = [str(runtime.run_dir).encode(), str(runtime.data_dir).encode(), runtime.network.name.encode()]
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if fields[0] == "Z" or not any(mark in cmdline for mark in marks):
            continue
        found[int(entry.name)] = int(fields[1])
    return found


def check_named_truthfully(e2e: E2E, repo: Repo, code: int, err: str, doing: str, before: str) -> None:
    runtime = layout.runtime_for(e2e.machine, repo)
    listed = e2e.rdc("repo", "list", "m1", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout) if r["name"] == LABEL]
    state, parts = status.repo_status(e2e.machine, repo)
    assert row["status"] == state
    named = {int(p.rsplit("pid ", 1)[1].rstrip(")")) for p in parts}
    found = processes_of(repo, runtime)
    unnamed = {pid for pid, parent in found.items() if pid not in named and parent not in named}
    assert not unnamed, (
        f"{doing} interrupted: processes of the repo that `repo list` does not name: {unnamed}"
    )
    if state == "down":
        assert not found, f"{doing} interrupted: listed down, but {found} run"
    if code == 0:
        return
    # Python itself, cut short while it starts (importing `site`), exits 1 saying KeyboardInterrupt.
    starting_python = code == 1 and "init_import_site" in err and "KeyboardInterrupt" in err
    assert code in (EXIT_INTERRUPTED, -signal.SIGINT) or starting_python, f"{doing}: exit {code}: {err}"
    if f"Interrupted while {doing} repo" not in err:
        # Cut short before the command began (Python starting, rdc importing): nothing changed; or
        # after it finished (Python exiting), its last word said so.
        finished = f"Repo {LABEL}@m1 is up." if doing == "starting" else f"of repo {LABEL}@m1."
        assert state == before or finished in err, f"{doing} interrupted with no word: {before} -> {state}"
        return
    assert f"Interrupted while {doing} repo {LABEL}@m1" in err, err
    LANDED.append(doing)
    assert (f"it is {state}" if parts else "nothing of it runs (down)") in err, err


@pytest.fixture(scope="module")
def repo(e2e: E2E) -> Iterator[tuple[Repo, float, float]]:
    created = e2e.rdc("repo", "create", f"{LABEL}@m1")
    assert created.returncode == 0, created.stderr
    found = RepoStore(e2e.machine).get_by_label(LABEL)
    try:
        up, down = timed(e2e, "repo", "up", found.ref), timed(e2e, "repo", "down", found.ref)
        yield found, up, down
    finally:
        e2e.rdc("repo", "down", found.ref)
        e2e.rdc("repo", "delete", found.ref, "--yes")


@pytest.mark.parametrize("point", range(POINTS))
def test_ctrl_c_during_up(e2e: E2E, repo: tuple[Repo, float, float], point: int) -> None:
    found, up, _ = repo
    code, err = interrupted(e2e, up * (point + 0.5) / POINTS, "repo", "up", found.ref)
    try:
        check_named_truthfully(e2e, found, code, err, "starting", "down")
    finally:
        cleaned = e2e.rdc("repo", "down", found.ref)
        assert cleaned.returncode == 0, cleaned.stderr


@pytest.mark.parametrize("point", range(POINTS))
def test_ctrl_c_during_down(e2e: E2E, repo: tuple[Repo, float, float], point: int) -> None:
    found, _, down = repo
    brought_up = e2e.rdc("repo", "up", found.ref)
    assert brought_up.returncode == 0, brought_up.stderr
    code, err = interrupted(e2e, down * (point + 0.5) / POINTS, "repo", "down", found.ref)
    try:
        check_named_truthfully(e2e, found, code, err, "stopping", "up")
    finally:
        cleaned = e2e.rdc("repo", "down", found.ref)
        assert cleaned.returncode == 0, cleaned.stderr


def test_the_interrupts_landed_while_the_commands_worked() -> None:
    """Run after the two above (file order): most points fall inside each command, not after it."""
    if len(LANDED) == 0:
        pytest.skip("run with the tests above")
    assert LANDED.count("starting") >= POINTS // 2 and LANDED.count("stopping") >= POINTS // 2, LANDED
