"""Samples the gate with py-spy while the load generator drives one kind of request through it.

py-spy reads the gate's stacks from outside (ptrace), so the gate runs unmodified. It samples only
while a thread holds the GIL (`--gil`), that is while Python runs on a CPU: without it, on a
machine whose cores are oversubscribed, the samples mostly show where the gate waited or was
preempted (inside a send() that woke the peer, in epoll), not where it spent CPU. Time in system
calls is therefore not in these samples; the gate's CPU per request is reported beside them.

`--subprocesses` samples every process descended from the gate too (a gate that forks workers
serves requests in them); the summary counts samples per process and then merges the processes'
stacks, so a function's share is over all of them.
"""

from __future__ import annotations

import collections
import json
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
import stack


@dataclass(frozen=True)
class Load:
    """What to drive through the gate while sampling it."""

    name: str  # used in file names: profile-<name>-stacks.txt
    path: str
    conns: int
    method: str = "GET"
    body_file: Path | None = None
    headers: tuple[str, ...] = ()


def record(
    binary: Path, gate_sock: str, gate_pid: int, seconds: float, out_dir: Path, load: Load
) -> tuple[Path, str]:
    """Writes collapsed stacks to `out_dir/profile-<name>-stacks.txt`; returns it and a load summary."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy is not installed: pip install py-spy (tox -e bench installs it)")
    stacks = out_dir / f"profile-{load.name}-stacks.txt"
    load_result: dict[str, Any] = {}

    def drive() -> None:
        load_result.update(
            loadgen.run(
                binary, gate_sock, load.path, conns=load.conns, duration_s=seconds + 1.0, warmup_s=0.2,
                method=load.method, body_file=load.body_file, headers=load.headers,
            )
        )  # fmt: skip

    cpu_before = stack.cpu_seconds(gate_pid)
    driver = threading.Thread(target=drive)
    driver.start()
    result = subprocess.run(
        [spy, "record", "--pid", str(gate_pid), "--duration", str(int(seconds)), "--rate", "250",
         "--format", "raw", "--threads", "--gil", "--subprocesses", "--output", str(stacks)],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    driver.join(seconds + 30)
    cpu = stack.cpu_seconds(gate_pid) - cpu_before
    if result.returncode != 0 or not stacks.exists():
        raise RuntimeError(f"py-spy failed: {result.stderr.strip() or result.stdout.strip()}")
    window = load_result.get("duration_s", seconds) + 0.2
    served = load_result.get("completed_total") or 1
    summary = (
        f"{load.method} {load.path}, {load.conns} connection(s): {load_result.get('rate', 0):,.0f} req/s, "
        f"p50 {load_result.get('latency_us', {}).get('p50', 0):.0f} µs; "
        f"the gate used {cpu / window * 100:.0f}% of one core, {cpu / served * 1e6:.0f} µs CPU per request "
        "(sampling slows it somewhat)\n\n"
        f"loadgen: `{json.dumps(load_result)}`"
    )
    return stacks, summary


_LINE = re.compile(r":\d+\)$")
# With --subprocesses each stack starts with its process and that process's ancestors up to the one
# sampled, outermost first: `process 123:"<command line>";process 456:"<command line>";`.
_PROCESSES = re.compile(r'^(?:process (\d+):".*?";)+')
# With --threads the next frame is the thread: `thread (<native id>): <name>`; the id differs in
# every process, the name (MainThread, a pool's thread) is what is comparable between them.
_THREAD = re.compile(r"^thread \(\w+\)")


def _split_process(frames_text: str) -> tuple[str, str]:
    """The sampled process's pid ("" when py-spy wrote no process frames) and the rest of the stack."""
    match = _PROCESSES.match(frames_text)
    if match is None:
        return "", frames_text
    return match.group(1), frames_text[match.end() :]


def summarise(stacks: Path, top: int = 30) -> str:
    """Self and inclusive sample shares per function, from py-spy's collapsed (raw) output."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    per_process: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        frames_text, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        process, frames_text = _split_process(frames_text)
        frames = [f for f in frames_text.split(";") if f]
        if not frames:
            continue
        frames[0] = _THREAD.sub("thread", frames[0])
        total += count
        per_process[process] += count
        self_counts[frames[-1]] += count
        for frame in {_LINE.sub(")", f) for f in frames}:
            incl_counts[frame] += count
    lines = [
        f"{total} samples while one of the gate's processes held its GIL (Python on a CPU; system calls "
        "and waits excluded)",
        "",
    ]
    if len(per_process) > 1:
        shares = ", ".join(f"pid {pid}: {n / total * 100:.0f}%" for pid, n in per_process.most_common())
        lines += [f"Samples by process ({len(per_process)} processes, merged below): {shares}", ""]
    lines += [
        "### Self (where the sample landed)",
        "",
        "| share | function |",
        "|---|---|",
    ]
    lines += [f"| {n / total * 100:.1f}% | `{f}` |" for f, n in self_counts.most_common(top)] if total else []
    lines += [
        "",
        "### Inclusive (on the stack, any line of the function)",
        "",
        "| share | function |",
        "|---|---|",
    ]
    lines += [f"| {n / total * 100:.1f}% | `{f}` |" for f, n in incl_counts.most_common(top)] if total else []
    return "\n".join(lines) + "\n"
