"""The repo runtime's own log files, the gate's and its dockerd's, kept to a bounded size.

Both are appended to by a long-running process through a descriptor opened for it at start
(`O_APPEND`), and a tenant's requests decide how much gets written. Renaming the file would leave
the writer appending to the renamed one, so a file over its bound is copied to `<name>.1` and then
truncated in place: an appending writer simply carries on at the new end. Lines written between
the copy and the truncation are lost (logrotate's `copytruncate` has the same window). Under
systemd the output goes to the journal instead, which bounds itself, and these files stay empty.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

MAX_LOG_BYTES = 16 * 1024 * 1024  # per file; one previous copy is kept beside it as `<name>.1`
CHECK_INTERVAL = 30.0  # seconds; at the gate's log rate limit that is well under a MiB


def previous(path: Path) -> Path:
    """Where the part cut from `path` is kept."""
    return path.with_name(path.name + ".1")


def bound(path: Path, max_bytes: int = MAX_LOG_BYTES) -> bool:
    """Move `path`'s content to `<name>.1` when it is over `max_bytes`; True when it did."""
    try:
        if os.stat(path).st_size <= max_bytes:
            return False
    except FileNotFoundError:
        return False
    kept = previous(path)
    partial = kept.with_name(kept.name + ".tmp")
    with open(path, "rb") as source, open(partial, "wb") as copy:
        shutil.copyfileobj(source, copy, 1024 * 1024)
    os.replace(partial, kept)  # the previous copy is whole or untouched
    os.truncate(path, 0)
    return True


class LogKeeper:
    """Checks `paths` every `interval` seconds on a thread of its own (a copy of several MiB must
    not stall the gate's event loop); `report` hears of each file it cut."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        max_bytes: int = MAX_LOG_BYTES,
        interval: float = CHECK_INTERVAL,
        report: Callable[[str], None] = lambda line: None,
        chores: Sequence[Callable[[], object]] = (),
    ) -> None:
        self.paths = tuple(paths)
        # Other housekeeping of the gate on the same thread and interval (`runtime.lapsed`).
        self.chores = tuple(chores)
        self.max_bytes = max_bytes
        self.interval = interval
        self.report = report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        for path in self.paths:
            try:
                if bound(path, self.max_bytes):
                    self.report(f"{path} was over {self.max_bytes} bytes: moved to {previous(path)}")
            except OSError as exc:  # a full disk, say: the next check tries again
                self.report(f"could not bound {path}: {exc}")
        for chore in self.chores:
            try:
                chore()
            except Exception as exc:  # housekeeping must never stop the gate; the next round retries
                self.report(f"housekeeping failed: {type(exc).__name__}: {exc}")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
