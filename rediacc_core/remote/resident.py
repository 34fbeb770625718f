"""The resident agent: one warm `rdc-agent` per SSH user and machine root, serving on a Unix socket.

Most of a forwarded command's cost is Python starting and importing the CLI on the machine. So the
first forwarded command starts a resident agent beside itself (detached, in a session of its own),
and the client forwards a local socket to it through its SSH master connection (`link.py`); later
commands reach it without starting anything. For each command the resident forks a child from its
warm interpreter: every command still runs in a process of its own, under the machine's locks, with
the request checked exactly as the one-shot agent checks it (`agent.serve`).

It serves only its own user (the socket's directory is private and each peer's uid is checked),
stops after `idle` seconds without a command, and stops at once when the installed distributions
change (`rdc machine install`, pip): that command is answered `{"restart": …}` and the client starts
the new code through the one-shot agent.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import select
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rediacc_core.remote import agent, protocol

DEFAULT_IDLE = 300.0
# Each forwarded command is one connection; a backlog this deep takes an `--all` burst of clients.
BACKLOG = 64
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes with its NUL; leave room
LOCK_WAIT = 5.0  # how long a new resident waits for the one it replaces to let go


def socket_path(root: str) -> Path | None:
    """Where the resident agent for `root` listens: private to this user, or None when too long."""
    name = "agent.sock" if root == "/" else f"agent-{hashlib.sha256(root.encode()).hexdigest()[:16]}.sock"
    path = Path.home() / ".rediacc" / "agent" / name
    return path if len(os.fsencode(path)) <= _MAX_SOCKET_PATH else None


def private_dir(path: Path) -> bool:
    """Make `path` a directory only this user can enter; False when it is someone else's."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return True


def install_stamp() -> tuple[tuple[str, int, int], ...]:
    """What changes when a rediacc distribution is installed, upgraded or removed: the dist-info
    directories and the directories holding them (a stat each, no metadata parsed)."""
    from importlib import metadata

    found = {metadata.distribution(protocol.CORE_DISTRIBUTION)}
    for group in protocol.PLUGIN_GROUPS:
        found |= {ep.dist for ep in metadata.entry_points(group=group) if ep.dist is not None}
    paths: set[Path] = set()
    for dist in found:
        where = getattr(dist, "_path", None)  # PathDistribution's dist-info directory
        if where is not None:
            paths |= {Path(where), Path(where).parent}
    return tuple(sorted(_stat(path) for path in paths))


def _stat(path: Path) -> tuple[str, int, int]:
    try:
        info = path.stat()
    except OSError:
        return (str(path), 0, 0)
    return (str(path), info.st_mtime_ns, info.st_ino)


def answering(path: Path) -> bool:
    """Whether a resident agent listens on `path` now."""
    from rediacc_core.unixhttp import listening

    return listening(path)


def start(root: str, idle: float, agent_script: str) -> Path | None:
    """Start the resident agent for `root` (as `agent_script --resident`, so `ps` names it) unless
    one answers; its socket, or None when it cannot have one here. Returns at once: the agent warms
    up beside the command that asked."""
    import subprocess

    path = socket_path(root)
    if path is None or not private_dir(path.parent):
        return None
    if not answering(path):
        subprocess.Popen(
            [sys.executable, agent_script, "--resident", root, str(idle)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # outlives the SSH session that started it
        )
    return path


def running(root: str) -> int | None:
    """The pid of the resident agent serving `root`, read from its lock file and believed only while
    the lock is held (a pid left behind may be another process's by now). Connects to nothing, so
    asking does not keep an idle agent alive."""
    path = socket_path(root)
    if path is None:
        return None
    try:
        holder = os.open(path.with_suffix(".pid"), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(holder, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return int(os.read(holder, 32) or b"0") or None
    finally:
        os.close(holder)
    return None  # nobody holds the lock: no resident runs


def stop(root: str) -> bool:
    """Stop the resident agent for `root`; whether one was running."""
    pid = running(root)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


# --- the server ---------------------------------------------------------------------------------------


class Resident:
    """The listening agent: accepts a connection, forks a child to serve it, reaps, stops when idle."""

    def __init__(self, root: str, idle: float, run_cli: Callable[[list[str]], None]) -> None:
        self.root = root
        self.idle = idle
        self.run_cli = run_cli
        self.children: set[int] = set()
        self.stopping = False
        self.holder = -1
        self.wake = -1

    def serve(self) -> None:
        path = socket_path(self.root)
        if path is None or not private_dir(path.parent):
            return
        holder = os.open(path.with_suffix(".pid"), os.O_RDWR | os.O_CREAT, 0o600)
        if not _lock(holder, LOCK_WAIT):
            os.close(holder)
            return  # another resident serves this root
        os.ftruncate(holder, 0)
        os.write(holder, str(os.getpid()).encode())
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path.unlink(missing_ok=True)  # a socket left by a killed resident: its lock was released
        old_mask = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_mask)
        listener.listen(BACKLOG)
        bound = path.stat().st_ino
        stamp, versions = install_stamp(), protocol.versions()
        # A stop request wakes the loop at once (it waits in select): the next resident is waiting.
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.holder, self.wake = holder, wake_r
        try:
            self._loop(listener, stamp, versions)
        finally:
            if _inode(path) == bound:  # never remove a successor's socket
                path.unlink(missing_ok=True)
            listener.close()
            os.ftruncate(holder, 0)
            os.close(holder)

    def _stop(self, _signum: int, _frame: object) -> None:
        self.stopping = True

    def _loop(self, listener: socket.socket, stamp: Any, versions: dict[str, str]) -> None:
        waited = 0.0
        step = min(1.0, self.idle)
        while not self.stopping:
            self._reap()
            ready, _, _ = select.select([listener.fileno(), self.wake], [], [], step)
            if self.wake in ready:
                while len(os.read(self.wake, 512)) == 512:
                    pass
                continue  # SIGTERM: the loop ends
            if not ready:
                waited = 0.0 if self.children else waited + step
                if waited >= self.idle:
                    return
                continue
            waited = 0.0
            conn, _ = listener.accept()
            if _peer_uid(conn) != os.getuid():
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                listener.close()
                os.close(self.holder)  # a long command must not keep the next resident from starting
                os.close(self.wake)
                code = 0
                try:
                    self._child(conn, stamp, versions)
                except BaseException:  # a child never returns into the server's loop
                    code = 1
                os._exit(code)
            conn.close()
            self.children.add(pid)

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def _child(self, conn: socket.socket, stamp: Any, versions: dict[str, str]) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as the one-shot agent: a lost client ends nothing
        sender = protocol.Sender(conn.makefile("wb"))
        line = conn.makefile("rb").readline()
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError:
            sender.send({"err": "rdc-agent: the request is not protocol JSON\n"})
            sender.send({"exit": agent.EXIT_PROTOCOL})
            return
        if install_stamp() != stamp:
            # This interpreter holds the code that was installed before: the client starts the new one.
            # Its socket goes first, so the agent that starts the new code does not find it answering.
            path = socket_path(self.root)
            if path is not None:
                path.unlink(missing_ok=True)
            os.kill(os.getppid(), signal.SIGTERM)
            sender.send({"restart": "the installed rediacc distributions changed"})
            return
        if message.get("root") != self.root and message.get("op") == "run":
            sender.send({"err": f"rdc-agent: this agent serves root {self.root}\n"})
            sender.send({"exit": agent.EXIT_PROTOCOL})
            return
        message.pop("resident", None)  # it is this one
        with _fds_as_err(sender):
            code = agent.serve(message, sender, mine=versions, run_cli=self.run_cli)
        sender.send({"exit": code})


def _lock(fd: int, wait: float) -> bool:
    """Take the resident's lock, waiting up to `wait` seconds for a stopping predecessor."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except OSError:
        return None


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class _fds_as_err:
    """fds 0-2 of a child as the one-shot agent has them: no input, and what a tool the command runs
    writes straight to fd 1 or 2 reaches the client as `{"err": …}`."""

    def __init__(self, sender: protocol.Sender) -> None:
        self.sender = sender
        self.reader, self.writer = os.pipe()
        self.thread = threading.Thread(target=self._pump, daemon=True)

    def __enter__(self) -> None:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(self.writer, 1)
        os.dup2(self.writer, 2)
        os.close(self.writer)
        self.thread.start()

    def __exit__(self, *_exc: object) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        # A daemon the command started may hold the pipe on: what it writes later is nobody's.
        self.thread.join(timeout=0.5)

    def _pump(self) -> None:
        while chunk := os.read(self.reader, 65536):
            try:
                self.sender.send({"err": chunk.decode(errors="replace")})
            except BrokenPipeError:
                return


def main(argv: list[str], run_cli: Callable[[list[str]], None], warm: Callable[[], None]) -> None:
    """`rdc-agent --resident ROOT IDLE`, as `start` runs it. `warm` imports what a command may import
    before the first fork (the launcher's: this package does not import the CLI)."""
    root, idle = argv[0], float(argv[1])
    warm()
    Resident(root, idle, run_cli).serve()
