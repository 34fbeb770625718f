"""The one lock over a machine's state: its repos, grants and settings.

Every change to `repos.json`, `grants.json` or `settings.json` happens while holding it, so a
check ("nobody else holds this device exclusively") and the write that relies on it can never
interleave with another writer's. Readers take no lock: the files are replaced atomically, so a
reader sees a whole old or a whole new file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from rediacc_core.errors import BusyError
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    import filelock

DEFAULT_TIMEOUT = 10.0
TIMEOUT_ENV = "REDIACC_LOCK_TIMEOUT"

# What wraps a wait for a lock someone else holds: the CLI shows it (with the time waited on a terminal).
WaitNotice = Callable[[str], AbstractContextManager[object]]
_wait_notice: WaitNotice | None = None


def notify_waits(notice: WaitNotice | None) -> None:
    """Wrap every wait for a held lock in `notice(what is awaited)`; None waits silently."""
    global _wait_notice
    _wait_notice = notice


def lock_path(machine: Machine) -> Path:
    return machine.gpu_dir / "grants.lock"


def pid_path(machine: Machine) -> Path:
    """Where the holder writes its pid, so a waiter that gives up can say who is in the way."""
    path = lock_path(machine)
    return path.with_name(path.name + ".pid")


def lock_timeout() -> float:
    """Seconds to wait for the lock: `$REDIACC_LOCK_TIMEOUT` when it is a number >= 0, else 10."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value >= 0 else DEFAULT_TIMEOUT  # also refuses nan


def holder_pid(machine: Machine) -> int | None:
    try:
        return int(pid_path(machine).read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


@contextmanager
def state_lock(machine: Machine, timeout: float | None = None) -> Iterator[None]:
    """Hold the machine's state lock; BusyError (exit 15) naming the holder on timeout."""
    wait = lock_timeout() if timeout is None else timeout
    path = lock_path(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    import filelock  # here: a read takes no lock, and filelock costs a read a tenth of its time

    lock = filelock.FileLock(str(path), timeout=wait)
    try:
        _acquire(lock, wait, machine)
    except filelock.Timeout:
        pid = holder_pid(machine)
        holder = f"process {pid}" if pid is not None else "another process (its pid is not recorded yet)"
        raise BusyError(
            f"the state (repos, grants, settings) of machine {machine.name!r} is locked by {holder}; "
            f"waited {wait:g}s for {path}",
            "wait for that command to finish and try again"
            + (f" (check it with `ps -p {pid}`)" if pid is not None else "")
            + f"; raise the wait with ${TIMEOUT_ENV}",
        ) from None
    try:
        pid_path(machine).write_text(f"{os.getpid()}\n", encoding="ascii")
        yield
    finally:
        # Remove our pid before letting go, so the file never names a process that no longer holds it.
        pid_path(machine).unlink(missing_ok=True)
        lock.release()


def _acquire(lock: filelock.FileLock, wait: float, machine: Machine) -> None:
    import filelock

    try:
        lock.acquire(timeout=0)
        return
    except filelock.Timeout:
        if wait <= 0:
            raise
    pid = holder_pid(machine)
    held = f" (held by process {pid})" if pid is not None else ""
    what = f"Waiting for the state lock of machine {machine.name}{held}"
    with _wait_notice(what) if _wait_notice is not None else nullcontext():
        lock.acquire(timeout=wait)
