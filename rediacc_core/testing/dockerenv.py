"""A private Docker Engine for end-to-end tests and the benchmark, with a tiny busybox image.

    reason = docker_unavailable()            # None when a CDI-capable dockerd can run here
    with private_dockerd(root, workdir) as d:  # d.socket answers the Docker API
        import_busybox(d.socket)             # bb:latest, from the busybox-static binary

The daemon is the one `rdc repo up` runs (`rediacc_core.runtime.daemon.start_dockerd`): CDI specs
from `<root>/etc/cdi` only, its own data and exec roots, no bridge, no iptables. Keep `workdir`
short: the daemon's sockets must fit in 107 bytes.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rediacc_core import unixhttp
from rediacc_core.runtime.daemon import RunningDaemon, start_dockerd

MIN_DOCKERD = 25
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


def dockerd_version(dockerd: str = "dockerd") -> int | None:
    """The major version of the installed dockerd, or None."""
    path = shutil.which(dockerd)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"version (\d+)\.", out)
    return int(found.group(1)) if found else None


def static_busybox() -> Path | None:
    """A statically linked busybox (it must run in an image holding nothing else)."""
    for candidate in BUSYBOX_CANDIDATES:
        path = Path(candidate)
        if path.is_file():
            head = path.read_bytes()[:4096]
            # A dynamic ELF names its interpreter; a static one does not.
            if b"ld-linux" not in head and b"/lib64/ld" not in head:
                return path
    return None


def docker_unavailable() -> str | None:
    """Why a private CDI-capable daemon cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (a Docker daemon is started)"
    version = dockerd_version()
    if version is None:
        return "dockerd is not installed (bash .ci/install-docker.sh)"
    if version < MIN_DOCKERD:
        return f"dockerd {version} has no CDI support; need >= {MIN_DOCKERD}"
    if static_busybox() is None:
        return "a static busybox is not installed (apt-get install busybox-static)"
    return None


@contextmanager
def private_dockerd(root: Path, workdir: Path, **kwargs: Any) -> Iterator[RunningDaemon]:
    """A dockerd for the machine rooted at `root`, stopped (with its containers) on exit."""
    daemon = start_dockerd(root, workdir, **kwargs)
    try:
        yield daemon
    finally:
        daemon.stop()


def busybox_tar(busybox: Path | None = None) -> bytes:
    """A root filesystem tarball: busybox and a link per applet, /tmp and a minimal /etc."""
    binary = busybox or static_busybox()
    if binary is None:
        raise FileNotFoundError("no static busybox found")
    applets = subprocess.run(
        [str(binary), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))

        for directory in ("bin", "etc", "dev", "proc", "sys"):
            add_dir(directory)
        add_dir("tmp", 0o1777)
        add_file("bin/busybox", binary.read_bytes(), 0o755)
        for applet in sorted(set(applets) - {"busybox"}):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            tar.addfile(link)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        add_file("etc/group", b"root:x:0:\nvideo:x:44:\nrender:x:105:\n")
    return buffer.getvalue()


def docker_api(
    sock: Path, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, Any]:
    """One Docker API call over a Unix socket: (status, decoded JSON or raw bytes)."""
    named = {k.replace("_", "-"): v for k, v in headers.items()}
    status, raw = unixhttp.request(sock, method, path, body, named, timeout=120)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def import_busybox(sock: Path, image: str = "bb:latest") -> str:
    """Import the busybox rootfs as `image` into the daemon at `sock`; returns the image id."""
    repo, _, tag = image.partition(":")
    status, answer = docker_api(
        sock,
        "POST",
        f"/images/create?fromSrc=-&repo={repo}&tag={tag or 'latest'}",
        busybox_tar(),
        Content_Type="application/x-tar",
    )
    if status != 200:
        raise RuntimeError(f"importing {image} failed: {status} {answer!r}")
    status, inspected = docker_api(sock, "GET", f"/images/{image}/json")
    if status != 200:
        raise RuntimeError(f"{image} missing after import: {status}")
    return str(inspected["Id"])
