"""The SSH tests' kit: clients (one config and known_hosts each) and the fleet they reach."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rediacc_core.testing.fakemachine import FakeMachine
from rediacc_core.testing.sshd import Sshd, sshd_unavailable

SSH_ENV = "RDC_SSH"
MACHINES = ("m1", "m2")
BIN = Path(sys.executable).parent


# Set by tox's ssh env (so by CI): there, a machine that cannot run the suite, or its docker test,
# fails the run instead of skipping it.
REQUIRED = "RDC_SSH_REQUIRED"


def skip_reason() -> str | None:
    if os.environ.get(SSH_ENV) != "1":
        return f"SSH tests run with {SSH_ENV}=1 (tox -e ssh)"
    return sshd_unavailable()


def unmet_requirement(reason: str | None) -> str | None:
    """`reason` to skip, as an error where the suite must run (RDC_SSH_REQUIRED=1), or None."""
    if reason is None or os.environ.get(REQUIRED) != "1":
        return None
    return f"{REQUIRED}=1, but the SSH tests cannot run here: {reason}"


def install_agent(root: Path) -> Path:
    """This test run's rdc-agent, where `rdc machine install` puts it under a simulated root."""
    agent = root / "opt/rediacc/bin/rdc-agent"
    agent.parent.mkdir(parents=True, exist_ok=True)
    if not agent.is_symlink():
        agent.symlink_to(BIN / "rdc-agent")
    return agent


@dataclass
class Client:
    """One laptop: its own config file, known_hosts and SSH master connections."""

    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def rdc(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "rdc"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(BIN / "rdc"), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    @property
    def known_hosts(self) -> Path:
        return self.home / "config" / "known_hosts"


@dataclass
class Fleet:
    sshd: Sshd
    machines: dict[str, FakeMachine]
    keys: dict[str, Path]
    client: Client
    homes: list[Path] = field(default_factory=list)

    def add(self, client: Client, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        fm = self.machines[name]
        args = ["machine", "add", name, "--ssh", self.sshd.address, "--root", str(fm.root)]
        return client.rdc(*args, "--identity", str(self.keys[name]), *extra)

    def new_client(self, tmp: Path) -> Client:
        # Short paths: master sockets live in the control directory.
        home = Path(tempfile.mkdtemp(prefix="rdc-c-", dir="/tmp"))
        env = dict(os.environ)
        env.update(
            REDIACC_CONFIG=str(home / "config" / "config.yaml"),
            RDC_SSH_CONTROL_DIR=str(home / "cm"),
            COLUMNS="200",
            # Resident agents of the test machines stop soon after the tests that used them.
            RDC_AGENT_IDLE="20",
        )
        env.pop("REDIACC_LOAD_PLUGINS", None)
        self.homes.append(home)
        return Client(home, env)
