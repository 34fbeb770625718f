"""The kernel's log as health hooks read it: the lines drivers wrote, each with what tells it apart.

Where it comes from depends on the machine:
- a machine whose root is `/`: `/dev/kmsg` (the kernel's ring buffer, read without blocking; root
  may read it), else `journalctl -k -b` when `/dev/kmsg` cannot be read;
- a machine whose root is a directory (simulated, or prepared by hand): the file
  `<root>/var/log/kern.log`, one line per record in dmesg's form (`[ 1234.567890] NVRM: Xid ...`).
  `<root>/dev/kmsg` would be a device node, which a directory cannot stand in for.

Every line comes back in dmesg's form, `[seconds.micros] text`: the timestamp keeps two identical
messages apart, so a health record can tell an event it has seen (and an operator cleared) from a
new one.
"""

from __future__ import annotations

import errno
import os

from rediacc_core.machine import Machine

SIMULATED = "/var/log/kern.log"
KMSG = "/dev/kmsg"
_MAX_RECORDS = 100_000  # the ring buffer holds far fewer; a bound for a device that never says EAGAIN


def kernel_log(machine: Machine) -> list[str]:
    """The kernel log lines of `machine` now ([] when there is none to read)."""
    if not machine.is_host:
        path = machine.path(SIMULATED)
        try:
            return path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []
    lines = read_kmsg(KMSG)
    if lines is not None:
        return lines
    result = machine.run(["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"], timeout=30.0)
    # journalctl prints `[ 1234.567890] host kernel: text`; the host and the tag go, dmesg's form stays.
    out = []
    for line in result.stdout.splitlines() if result.ok else []:
        stamp, sep, rest = line.partition("] ")
        out.append(f"{stamp}] {rest.split(': ', 1)[-1]}" if sep else line)
    return out


def read_kmsg(path: str) -> list[str] | None:
    """The records of a kmsg device as dmesg lines; None when it cannot be opened (not root)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines: list[str] = []
    try:
        for _ in range(_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading: go on with the next
                    continue
                break  # EAGAIN: every record read
            if not record:
                break
            line = kmsg_line(record.decode("utf-8", "replace"))
            if line is not None:
                lines.append(line)
    finally:
        os.close(fd)
    return lines


def kmsg_line(record: str) -> str | None:
    """One `/dev/kmsg` record (`prio,seq,usecs,flags;text` then continuation lines) as a dmesg line."""
    head, sep, text = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3 or not fields[2].isdigit():
        return None
    usecs = int(fields[2])
    return f"[{usecs // 1_000_000:5d}.{usecs % 1_000_000:06d}] {text.splitlines()[0] if text else ''}"
