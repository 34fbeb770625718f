"""Processes the runtime started and later finds again by pid (daemons, uplinks, keepers).

A stop waits for the process to be gone: whoever asked for it (`rdc repo down`, a test, the next
`repo up`) must not find it still holding the namespace, the socket or the devices.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

KILL_WAIT = 10.0  # seconds for the kernel to take a SIGKILLed process away
# Seconds a stop interrupted by Ctrl-C still waits for the process it already told to stop, so that
# what the caller then reports (`rdc repo down`'s "it is …") is not undone a moment later by that
# process exiting. A second Ctrl-C ends the wait.
INTERRUPTED_GRACE = 3.0


def pid_alive(pid: int) -> bool:
    """True for a live process (a zombie is not alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _gone_within(pid: int, process: subprocess.Popen[bytes] | None, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return True
        if process is None and not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def stop_pid(pid: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> bool:
    """SIGTERM, wait up to `timeout`, then SIGKILL. Reaps `process` when we are its parent. Whether
    the process is gone (one stuck in the kernel can outlive even SIGKILL for a while)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        if _gone_within(pid, process, timeout):
            return True
    except KeyboardInterrupt:
        _gone_within(pid, process, INTERRUPTED_GRACE)
        raise
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if process is not None:
        import subprocess  # late: only a child of ours waits here; reads import this module

        try:
            process.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + KILL_WAIT
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
