"""What the daemon would fetch on the tenant's behalf: no git clone, and nothing from the host itself
(loopback, link-local, "this host") unless the machine allows that registry."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from rediacc_core.gate.policy import fetches
from rediacc_core.gate.policy.endpoints import resolve
from rediacc_core.gate.server import GateServer
from rediacc_core.settings import set_setting, unset_setting


@pytest.mark.parametrize(
    ("remote", "git"),
    [
        # moby's urlutil.IsGitURL
        ("git://example.com/app", True),
        ("git@example.com:org/app.git", True),
        ("github.com/org/app", True),
        ("https://example.com/org/app.git", True),
        ("http://example.com/org/app.git#main:docker", True),
        ("https://example.com/org/app.git#v1", True),
        # and more, matched without regard to case (refusing more is safe)
        ("ssh://git@example.com/org/app", True),
        ("git+ssh://example.com/app", True),
        ("GIT@example.com:app", True),
        ("HTTPS://example.com/app.GIT", True),
        # tarballs and Dockerfiles over http(s): fetched, not cloned
        ("https://example.com/context.tar.gz", False),
        ("https://example.com/app.git/Dockerfile", False),
        ("http://example.com/app.git#", False),  # moby's fragment needs a character
        ("", False),
    ],
)
def test_git_remotes_are_every_form_moby_clones(remote: str, git: bool) -> None:
    assert fetches.is_git_remote(remote) is git


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("127.1", "loopback"),  # glibc's resolver reads these forms as 127.0.0.1
        ("2130706433", "loopback"),
        ("0x7f.0.0.1", "loopback"),
        ("0177.0.0.1", "loopback"),
        ("localhost", "loopback name"),
        ("app.localhost", "loopback name"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("0.0.0.0", "0.0.0.0/8"),  # connecting to it reaches the host's own services
        ("0", "0.0.0.0/8"),
        ("::", "loopback or unspecified"),
        ("\uff11\uff12\uff17.0.0.1", "non-ASCII"),  # full-width digits, mapped to ASCII before dialling
        ("registry.example.com", None),
        ("8.8.8.8", None),
        ("2001:db8::1", None),
        ("10.1.2.3", None),  # a private address is not the host's own: the network namespace's part
        ("127.0.0.1.example.com", None),  # a name: what DNS says is not visible here
    ],
)
def test_the_host_itself(host: str, local: str | None) -> None:
    why = fetches.local_reason(host)
    assert (why is None) if local is None else (why is not None and local in why)


def test_the_machines_own_name_is_the_host_itself() -> None:
    assert fetches.local_reason(socket.gethostname().lower()) == "this machine's own name"


@pytest.mark.parametrize(
    ("reference", "registry"),
    [
        ("busybox", None),
        ("library/busybox", None),
        ("org/app:1", None),
        ("registry.example.com/app", "registry.example.com"),
        ("127.0.0.1:5000/app", "127.0.0.1:5000"),
        ("localhost/app", "localhost"),
        ("LOCALHOST/app", "LOCALHOST"),  # capitals: moby reads a domain there
        ("[::1]:5000/app", "[::1]:5000"),
    ],
)
def test_the_registry_a_reference_names(reference: str, registry: str | None) -> None:
    assert fetches.registry_of(reference) == registry


REFUSED = [
    ("POST", "/v1.45/images/create?fromImage=127.0.0.1:5000/app&tag=latest"),
    ("POST", "/v1.45/images/create?fromImage=localhost:5000/app"),
    ("POST", "/v1.45/images/create?fromImage=%5B::1%5D:5000/app"),
    ("POST", "/v1.45/images/create?fromImage=127.1:5000/app"),
    ("POST", "/v1.45/images/create?fromImage=169.254.169.254/latest"),
    ("POST", "/v1.45/images/create?fromImage=busybox&fromImage=localhost:5000/app"),  # every value
    ("POST", "/v1.45/images/create?fromSrc=http://127.0.0.1:8080/rootfs.tar"),
    ("POST", "/v1.45/images/create?fromSrc=127.0.0.1:8080/rootfs.tar"),  # no scheme: http:// to it
    ("POST", "/v1.45/images/create?fromSrc=localhost:8080"),
    ("POST", "/v1.45/images/create?fromSrc=HTTP://%5B::1%5D/x"),
    ("POST", "/v1.45/images/create?fromSrc=http://user@127.0.0.1/x"),
    ("POST", "/v1.45/images/create?fromSrc=http://169.254.169.254/latest/meta-data/"),
    ("POST", "/v1.45/images/127.0.0.1:5000/app/push?tag=1"),
    ("GET", "/v1.45/distribution/localhost:5000/app/json"),
    ("GET", "/v1.45/images/search?term=127.0.0.1:5000/app"),
    ("GET", "/v1.45/plugins/privileges?remote=localhost:5000/plugin"),
    ("POST", "/v1.45/build?remote=http://127.0.0.1:8000/context.tar"),
    ("POST", "/v1.45/build?remote=https://169.254.169.254/latest"),
]
ADMITTED = [
    ("POST", "/v1.45/images/create?fromImage=busybox&tag=latest"),
    ("POST", "/v1.45/images/create?fromImage=registry.example.com/app"),
    ("POST", "/v1.45/images/create?fromSrc=-&repo=imported"),
    ("POST", "/v1.45/images/create?fromSrc=https://example.com/rootfs.tar"),
    ("POST", "/v1.45/images/app/push?tag=1"),
    ("POST", "/v1.45/images/registry.example.com/app/push"),
    ("GET", "/v1.45/distribution/busybox/json"),
    ("GET", "/v1.45/images/search?term=busybox"),
    ("GET", "/v1.45/plugins/privileges?remote=vieux/sshfs"),
    ("POST", "/v1.45/build?remote=https://example.com/context.tar.gz"),
    ("POST", "/v1.45/build?t=app"),
]


@pytest.mark.parametrize(("method", "target"), REFUSED)
def test_fetches_from_the_host_itself_are_refused_from_the_head(gate: Any, method: str, target: str) -> None:
    decision = gate.decider.head(resolve(method, target))
    assert decision is not None and decision.status == 403 and decision.rules == ("fetch-address",)
    assert "the daemon would fetch from it as the host's root" in decision.message
    assert "--set registries=" in decision.message


@pytest.mark.parametrize(("method", "target"), ADMITTED)
def test_fetches_from_elsewhere_pass(gate: Any, method: str, target: str) -> None:
    assert gate.decider.head(resolve(method, target)) is None
    assert not gate.decider.inspects(resolve(method, target))  # the body (an image tarball) streams


@pytest.mark.parametrize(
    "remote",
    [
        "git@example.com:org/app.git",
        "https://example.com/org/app.git",  # its .gitmodules could name ssh://git@... (host keys)
        "http://example.com/org/app.git%23main:docker",
        "git://example.com/app",
        "github.com/org/app",
        "ssh://git@example.com/app",
    ],
)
def test_git_build_remotes_are_refused(gate: Any, remote: str) -> None:
    decision = gate.decider.head(resolve("POST", f"/v1.45/build?remote={remote}"))
    assert decision is not None and decision.rules == ("git-remote",)
    assert decision.message == (
        f"build remote={remote.replace('%23', '#')} is refused: the daemon would clone it with git as the "
        "host's root (with the host's SSH keys, and submodules over any protocol); use instead: the "
        "context sent from your machine (docker build <dir>), or an http(s) tarball URL"
    )


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1:5000", True),
        ("http://localhost:5000/v2/", True),
        ("https://[::1]:5000", True),
        ("169.254.169.254", True),
        ("user@127.0.0.1", True),
        ("https://index.docker.io/v1/", False),
        ("registry.example.com", False),
        ("", False),
    ],
)
def test_login_to_the_host_itself_is_refused(gate: Any, address: str, refused: bool) -> None:
    body = {"username": "u", "password": "p", "serveraddress": address}
    decision = gate.post("/v1.45/auth", body)
    if refused:
        assert (decision.forward, decision.status, decision.rules) == (False, 403, ("fetch-address",))
        assert "login serveraddress" in decision.message
    else:
        assert decision.forward and json.loads(decision.body) == body


def test_a_login_body_is_read_as_the_daemon_reads_it(gate: Any) -> None:
    # Go matches JSON keys to fields without regard to case: this is the serveraddress.
    decision = gate.post("/v1.45/auth", {"ServerAddress": "localhost:5000"})
    assert decision.status == 403
    ambiguous = gate.post("/v1.45/auth", raw=b'{"serveraddress":"x.example","ServerAddress":"localhost"}')
    assert ambiguous.status == 400


class TestTheMachinesRegistries:
    def test_a_registry_the_machine_allows_passes_on_its_port_only(self, gate: Any) -> None:
        set_setting(gate.fm.machine, "registries", "127.0.0.1:5000")
        assert gate.decider.head(resolve("POST", "/images/create?fromImage=127.0.0.1:5000/app")) is None
        assert gate.decider.head(resolve("POST", "/images/create?fromImage=127.0.0.1:5001/app")) is not None
        assert gate.decider.head(resolve("POST", "/images/create?fromImage=localhost:5000/app")) is not None

    def test_a_host_without_a_port_allows_each_port(self, gate: Any) -> None:
        set_setting(gate.fm.machine, "registries", "localhost,[::1]:5000")
        assert gate.decider.head(resolve("POST", "/images/create?fromImage=localhost:5000/app")) is None
        assert gate.decider.head(resolve("POST", "/images/create?fromImage=LOCALHOST:6000/app")) is None
        # port 80
        assert gate.decider.head(resolve("POST", "/images/create?fromSrc=http://localhost/x")) is None
        assert gate.decider.head(resolve("GET", "/images/search?term=%5B::1%5D:5000/app")) is None
        assert gate.decider.head(resolve("GET", "/images/search?term=%5B::1%5D:5001/app")) is not None

    def test_a_url_matches_its_schemes_default_port(self, gate: Any) -> None:
        set_setting(gate.fm.machine, "registries", "127.0.0.1:80")
        assert gate.decider.head(resolve("POST", "/build?remote=http://127.0.0.1/context.tar")) is None
        assert gate.decider.head(resolve("POST", "/build?remote=https://127.0.0.1/context.tar")) is not None

    def test_the_allowance_never_admits_a_git_clone(self, gate: Any) -> None:
        set_setting(gate.fm.machine, "registries", "127.0.0.1")
        decision = gate.decider.head(resolve("POST", "/build?remote=http://127.0.0.1/app.git"))
        assert decision is not None and decision.rules == ("git-remote",)

    def test_the_gate_does_not_remember_what_the_setting_decides(self, gate: Any, short_dir: Path) -> None:
        server = GateServer(short_dir / "gate.sock", short_dir / "up.sock", gate.decider)
        target = "/v1.45/images/create?fromImage=127.0.0.1:5000/app"
        assert server.route("POST", target)[0] is not None
        set_setting(gate.fm.machine, "registries", "127.0.0.1:5000")
        assert server.route("POST", target)[0] is None
        unset_setting(gate.fm.machine, "registries")
        assert server.route("POST", target)[0] is not None

    @pytest.mark.parametrize(
        ("method", "target", "remembered"),
        [
            ("GET", "/v1.45/containers/json", True),
            ("POST", "/v1.45/containers/create", True),
            ("POST", "/v1.45/swarm/init", True),
            ("GET", "/v1.45/nothing/here", True),
            ("POST", "/v1.45/build?t=x", False),
            ("POST", "/v1.45/images/create?fromImage=busybox", False),
            ("POST", "/v1.45/images/app/push", False),
        ],
    )
    def test_which_answers_are_remembered(
        self, gate: Any, method: str, target: str, remembered: bool
    ) -> None:
        assert gate.decider.remembers(resolve(method, target)) is remembered
