"""Reading the audit trail back (`rdc repo gate log`): every entry of the log and its rotated files,
from a moment on, and following the log as the gate appends to it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from rediacc_core.gate.audit.log import KEEP

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """`--since`: a duration back from now (`90s`, `15m`, `2h`, `1d`) or a timestamp
    (`2026-12-01T04:00:00Z`, `2026-12-01`; UTC unless it names a zone). Raises ValueError."""
    now = time.time() if now is None else now
    match = _DURATION.fullmatch(text.strip())
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    stamp = datetime.fromisoformat(text.strip())
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def entry_time(entry: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(entry["time"])).timestamp()
    except (KeyError, ValueError):
        return 0.0


def _entries(lines: Iterable[str], since: float | None) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash mid-write
        if isinstance(entry, dict) and (since is None or entry_time(entry) >= since):
            yield entry


def read_entries(path: Path, since: float | None = None, keep: int = KEEP) -> Iterator[dict[str, Any]]:
    """Every audit entry in `path` and its rotated files, oldest first, from `since` on."""
    for n in range(keep, 0, -1):
        with contextlib.suppress(FileNotFoundError), open(f"{path}.{n}", encoding="utf-8") as old:
            yield from _entries(old, since)
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as current:
        yield from _entries(current, since)


def follow_entries(
    path: Path, since: float | None = None, poll: float = 0.5, stop: Callable[[], bool] = lambda: False
) -> Iterator[dict[str, Any]]:
    """`read_entries`, then every entry appended from then on (across rotations) until `stop()`."""
    for n in range(KEEP, 0, -1):
        with contextlib.suppress(FileNotFoundError), open(f"{path}.{n}", encoding="utf-8") as old:
            yield from _entries(old, since)
    handle: TextIO | None = None
    inode = -1
    partial = ""
    while not stop():
        if handle is None:
            try:
                handle = open(path, encoding="utf-8")  # noqa: SIM115 - kept open across polls
                inode = os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                time.sleep(poll)
                continue
        chunk = handle.read()
        if chunk:
            partial += chunk
            *whole, partial = partial.split("\n")
            yield from _entries(whole, since)
            continue
        try:
            rotated = os.stat(path).st_ino != inode
        except FileNotFoundError:
            rotated = True
        if rotated:
            handle.close()
            handle = None  # the rest of the old file was read above; the new one starts at 0
            continue
        time.sleep(poll)
    if handle is not None:
        handle.close()
