"""The exact create request the installed `docker` CLI sends for `docker run --device <CDI name> ...`.

The benchmark's create scenario replays this body byte for byte, so the gate decodes and re-encodes
what a user's CLI really sends (every HostConfig field, nulls and all), not a hand-trimmed sample.
A throwaway Unix socket answers the CLI's ping like the real daemon, records the create body and
refuses it, which makes the CLI exit without doing anything else.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

# What docker 28 sent on this project's machines (captured the same way); used only when no
# `docker` CLI is installed.
FALLBACK_BODY = {
    "Hostname": "", "Domainname": "", "User": "", "AttachStdin": False, "AttachStdout": True,
    "AttachStderr": True, "Tty": False, "OpenStdin": False, "StdinOnce": False, "Env": None,
    "Cmd": ["true"], "Image": "bb:latest", "Volumes": {}, "WorkingDir": "", "Entrypoint": None,
    "OnBuild": None, "Labels": {},
    "HostConfig": {
        "Binds": None, "ContainerIDFile": "", "LogConfig": {"Type": "", "Config": {}},
        "NetworkMode": "none", "PortBindings": {}, "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
        "AutoRemove": False, "VolumeDriver": "", "VolumesFrom": None, "ConsoleSize": [0, 0],
        "CapAdd": None, "CapDrop": None, "CgroupnsMode": "", "Dns": [], "DnsOptions": [], "DnsSearch": [],
        "ExtraHosts": None, "GroupAdd": None, "IpcMode": "", "Cgroup": "", "Links": None, "OomScoreAdj": 0,
        "PidMode": "", "Privileged": False, "PublishAllPorts": False, "ReadonlyRootfs": False,
        "SecurityOpt": None, "UTSMode": "", "UsernsMode": "", "ShmSize": 0, "Isolation": "", "CpuShares": 0,
        "Memory": 0, "NanoCpus": 0, "CgroupParent": "", "BlkioWeight": 0, "BlkioWeightDevice": [],
        "BlkioDeviceReadBps": [], "BlkioDeviceWriteBps": [], "BlkioDeviceReadIOps": [],
        "BlkioDeviceWriteIOps": [], "CpuPeriod": 0, "CpuQuota": 0, "CpuRealtimePeriod": 0,
        "CpuRealtimeRuntime": 0, "CpusetCpus": "", "CpusetMems": "", "Devices": [], "DeviceCgroupRules": None,
        "DeviceRequests": [
            {"Driver": "cdi", "Count": 0, "DeviceIDs": ["vendor.example/gpu=0"], "Capabilities": None,
             "Options": None}
        ],
        "MemoryReservation": 0, "MemorySwap": 0, "MemorySwappiness": -1, "OomKillDisable": False,
        "PidsLimit": 0, "Ulimits": [], "CpuCount": 0, "CpuPercent": 0, "IOMaximumIOps": 0,
        "IOMaximumBandwidth": 0, "MaskedPaths": None, "ReadonlyPaths": None,
    },
    "NetworkingConfig": {"EndpointsConfig": {}},
}  # fmt: skip


def _serve(listener: socket.socket, api_version: str, found: list[tuple[str, bytes]]) -> None:
    """Answers pings like dockerd and records every other request, until the CLI hangs up."""
    while not found:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            buf = b""
            while not found:
                try:
                    data = conn.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                buf += data
                while b"\r\n\r\n" in buf:
                    head, rest = buf.split(b"\r\n\r\n", 1)
                    lines = head.decode("latin-1").split("\r\n")
                    length = 0
                    for line in lines[1:]:
                        name, _, value = line.partition(":")
                        if name.strip().lower() == "content-length":
                            length = int(value)
                    if len(rest) < length:
                        break
                    body, buf = rest[:length], rest[length:]
                    method, target = lines[0].split(" ")[:2]
                    if target.endswith("/_ping"):
                        pong = b"" if method == "HEAD" else b"OK"
                        conn.sendall(
                            f"HTTP/1.1 200 OK\r\nApi-Version: {api_version}\r\nContent-Type: text/plain\r\n"
                            f"Content-Length: 2\r\n\r\n".encode()
                            + pong
                        )
                        continue
                    found.append((target, body))
                    message = b'{"message":"captured by the benchmark"}'
                    conn.sendall(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                        + f"Content-Length: {len(message)}\r\n\r\n".encode()
                        + message
                    )


def capture_create_body(workdir: Path, api_version: str, image: str, device: str) -> tuple[bytes, str]:
    """(body, how it was obtained). The body is what `docker run --device DEVICE IMAGE true` sends."""
    docker = shutil.which("docker")
    if docker is None:
        return json.dumps(FALLBACK_BODY, separators=(",", ":")).encode(), "built in (no docker CLI here)"
    sock_path = workdir / "capture.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(4)
    listener.settimeout(15)
    found: list[tuple[str, bytes]] = []
    server = threading.Thread(target=_serve, args=(listener, api_version, found), daemon=True)
    server.start()
    env = dict(os.environ, DOCKER_HOST=f"unix://{sock_path}", DOCKER_CONFIG=str(workdir / "docker-cli"))
    version = subprocess.run([docker, "--version"], capture_output=True, text=True).stdout.strip()
    subprocess.run(
        [docker, "run", "--network", "none", "--device", device, image, "true"],
        env=env,
        capture_output=True,
        timeout=30,
    )
    listener.close()
    server.join(5)
    sock_path.unlink(missing_ok=True)
    if not found or "/containers/create" not in found[0][0]:
        return json.dumps(FALLBACK_BODY, separators=(",", ":")).encode(), "built in (capture failed)"
    return found[0][1], f"captured from `{version}`"
