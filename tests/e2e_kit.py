"""Helpers for the end-to-end tests: the environment's parts, docker CLI calls, raw HTTP, checks."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rediacc_core.gate.policy.rules import GUARD_RUNTIME
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.runtime import layout
from rediacc_core.testing.dockerenv import docker_api, docker_unavailable

GPU0 = "vendor.example/gpu=0"
GPU1 = "vendor.example/gpu=1"
RENDER = "rediacc.io/dri=renderD128"
IMAGE = "bb:latest"
HAS_RENDER_PLUGIN = importlib.util.find_spec("rediacc_dri") is not None


ENGINE_PREFIX = os.environ.get("RDC_ENGINE_PREFIX", "")


def use_engine() -> None:
    """With RDC_ENGINE_PREFIX (tox -e e2e-28), the Engine, CLI, containerd and plugins unpacked there
    come first on PATH, for the repo daemons rdc starts and for every CLI call alike."""
    if not ENGINE_PREFIX:
        return
    bins = [f"{ENGINE_PREFIX}/usr/bin", f"{ENGINE_PREFIX}/usr/sbin"]
    path = os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([*bins, *(p for p in path if p not in bins)])


def client_env(base: Path) -> dict[str, str]:
    """The environment of the test's docker CLI: its own config (never the developer's), which
    finds the engine's CLI plugins (buildx, compose) when they live in a private prefix."""
    config = base / "docker-config"
    config.mkdir(parents=True, exist_ok=True)
    if ENGINE_PREFIX:
        plugins = {"cliPluginsExtraDirs": [f"{ENGINE_PREFIX}/usr/libexec/docker/cli-plugins"]}
        (config / "config.json").write_text(json.dumps(plugins))
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(base), "DOCKER_CONFIG": str(config)}


# Set by tox's e2e envs (so by CI): there, a machine that cannot run the suite fails the run. Skipped
# instead, every test would skip and tox would still say OK.
REQUIRED = "RDC_E2E_REQUIRED"


def skip_reason() -> str | None:
    if os.environ.get("RDC_E2E") != "1":
        return "end-to-end tests run with RDC_E2E=1 (tox -e e2e)"
    return docker_unavailable()


def unmet_requirement() -> str | None:
    """Why the suite cannot run where it must (RDC_E2E_REQUIRED=1), or None."""
    reason = skip_reason()
    if reason is None or os.environ.get(REQUIRED) != "1":
        return None
    return f"{REQUIRED}=1, but the end-to-end tests cannot run here: {reason}"


@dataclass
class RepoEnv:
    """One repo that is up: its gate (what users get) and, for checks, its daemon's own socket."""

    repo: Repo
    runtime: layout.RepoRuntime
    env: dict[str, str]

    @property
    def gate(self) -> Path:
        return self.runtime.gate_socket

    @property
    def daemon(self) -> Path:
        return self.runtime.upstream_socket

    def docker(
        self,
        *args: str,
        input: str | bytes | None = None,
        timeout: float = 120,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The real docker CLI, talking to the gate."""
        env = {**self.env, **(extra_env or {})}
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(["docker", *args], input=data, capture_output=True, env=env, timeout=timeout)
        return subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    def compose(
        self, project_dir: Path, *args: str, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return self.docker(
            "compose", "--project-directory", str(project_dir), "-p", project_dir.name, *args, timeout=timeout
        )

    def daemon_api(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
        """Straight to the daemon, bypassing the gate: to check what really exists."""
        return docker_api(self.daemon, method, path, body, Content_Type="application/json")

    def containers(self) -> list[dict[str, Any]]:
        """Every container the daemon has (inspected), whatever the gate said."""
        status, listed = self.daemon_api("GET", "/containers/json?all=1")
        assert status == 200, listed
        found = []
        for entry in listed:
            status, inspected = self.daemon_api("GET", f"/containers/{entry['Id']}/json")
            if status == 200:
                found.append(inspected)
        return found

    def hardware_containers(self, ignore: Sequence[str] = ()) -> list[str]:
        """Containers that carry host hardware in any form; ids in `ignore` are skipped."""
        offenders = []
        for container in self.containers():
            if container["Id"] in ignore:
                continue
            host = container.get("HostConfig") or {}
            problems = []
            if host.get("Privileged"):
                problems.append("privileged")
            if host.get("Devices"):
                problems.append(f"devices {host['Devices']}")
            if host.get("DeviceRequests"):
                problems.append(f"device requests {host['DeviceRequests']}")
            if host.get("DeviceCgroupRules"):
                problems.append("device cgroup rules")
            if (host.get("Runtime") or GUARD_RUNTIME) != GUARD_RUNTIME:
                problems.append(f"runtime {host['Runtime']}")
            for bind in host.get("Binds") or []:
                if bind.split(":")[0].startswith("/dev"):
                    problems.append(f"bind {bind}")
            for mount in container.get("Mounts") or []:
                if str(mount.get("Source", "")).startswith("/dev"):
                    problems.append(f"mount {mount['Source']}")
            if problems:
                offenders.append(f"{container['Name']}: {', '.join(problems)}")
        return offenders

    def container_ids(self) -> set[str]:
        return {c["Id"] for c in self.containers()}


@dataclass
class E2E:
    root: Path
    machine: Machine
    config_path: Path
    alpha: RepoEnv
    beta: RepoEnv

    def rdc(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "REDIACC_CONFIG": str(self.config_path)}
        return subprocess.run(["rdc", *args], capture_output=True, text=True, env=env, timeout=120)

    def grant(self, repo: RepoEnv, device: str) -> None:
        result = self.rdc("repo", "gpu", "grant", repo.repo.ref, "--device", device)
        assert result.returncode == 0, result.stderr

    def revoke(self, repo: RepoEnv, device: str) -> None:
        result = self.rdc("repo", "gpu", "revoke", repo.repo.ref, "--device", device)
        assert result.returncode == 0, result.stderr

    @contextlib.contextmanager
    def extra_repo(self, label: str, *, image: bool = True) -> Iterator[RepoEnv]:
        """A repo of one test's own, created and brought up with the CLI (with IMAGE in its daemon
        unless `image` is False), brought down and deleted after."""
        from rediacc_core.repos import RepoStore
        from rediacc_core.testing.dockerenv import import_busybox

        created = self.rdc("repo", "create", f"{label}@m1")
        assert created.returncode == 0, created.stderr
        repo = RepoStore(self.machine).get_by_label(label)
        try:
            up = self.rdc("repo", "up", repo.ref)
            assert up.returncode == 0, up.stderr
            runtime = layout.runtime_for(self.machine, repo)
            if image:
                import_busybox(runtime.upstream_socket, IMAGE)
            yield RepoEnv(repo, runtime, {**self.alpha.env, "DOCKER_HOST": runtime.docker_host_url})
        finally:
            self.rdc("repo", "down", repo.ref)
            self.rdc("repo", "delete", repo.ref, "--yes")


def _char_device(path: Path, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))


def _cdi_spec(root: Path, kind: str, devices: dict[str, str]) -> dict[str, Any]:
    """A CDI spec mapping each device name to one node: `path` as the container sees it, the
    host node under the fake root."""
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {
                "name": name,
                "containerEdits": {"deviceNodes": [{"path": path, "hostPath": str(root / path.lstrip("/"))}]},
            }
            for name, path in devices.items()
        ],
    }


# The fake GPUs' numbers: harmless nodes a container can really open (so a descriptor of one can be
# held and handed on), that nothing of a repo holds on its own (/dev/null is every process's stdin),
# and different from each other (the runtime guard and the holdings checks go by the number).
FAKEGPU0 = (1, 7)  # /dev/full's
FAKEGPU1 = (1, 8)  # /dev/random's


def build_machine_root(root: Path) -> None:
    """Fake GPUs: device nodes by mknod (FAKEGPU0 and FAKEGPU1) and their CDI specs."""
    cdi = root / "etc" / "cdi"
    cdi.mkdir(parents=True)
    _char_device(root / "dev" / "fakegpu0", *FAKEGPU0)
    _char_device(root / "dev" / "fakegpu1", *FAKEGPU1)
    spec = _cdi_spec(root, "vendor.example/gpu", {"0": "/dev/fakegpu0", "1": "/dev/fakegpu1"})
    (cdi / "vendor-example.json").write_text(json.dumps(spec, indent=2))
    if HAS_RENDER_PLUGIN:
        _char_device(root / "dev" / "dri" / "renderD128", 226, 128)
        render = _cdi_spec(root, "rediacc.io/dri", {"renderD128": "/dev/dri/renderD128"})
        (cdi / "rediacc-render.json").write_text(json.dumps(render, indent=2))


CARD = "0000:01:00.0"  # where `placed_gpu0` places GPU 0
XID = "[ 5123.456789] NVRM: Xid (PCI:0000:01:00): 79, pid=2411, name=python3, GPU has fallen off the bus."


@contextlib.contextmanager
def placed_gpu0(machine: Machine) -> Iterator[None]:
    """An inventory placing GPU0 on the card at `CARD`, as setup would record it; the previous one
    (or none) is back after."""
    from rediacc_core.inventory import gpu_record, write_inventory
    from rediacc_core.model import Gpu

    path = machine.inventory_path
    before = path.read_text() if path.exists() else None
    gpu = Gpu(vendor="vendor", source="e2e", name="Fake", index=0, pci_bus_id=CARD, cdi_names=(GPU0,))
    document = {
        "schemaVersion": 1,
        "machine": machine.name,
        "platform": "native",
        "generatedAt": "2026-12-04T00:00:00Z",
        "gpus": [gpu_record(gpu, frozenset({GPU0}))],
        "devices": [{"name": GPU0, "kind": "vendor.example/gpu", "spec": "vendor-example.json"}],
    }
    write_inventory(machine, document)
    try:
        yield
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Whether `predicate` came true before `timeout` seconds (polled: what it waits on runs apart)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A docker CLI call the gate refused, with each of `needles` in what the user was told."""
    assert result.returncode != 0, f"admitted: {result.stdout}"
    assert "Error response from daemon" in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


# --- raw HTTP over the gate socket ----------------------------------------------------------------


def raw_exchange(sock_path: Path, request: bytes, timeout: float = 30) -> tuple[int, bytes]:
    """Send bytes exactly as given; return the status and body of the one response."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(sock_path))
    try:
        with contextlib.suppress(OSError):  # the gate may answer (and close) before reading it all
            sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                break
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while length is not None and len(body) < length:
            piece = sock.recv(65536)
            if not piece:
                break
            body += piece
        return int(head.split()[1]), body
    finally:
        sock.close()


def post(path: str, body: bytes, *extra_headers: str, content_type: str = "application/json") -> bytes:
    headers = [
        "Host: docker",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        *extra_headers,
    ]
    return (
        f"POST {path} HTTP/1.1\r\n".encode() + "".join(h + "\r\n" for h in headers).encode() + b"\r\n" + body
    )


# --- BuildKit's gRPC API, spoken by hand --------------------------------------------------------


def h2c_upgrade(path: str) -> bytes:
    """BuildKit's h2c upgrade request for `path`, as buildx sends it."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
        "X-Docker-Expose-Session-Uuid: e2e\r\nX-Docker-Expose-Session-Name: e2e\r\n"
        "X-Docker-Expose-Session-Sharedkey: e2e\r\n\r\n".encode()
    )


def buildkit_call(
    sock_path: Path, method: str, message: bytes, timeout: float = 30, *, compressed: bool = False
) -> tuple[int, str]:
    """One unary call on `/grpc` through the gate; its grpc-status and grpc-message. `compressed`:
    the message gzipped, flagged so, under `grpc-encoding: gzip` (as a client with compression on)."""
    import gzip
    import urllib.parse

    import h2.config
    import h2.connection
    import h2.events

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(sock_path))
    try:
        sock.sendall(h2c_upgrade("/grpc"))
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            assert piece, data
            data += piece
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"), (b":scheme", b"http"), (b":path", method.encode()),
            (b":authority", b"docker"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
        ]  # fmt: skip
        if compressed:
            headers.append((b"grpc-encoding", b"gzip"))
            message = gzip.compress(message)
        conn.send_headers(stream, headers)
        flag = b"\x01" if compressed else b"\x00"
        conn.send_data(stream, flag + len(message).to_bytes(4, "big") + message, end_stream=True)
        sock.sendall(conn.data_to_send())
        found: dict[bytes, bytes] = {}
        while True:
            events = conn.receive_data(rest) if rest else []
            rest = b""
            for event in events:
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    found.update(dict(event.headers or []))
                if isinstance(event, h2.events.DataReceived):
                    conn.acknowledge_received_data(event.flow_controlled_length or 0, stream)
                if (
                    isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset))
                    and event.stream_id == stream
                ):
                    status = int(found.get(b"grpc-status", b"-1"))
                    return status, urllib.parse.unquote(found.get(b"grpc-message", b"").decode())
            sock.sendall(conn.data_to_send())
            rest = sock.recv(65536)
            assert rest, f"the gate closed the connection; headers so far {found}"
    finally:
        sock.close()
