"""Where a repo's daemon and gate live, how the daemon is configured, and image lookups for rules."""

from __future__ import annotations

import json
import shutil
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from rediacc_core.errors import ValidationError
from rediacc_core.gate.decide.images import ImageConfigs
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.runtime import daemon, layout, lifecycle
from rediacc_core.settings import change_settings


def make_repo(docker_host: str | None = None) -> Repo:
    return Repo(
        "6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11", "alpha", None, "m1", docker_host, "2026-01-01T00:00:00Z"
    )


def test_a_repo_runs_under_the_machines_run_dir(tmp_path: Path) -> None:
    machine = Machine("m1", Path("/tmp/m"))
    runtime = layout.runtime_for(machine, make_repo())
    assert runtime.run_dir == Path("/tmp/m/run/rediacc/6f1d0d6e3a57")
    assert runtime.gate_socket == runtime.run_dir / "gate.sock"
    assert runtime.daemon_paths.socket == runtime.run_dir / "d" / "docker.sock"
    assert runtime.daemon_paths.data_root == Path(
        "/tmp/m/var/lib/rediacc/repos/6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11/docker"
    )
    assert runtime.docker_host_url == f"unix://{runtime.gate_socket}"
    assert runtime.owns_daemon and runtime.upstream_socket == runtime.daemon_paths.socket


def test_a_deep_machine_root_moves_the_sockets_somewhere_short() -> None:
    machine = Machine("m1", Path("/tmp/" + "deep/" * 20))
    runtime = layout.runtime_for(machine, make_repo())
    assert runtime.run_dir.name.endswith("6f1d0d6e3a57")
    assert not runtime.daemon_paths.too_long()
    assert len(str(runtime.gate_socket)) <= layout.SOCKET_PATH_MAX
    assert str(runtime.data_dir).startswith(str(machine.root))  # data stays on the machine


def test_a_repo_on_an_existing_daemon_forwards_to_that_socket() -> None:
    runtime = layout.runtime_for(Machine("m1", Path("/tmp/m")), make_repo("unix:///var/run/other.sock"))
    assert not runtime.owns_daemon
    assert runtime.upstream_socket == Path("/var/run/other.sock")


def test_the_daemon_reads_cdi_specs_only_from_the_machine_and_keeps_to_itself() -> None:
    paths = layout.DaemonPaths(Path("/tmp/w"), Path("/tmp/data"))
    config = daemon.daemon_config(Path("/tmp/m"), paths)
    assert config["features"] == {"cdi": True}
    assert config["cdi-spec-dirs"] == ["/tmp/m/etc/cdi"]
    # The host's netfilter left alone, IPv6's too (Engine 28's ip6tables is on unless said).
    assert (config["bridge"], config["iptables"], config["ip6tables"]) == ("none", False, False)
    assert config["data-root"] == "/tmp/data" and config["exec-root"] == "/tmp/w/exec"
    assert config["pidfile"] == "/tmp/w/dockerd.pid" and config["hosts"] == ["unix:///tmp/w/docker.sock"]


def test_the_daemon_narrows_what_a_request_can_ask_by_default() -> None:
    config = daemon.daemon_config(Path("/tmp/m"), layout.DaemonPaths(Path("/tmp/w"), Path("/tmp/data")))
    assert config["no-new-privileges"] is True
    assert (config["default-cgroupns-mode"], config["default-ipc-mode"]) == ("private", "private")
    assert config["builder"] == {"entitlements": {"network-host": False, "security-insecure": False}}
    assert (config["userland-proxy"], config["ip-forward"], config["live-restore"]) == (False, False, False)


def test_the_image_store_setting_puts_images_in_the_repos_own_containerd(tmp_path: Path) -> None:
    paths = layout.DaemonPaths(tmp_path / "w", tmp_path / "data")
    daemon.prepare(tmp_path, paths)
    assert json.loads(paths.config.read_text())["features"] == {"cdi": True}  # overlay2, the default
    change_settings(Machine("m1", tmp_path), [("image-store", "containerd")])
    daemon.prepare(tmp_path, paths)
    written = json.loads(paths.config.read_text())
    assert written["features"] == {"cdi": True, "containerd-snapshotter": True}
    assert written["containerd"] == str(paths.containerd_socket)  # never the host's


@pytest.mark.skipif(shutil.which("dockerd") is None, reason="needs Docker Engine's dockerd")
@pytest.mark.parametrize("in_a_namespace", [False, True], ids=["host-namespace", "own-namespace"])
def test_the_installed_dockerd_accepts_every_key_of_the_repo_daemon_configuration(
    tmp_path: Path, in_a_namespace: bool
) -> None:
    paths = layout.DaemonPaths(tmp_path / "w", tmp_path / "data")
    network = layout.network_for("0123456789ab", tmp_path / "run") if in_a_namespace else None
    daemon.prepare(tmp_path, paths, network=network)
    checked = subprocess.run(
        ["dockerd", "--validate", "--config-file", str(paths.config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    assert "configuration OK" in checked.stdout + checked.stderr


def test_socket_paths_that_do_not_fit_are_refused_before_anything_starts(tmp_path: Path) -> None:
    paths = layout.DaemonPaths(tmp_path / ("x" * 100), tmp_path / "data")
    with pytest.raises(ValidationError, match="too long"):
        daemon.prepare(tmp_path, paths)


def test_the_gate_runs_as_a_module_of_this_python() -> None:
    machine = Machine("m1", Path("/tmp/m"))
    repo = make_repo()
    argv = lifecycle.gate_argv(machine, repo, layout.runtime_for(machine, repo))
    assert argv[:3] == [sys.executable, "-m", "rediacc_core.runtime.serve"]
    assert "--repo-id" in argv and repo.id in argv


@pytest.mark.parametrize(
    ("unit", "command"),
    [
        ("rediacc-repo-dockerd@.service", "rdc repo dockerd %I"),
        ("rediacc-repo-gate@.service", "rdc repo gate run %I"),
    ],
)
def test_systemd_unit_templates_ship_with_the_package(unit: str, command: str) -> None:
    text = resources.files("rediacc_core.runtime").joinpath("units", unit).read_text(encoding="utf-8")
    assert command in text and "[Install]" in text


# --- image lookups ------------------------------------------------------------------------------
class _Images(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    requests = 0


class _ImageHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Images

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.requests += 1
        known = {"/images/bb:latest/json", "/images/sha256:" + "a" * 64 + "/json"}
        if self.path in known:
            body = json.dumps({"Id": "sha256:" + "a" * 64, "Config": {"Env": ["A=1"]}}).encode()
            self.send_response(200)
        else:
            body = b'{"message":"No such image"}'
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def images(tmp_path: Path) -> Iterator[_Images]:
    server = _Images(str(tmp_path / "i.sock"), _ImageHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_image_config_comes_from_the_daemon(images: _Images, tmp_path: Path) -> None:
    lookup = ImageConfigs(tmp_path / "i.sock")
    assert lookup("bb:latest") == {"Env": ["A=1"]}
    assert lookup("missing:1") is None


def test_image_ids_are_cached_names_are_not(images: _Images, tmp_path: Path) -> None:
    lookup = ImageConfigs(tmp_path / "i.sock")
    lookup("bb:latest")
    lookup("bb:latest")
    assert images.requests == 2  # a tag may move: asked every time
    lookup("sha256:" + "a" * 64)
    assert images.requests == 2  # content named by its id never changes


def test_image_config_is_none_when_the_daemon_is_down(tmp_path: Path) -> None:
    assert ImageConfigs(tmp_path / "nothing.sock", timeout=0.5)("bb:latest") is None


def test_an_empty_image_reference_is_not_looked_up(tmp_path: Path) -> None:
    assert ImageConfigs(tmp_path / "nothing.sock", timeout=0.5)("") is None


def test_a_crashed_daemons_marker_is_cleared_before_the_next_start(tmp_path: Path) -> None:
    """dockerd killed by SIGKILL leaves `unmount-on-shutdown`: the next start undoes its bind (here
    there is none to undo: the data-root is no mount point) and removes the marker."""
    paths = layout.DaemonPaths(tmp_path / "w", tmp_path / "data")
    paths.exec_root.mkdir(parents=True)
    paths.data_root.mkdir()
    assert daemon.undo_crashed_bind(paths) is False  # no marker: nothing to do
    (paths.exec_root / "unmount-on-shutdown").write_text("")
    assert daemon.undo_crashed_bind(paths) is False  # not a mount point: nothing unmounted
    assert not (paths.exec_root / "unmount-on-shutdown").exists()


# --- Ctrl-C during `rdc repo up` ---------------------------------------------------------------------


@pytest.fixture
def interrupted_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """`repo up` of a down repo cut by Ctrl-C while it starts its parts; what `repo down` was asked."""
    from rediacc_core.runtime import filesmount

    downs: list[str] = []
    monkeypatch.setattr(filesmount, "secure_repo", lambda machine, repo_id: None)
    monkeypatch.setattr(lifecycle, "_refuse_autoallowed_devices", lambda machine, repo: None)

    def cut(*args: Any) -> layout.RepoRuntime:
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle, "_start", cut)

    def down(machine: Machine, repo: Repo) -> list[str]:
        downs.append(repo.ref)
        return []

    monkeypatch.setattr(lifecycle, "repo_down", down)
    return downs


def test_ctrl_c_during_up_stops_what_it_started(interrupted_up: list[str], tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        lifecycle.repo_up(Machine("m1", tmp_path), make_repo())
    assert interrupted_up == ["alpha@m1"]


def test_ctrl_c_during_up_leaves_alone_what_ran_before(
    interrupted_up: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "running_parts", lambda machine, repo: ["dockerd (pid 42)"])
    with pytest.raises(KeyboardInterrupt):
        lifecycle.repo_up(Machine("m1", tmp_path), make_repo())
    assert interrupted_up == []


def test_ctrl_c_during_up_names_what_it_could_not_stop_and_the_command(
    interrupted_up: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rediacc_core.errors import StateError

    def stuck(machine: Machine, repo: Repo) -> list[str]:
        raise StateError("repo alpha@m1 still has, after stopping its daemon: sleep (pid 7)", "...")

    monkeypatch.setattr(lifecycle, "repo_down", stuck)
    with pytest.raises(StateError) as raised:
        lifecycle.repo_up(Machine("m1", tmp_path), make_repo())
    assert "interrupted while starting repo alpha@m1" in raised.value.what
    assert "sleep (pid 7)" in raised.value.what
    assert raised.value.todo == "rdc repo down alpha@m1"
