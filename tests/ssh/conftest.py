"""A real OpenSSH server on this host serving two simulated machines, and `rdc` clients for it.

Runs with RDC_SSH=1 (tox -e ssh), as root, with OpenSSH installed (.ci/install-ssh.sh). The
machines `m1` and `m2` are demo machines (every installed plugin's hardware) under one temporary
directory; each has the test's own `rdc-agent` linked where `rdc machine install` would put it, and
logs in with its own key, whose sessions get that machine's stand-in tools first on PATH.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ssh_kit import MACHINES, REQUIRED, Client, Fleet, install_agent, skip_reason, unmet_requirement
from suite_guard import RequiredSuite

from rediacc_core.demo import build_demo_machine
from rediacc_core.remote import resident
from rediacc_core.testing.fakemachine import FakeMachine
from rediacc_core.testing.sshd import running_sshd

# Where RDC_SSH_REQUIRED=1 (tox -e ssh, CI): a machine that cannot run the suite is a usage error,
# and a skipped test a failure unless allowed_skips.txt names it.
GUARD = RequiredSuite("SSH", Path(__file__).parent, REQUIRED, lambda: unmet_requirement(skip_reason()))


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(GUARD):
        config.pluginmanager.register(GUARD, "rdc-ssh-required")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = skip_reason()
    for item in items:
        if here in item.path.parents and reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def machine_roots() -> Iterator[dict[str, FakeMachine]]:
    if skip_reason() is not None:
        pytest.skip(skip_reason() or "")
    base = Path(tempfile.mkdtemp(prefix="rdc-ssh-", dir="/tmp"))
    built = {}
    for name in MACHINES:
        fm = build_demo_machine(base / name, name=name).fake
        install_agent(fm.root)
        built[name] = fm
    yield built
    for fm in built.values():
        resident.stop(str(fm.root))
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fleet(machine_roots: dict[str, FakeMachine], tmp_path: Path) -> Iterator[Fleet]:
    """sshd serving m1 and m2, and a client that added both and trusted the host key."""
    with running_sshd(tmp_path / "sshd") as server:
        keys = {name: server.authorize(name, fm.bin_dir) for name, fm in machine_roots.items()}
        fleet = Fleet(server, machine_roots, keys, Client(tmp_path))
        fleet.client = fleet.new_client(tmp_path)
        try:
            for name in machine_roots:
                added = fleet.add(fleet.client, name, "--accept-host-key")
                assert added.returncode == 0, added.stderr
            yield fleet
        finally:
            server.stop()  # ends every master connection of every client
            for home in fleet.homes:
                shutil.rmtree(home, ignore_errors=True)
