"""The processes under test: a private dockerd, HAProxy in front of it, and the gate in front of it.

Every process is started with a parent-death signal, so nothing outlives the benchmark even when it
is killed, and `Stack.close()` stops them in reverse order with bounded waits.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uds

DOCKERD = os.environ.get("RDC_BENCH_DOCKERD", "/usr/sbin/dockerd")
HAPROXY = os.environ.get("RDC_BENCH_HAPROXY", "/usr/sbin/haproxy")
BUSYBOX = os.environ.get("RDC_BENCH_BUSYBOX", "/usr/bin/busybox")
IMAGE = "bb:latest"

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the benchmark dies, so does the child.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 15.0) -> None:
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def spawn(name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
        )
    return Proc(name, popen, log)


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it (found by parent pid in /proc/*/stat), `pid` first.

    A proxy may fork workers that serve requests beside (or instead of) the process the benchmark
    started; every fact read about "the proxy" (CPU, memory) covers all of them. Processes that end
    while /proc is walked are left out; `pid` itself must exist (ProcessLookupError if not).
    """
    if not Path(f"/proc/{pid}").is_dir():
        raise ProcessLookupError(f"no process {pid}")
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended since the listing
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree = [pid]
    for parent in tree:  # grows as it goes: breadth first
        tree += children.get(parent, [])
    return tree


def rss_kib(pid: int) -> int:
    """Resident memory of a process and its descendants: the sum of their VmRSS (/proc/<pid>/status, KiB).

    Pages that forked workers share with each other (copy-on-write after fork, the interpreter and
    its libraries) are counted once per process, so for a forking proxy this overstates what it
    costs the machine; it never understates it. For one process it is that process's VmRSS.
    """
    total = 0
    for member in process_tree(pid):
        try:
            lines = Path(f"/proc/{member}/status").read_text().splitlines()
        except OSError:
            if member == pid:
                raise
            continue  # a descendant that ended since the walk
        # A zombie has no VmRSS line: it holds no memory.
        total += next((int(line.split()[1]) for line in lines if line.startswith("VmRSS:")), 0)
    return total


def cpu_seconds(pid: int) -> float:
    """CPU time used by a process, its descendants and all their threads, in nanosecond resolution.

    Sums the first field of /proc/<p>/task/*/schedstat over every process in `process_tree(pid)`:
    a proxy that forks workers is charged for all of them, one that does not is charged for its own
    threads as before. /proc/<pid>/stat counts in clock ticks (10 ms), too coarse for a few hundred
    requests. A thread or process that ended between two readings takes its time with it (a reaped
    child's time goes to its parent's cutime, in ticks, which is not read here); the proxies measured
    here keep theirs (HAProxy's threads, the gate's loop, its worker pool and its worker processes).
    """
    total = 0
    for member in process_tree(pid):
        try:
            tasks = list(Path(f"/proc/{member}/task").iterdir())
        except OSError:
            if member == pid:
                raise
            continue  # a descendant that ended since the walk
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def raise_fd_limit(wanted: int = 65536) -> int:
    """Lifts the open-file limit (inherited by every process started here); returns the new soft limit."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(hard, target)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _CoreDaemon:
    """rediacc_core.runtime.daemon's RunningDaemon, seen as one of the stack's processes."""

    name = "dockerd"

    def __init__(self, running: Any) -> None:
        self.running = running

    @property
    def pid(self) -> int:
        return int(self.running.pid)

    def alive(self) -> bool:
        return bool(self.running.alive())

    def log_tail(self, lines: int = 15) -> str:
        return Proc.log_tail(self, lines)  # type: ignore[arg-type]

    @property
    def log(self) -> Path:
        return Path(self.running.log)

    def stop(self, grace_s: float = 15.0) -> None:
        self.running.stop(grace_s)


@dataclass
class Stack:
    """A temporary directory with everything the benchmark started inside it."""

    workdir: Path
    procs: list[Proc | _CoreDaemon] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    docker_sock: str = ""
    haproxy_sock: str = ""
    gate_sock: str = ""
    gate_proc: Proc | None = None
    haproxy_proc: Proc | None = None
    data_on: str = "disk"  # where dockerd keeps images and containers: "tmpfs" or "disk"
    _gate_launch: tuple[list[str], str, dict[str, str] | None] | None = None

    @property
    def machine_root(self) -> Path:
        return self.workdir / "machine"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def _check_alive(self, proc: Proc) -> None:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")

    # --- dockerd ------------------------------------------------------------------------------
    def start_dockerd(self, data_in_memory: bool = True) -> str:
        """A private dockerd that reads CDI specs only from the machine root's etc/cdi.

        Started by the core's own starter (the one `rdc repo up` uses) when it is there, so the
        daemon is configured exactly like a repo's; else by the same recipe here. Its data-root is
        a tmpfs of its own when `data_in_memory` (and mounting one works): then a 256 MiB copy
        into a container is not at the mercy of when the kernel flushes dirty pages to disk, which
        otherwise moves the bulk numbers more than any proxy does.
        """
        base = self.workdir / "docker"
        (self.machine_root / "etc" / "cdi").mkdir(parents=True, exist_ok=True)
        self.cleanups.append(lambda: self._unmount_under(self.workdir))
        data_root = base / "data"
        self.data_on = "disk"
        if data_in_memory:
            data_root.mkdir(parents=True)
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4g,mode=0711", "rdc-bench", str(data_root)],
                capture_output=True,
            )
            self.data_on = "tmpfs" if mounted.returncode == 0 else "disk"
        try:
            from rediacc_core.runtime.daemon import start_dockerd
        except ImportError:
            sock = self._start_dockerd_here(base)
        else:
            running = start_dockerd(
                self.machine_root,
                base,
                data_root=data_root,
                dockerd=DOCKERD,
                extra_args=("--log-level", "warn"),
            )
            self.procs.append(_CoreDaemon(running))
            sock = str(running.socket)
        self.docker_sock = sock
        return sock

    def _start_dockerd_here(self, base: Path) -> str:
        base.mkdir(parents=True, exist_ok=True)
        cdi_dir = self.machine_root / "etc" / "cdi"
        config = base / "daemon.json"
        config.write_text(json.dumps({"features": {"cdi": True}, "cdi-spec-dirs": [str(cdi_dir)]}))
        sock = str(base / "docker.sock")
        argv = [
            DOCKERD, "--config-file", str(config), "--host", f"unix://{sock}",
            "--data-root", str(base / "data"), "--exec-root", str(base / "exec"),
            "--pidfile", str(base / "docker.pid"), "--bridge", "none", "--iptables=false",
            "--log-level", "warn",
        ]  # fmt: skip
        proc = spawn("dockerd", argv, self.logs / "dockerd.log")
        self.procs.append(proc)
        try:
            uds.wait_until_answers(sock, 60, "dockerd")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{proc.log_tail()}") from None
        return sock

    def import_image(self) -> None:
        """A one-binary busybox image, imported from a tar built here (no registry needed)."""
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            tar.add(BUSYBOX, arcname="bin/busybox")
            for applet in ("sh", "cat", "true", "sleep", "ls", "head"):
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type = tarfile.SYMTYPE
                link.linkname = "busybox"
                tar.addfile(link)
            tmp = tarfile.TarInfo("tmp")
            tmp.type = tarfile.DIRTYPE
            tmp.mode = 0o1777
            tar.addfile(tmp)
        resp = uds.call(
            self.docker_sock, "POST", "/images/create?fromSrc=-&repo=bb&tag=latest", data.getvalue(), 120
        )
        if resp.status != 200:
            raise RuntimeError(f"image import failed: {resp.status} {resp.body[:300]!r}")

    # --- HAProxy ------------------------------------------------------------------------------
    def start_haproxy(self, upstream: str) -> str:
        """HAProxy in HTTP mode with keep-alive on both sides, inspecting no bodies.

        This mirrors what the popular socket-proxy images run (without their ACLs, which only make
        HAProxy slower): the fair baseline for "a proxy that does nothing".
        """
        base = self.workdir / "haproxy"
        base.mkdir(parents=True)
        sock = str(base / "haproxy.sock")
        config = base / "haproxy.cfg"
        config.write_text(
            "\n".join(
                [
                    "global",
                    "    maxconn 8192",
                    "    log stdout format raw local0 warning",
                    "defaults",
                    "    mode http",
                    "    option http-keep-alive",
                    "    http-reuse safe",
                    "    timeout connect 5s",
                    "    timeout client 600s",
                    "    timeout server 600s",
                    "    timeout tunnel 3600s",
                    "    timeout http-keep-alive 600s",
                    "frontend docker_api",
                    f"    bind unix@{sock} mode 666",
                    "    default_backend dockerd",
                    "backend dockerd",
                    f"    server dockerd unix@{upstream}",
                    "",
                ]
            )
        )
        check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy rejected its config: {check.stderr or check.stdout}")
        proc = spawn("haproxy", [HAPROXY, "-db", "-f", str(config)], self.logs / "haproxy.log")
        self.procs.append(proc)
        try:
            uds.wait_until_answers(sock, 20, "haproxy")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{proc.log_tail()}") from None
        self.haproxy_sock = sock
        self.haproxy_proc = proc
        return sock

    # --- the gate -------------------------------------------------------------------------------
    def _spawn_gate(self, name: str, argv: Sequence[str], sock: str, env: dict[str, str] | None) -> Proc:
        proc = spawn(name, argv, self.logs / f"{name}.log", env)
        self.procs.append(proc)
        try:
            uds.wait_until_answers(sock, 30, "the gate" if name == "gate" else name)
        except RuntimeError as exc:
            # Stopped here, so that a caller that goes on without this gate leaves nothing running;
            # the error carries the log's tail.
            proc.stop()
            self.procs.remove(proc)
            raise RuntimeError(f"{exc}\ncommand: {' '.join(argv)}\n{proc.log_tail()}") from None
        return proc

    def start_gate(self, argv: Sequence[str], sock: str, env: dict[str, str] | None = None) -> str:
        self._gate_launch = (list(argv), sock, env)
        self.gate_proc = self._spawn_gate("gate", argv, sock, env)
        self.gate_sock = sock
        return sock

    def start_other_gate(
        self, name: str, argv: Sequence[str], sock: str, env: dict[str, str] | None = None
    ) -> Proc:
        """Another gate beside the default one (the same gate run another way), logged as `name`.

        It is stopped with the rest; memory, profiling and restarts concern the default gate only.
        """
        return self._spawn_gate(name, argv, sock, env)

    def restart_gate(self) -> str:
        """A fresh gate process (same command), so memory is measured from a clean start."""
        if self.gate_proc is None or self._gate_launch is None:
            raise RuntimeError("the gate was never started")
        self.gate_proc.stop()
        self.procs.remove(self.gate_proc)
        argv, sock, env = self._gate_launch
        return self.start_gate(argv, sock, env)

    # --- teardown -------------------------------------------------------------------------------
    def remove_all_containers(self) -> None:
        if not self.docker_sock:
            return
        try:
            listed = uds.call(self.docker_sock, "GET", "/containers/json?all=1", timeout=30).json()
        except (OSError, uds.HttpError, ValueError):
            return
        remove_containers(self.docker_sock, [c["Id"] for c in listed])

    def _unmount_under(self, base: Path) -> None:
        # A dockerd that died uncleanly can leave overlay/shm mounts; rmtree must never walk into them.
        prefix = str(base.resolve()) + "/"
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)

    def close(self) -> None:
        self.remove_all_containers()
        for proc in reversed(self.procs):
            proc.stop()
        for cleanup in reversed(self.cleanups):
            cleanup()
        self.procs.clear()


def remove_containers(docker_sock: str, ids: Sequence[str], workers: int = 4) -> None:
    """Force-removes containers through the daemon directly, a few at a time."""
    from concurrent.futures import ThreadPoolExecutor

    def remove(cid: str) -> None:
        with contextlib.suppress(OSError, uds.HttpError):
            uds.call(docker_sock, "DELETE", f"/containers/{cid}?force=1&v=1", timeout=60)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(remove, ids))


def remove_tree(path: Path) -> None:
    """Deletes the work directory unless a mount is still inside it (then it is left, and said so)."""
    prefix = str(path.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    if any(m.startswith(prefix) for m in mounts):
        print(f"bench: left {path} in place: something is still mounted inside it")
        return
    shutil.rmtree(path, ignore_errors=True)


def wait_for(predicate: Callable[[], bool], deadline_s: float, step_s: float = 0.05) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()
