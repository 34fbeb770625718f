"""Tunnels are keyed by what they reach: never handed out for another config's machine, a machine
registered again elsewhere, or a repo deleted and created again; never reused once the far end is gone.

Each repo's gate is stood in for by a tiny HTTP server on the gate's socket path on the machine, which
answers `/_ping` with the name of the machine root it serves, so a test can see where a tunnel leads.
"""

from __future__ import annotations

import http.client
import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ssh_kit import Client, Fleet

from rediacc_core.repos import RepoStore
from rediacc_core.runtime import layout
from rediacc_core.testing.fakemachine import FakeMachine
from rediacc_core.unixhttp import UnixHTTPConnection


def ok(result: object) -> str:
    assert getattr(result, "returncode", None) == 0, getattr(result, "stderr", result)
    return str(getattr(result, "stdout", ""))


class _PingHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        body = self.server.answer  # type: ignore[attr-defined]
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@contextmanager
def fake_gate(fm: FakeMachine, label: str) -> Iterator[Path]:
    """A stand-in gate for repo `label` of machine `fm`, answering with the machine's name."""
    machine = fm.machine
    path = layout.runtime_for(machine, RepoStore(machine).get_by_label(label)).gate_socket
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    server = socketserver.ThreadingUnixStreamServer(str(path), _PingHandler)
    server.answer = f"{machine.name}:{label}".encode()  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        path.unlink(missing_ok=True)


def reaches(docker_host: str) -> str:
    """What the far end of a DOCKER_HOST answers to `/_ping` (which machine and repo)."""
    conn = UnixHTTPConnection(docker_host.strip().removeprefix("unix://"), timeout=10)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().read().decode()
    except (OSError, http.client.HTTPException) as exc:
        return f"no answer: {exc}"
    finally:
        conn.close()


def shared_clients(fleet: Fleet, tmp: Path) -> tuple[Client, Client]:
    """Two configs of one user: their tunnels share one control directory, as by default."""
    first, second = fleet.new_client(tmp), fleet.new_client(tmp)
    second.env["RDC_SSH_CONTROL_DIR"] = first.env["RDC_SSH_CONTROL_DIR"]
    return first, second


def add_as(fleet: Fleet, client: Client, name: str, machine: str, address: str | None = None) -> None:
    fm = fleet.machines[machine]
    args = ["machine", "add", name, "--ssh", address or fleet.sshd.address, "--root", str(fm.root)]
    ok(client.rdc(*args, "--identity", str(fleet.keys[machine]), "--accept-host-key"))


def test_two_configs_naming_different_roots_fa_get_tunnels_to_their_own_root(
    fleet: Fleet, tmp_path: Path
) -> None:
    ok(fleet.client.rdc("repo", "create", "alpha@m1"))
    ok(fleet.client.rdc("repo", "create", "alpha@m2"))
    first, second = shared_clients(fleet, tmp_path)
    add_as(fleet, first, "fa", "m1")
    add_as(fleet, second, "fa", "m2")
    with fake_gate(fleet.machines["m1"], "alpha"), fake_gate(fleet.machines["m2"], "alpha"):
        here = ok(first.rdc("repo", "docker-host", "alpha@fa"))
        there = ok(second.rdc("repo", "docker-host", "alpha@fa"))
        assert here != there
        assert reaches(here) == "m1:alpha" and reaches(there) == "m2:alpha"
        assert ok(first.rdc("repo", "docker-host", "alpha@fa")) == here  # each found again
        assert ok(second.rdc("repo", "docker-host", "alpha@fa")) == there
        listed = json.loads(ok(second.rdc("repo", "tunnel", "--list", "-o", "json")))
        assert [(t["repo"], t["root"], t["state"]) for t in listed] == [
            ("alpha@fa", str(fleet.machines["m2"].root), "answers")
        ]
    for ref in ("alpha@m1", "alpha@m2"):
        ok(fleet.client.rdc("repo", "delete", ref, "--yes"))


def test_a_machine_registered_again_elsewhere_never_gets_the_old_tunnel(fleet: Fleet, tmp_path: Path) -> None:
    ok(fleet.client.rdc("repo", "create", "beta@m1"))
    ok(fleet.client.rdc("repo", "create", "beta@m2"))
    client = fleet.new_client(tmp_path)
    add_as(fleet, client, "fb", "m1")
    with fake_gate(fleet.machines["m1"], "beta"), fake_gate(fleet.machines["m2"], "beta"):
        old = ok(client.rdc("repo", "env", "beta@fb")).split("=", 1)[1]
        assert reaches(old) == "m1:beta"
        # Registered again by hand (the config edited): another root behind the same name.
        config = Path(client.env["REDIACC_CONFIG"])
        config.write_text(
            config.read_text().replace(str(fleet.machines["m1"].root), str(fleet.machines["m2"].root))
        )
        new = ok(client.rdc("repo", "env", "beta@fb")).split("=", 1)[1]
        assert new != old and reaches(new) == "m2:beta"
        assert not Path(old.strip().removeprefix("unix://")).exists()  # the stale one is closed
        # Removed and added again at another address of the same host: a new tunnel again.
        removed = client.rdc("machine", "remove", "fb")
        assert "Closed 1 tunnel(s) to machine fb." in removed.stderr
        add_as(fleet, client, "fb", "m2", fleet.sshd.address.replace("127.0.0.1", "localhost"))
        again = ok(client.rdc("repo", "docker-host", "beta@fb"))
        assert again.strip() != new.strip() and reaches(again) == "m2:beta"
        assert len(json.loads(ok(client.rdc("repo", "tunnel", "--list", "-o", "json")))) == 1
    for ref in ("beta@m1", "beta@m2"):
        ok(fleet.client.rdc("repo", "delete", ref, "--yes"))


def test_a_repo_deleted_and_created_again_gets_a_new_tunnel(fleet: Fleet, tmp_path: Path) -> None:
    rdc = fleet.client.rdc
    other = fleet.new_client(tmp_path)  # another laptop re-creates the repo behind this one's back
    add_as(fleet, other, "m1", "m1")
    ok(rdc("repo", "create", "gamma@m1"))
    fm = fleet.machines["m1"]
    with fake_gate(fm, "gamma"):
        old = ok(rdc("repo", "docker-host", "gamma@m1"))
        old_id = RepoStore(fm.machine).get_by_label("gamma").id
    ok(other.rdc("repo", "delete", "gamma@m1", "--yes"))
    ok(other.rdc("repo", "create", "gamma@m1"))
    with fake_gate(fm, "gamma"):
        new = ok(rdc("repo", "docker-host", "gamma@m1", "-o", "json"))
        data = json.loads(new)
        assert data["repoId"] != old_id and data["dockerHost"] != old.strip()
        assert reaches(data["dockerHost"]) == "m1:gamma"
        assert not Path(old.strip().removeprefix("unix://")).exists()
    # Deleted through this client: its tunnel goes with it.
    ok(rdc("repo", "delete", "gamma@m1", "--yes"))
    assert json.loads(ok(rdc("repo", "tunnel", "--list", "-o", "json"))) == []


def test_a_tunnel_whose_far_end_is_gone_is_replaced(fleet: Fleet) -> None:
    rdc = fleet.client.rdc
    ok(rdc("repo", "create", "delta@m1"))
    fm = fleet.machines["m1"]
    with fake_gate(fm, "delta"):
        first = ok(rdc("repo", "docker-host", "delta@m1"))
        assert reaches(first) == "m1:delta"
    listed = json.loads(ok(rdc("repo", "tunnel", "--list", "-o", "json")))
    assert [t["state"] for t in listed] == ["no answer"]
    shown = ok(rdc("repo", "tunnel", "--list"))
    assert "delta@m1" in shown and "no answer" in shown
    before = _tunnel_ssh(first)
    replaced = ok(rdc("repo", "docker-host", "delta@m1"))  # asked while nothing answers there
    assert replaced == first  # the same far end, so the same name, but served by a fresh ssh
    assert before and _tunnel_ssh(replaced) and not set(before) & set(_tunnel_ssh(replaced))
    with fake_gate(fm, "delta"):
        assert reaches(replaced) == "m1:delta"
    ok(rdc("repo", "tunnel", "delta@m1", "--close"))
    assert json.loads(ok(rdc("repo", "tunnel", "--list", "-o", "json"))) == []
    ok(rdc("repo", "delete", "delta@m1", "--yes"))


def _tunnel_ssh(docker_host: str) -> list[str]:
    """The pids of the ssh processes serving the tunnel of `docker_host` (named by its control path)."""
    control = docker_host.strip().removeprefix("unix://").removesuffix(".sock") + ".ctl"
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if control.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:  # it ended while we looked
            continue
    return found
