"""Where a proxy's CPU per request goes: user and kernel time of HAProxy, a relay that parses nothing,
and the gate, side by side in interleaved cycles.

    python bench/cpu_split.py [--cycles 8] [--seconds 3] [--out bench/results/cpu-split.md]

The benchmark (`run.py`) measures each proxy's whole CPU per request; this splits it into the time
in the proxy's own code (user) and in the kernel on its behalf (system: the reads, the writes, the
wake-ups of the peer), from `/proc/<pid>/task/*/stat`. The relay (`relay_floor.py`, uvloop, one
protocol per direction) makes the same system calls per request as the gate and runs no HTTP code:
its user time is what any Python proxy pays before it looks at a byte, and the gate's system time
with that user time is the least a gate in Python could cost here. Needs what `run.py` needs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cli_capture
import gate_launch
import loadgen
import stack
import uds

BENCH = Path(__file__).resolve().parent
PATHS = ("haproxy", "relay", "gate")
TAKEN = "cpu-split-taken"


@dataclass(frozen=True)
class Scenario:
    label: str
    target: str
    conns: int
    post: bool = False  # the create body, with a name already taken: the daemon answers 409


def scenarios(api: str) -> list[Scenario]:
    return [
        Scenario("`GET /_ping`, 8 connections", "/_ping", 8),
        Scenario(f"`GET /{api}/containers/json`, 8 connections", f"/{api}/containers/json", 8),
        Scenario("create (409), one connection", f"/{api}/containers/create?name={TAKEN}", 1, post=True),
    ]


def user_system(pid: int) -> tuple[float, float]:
    """Seconds of user and system time of every thread of `pid` (clock ticks: runs are seconds long)."""
    user = system = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    ticks = os.sysconf("SC_CLK_TCK")
    return user / ticks, system / ticks


def measure(
    binary: Path, sock: str, pid: int, scenario: Scenario, body: Path, seconds: float
) -> tuple[float, float]:
    """µs of user and of system time per request over one load run."""
    user0, system0 = user_system(pid)
    posting = {"method": "POST", "body_file": body, "headers": ("Content-Type: application/json",)}
    result = loadgen.run(
        binary, sock, scenario.target, conns=scenario.conns, duration_s=seconds, warmup_s=0.3,
        **(posting if scenario.post else {}),  # type: ignore[arg-type]
    )  # fmt: skip
    user1, system1 = user_system(pid)
    served = max(int(result["completed_total"]), 1)
    return (user1 - user0) / served * 1e6, (system1 - system0) / served * 1e6


def report(rows: dict[str, dict[str, list[tuple[float, float]]]], meta: str) -> str:
    lines = [
        "# Where a proxy's CPU per request goes: user and kernel time",
        "",
        meta,
        "",
        "Medians over cycles, µs per request; ratios are taken per cycle against HAProxy's total, then",
        "their median. Rerun: `python bench/cpu_split.py`.",
        "",
        "| request | path | user µs | system µs | total µs | total vs HAProxy |",
        "|---|---|---|---|---|---|",
    ]
    floors = []
    for label, by_path in rows.items():
        haproxy = [u + s for u, s in by_path["haproxy"]]
        for path in PATHS:
            runs = by_path[path]
            user = statistics.median(u for u, _ in runs)
            system = statistics.median(s for _, s in runs)
            total = statistics.median(u + s for u, s in runs)
            ratio = statistics.median((u + s) / h for (u, s), h in zip(runs, haproxy, strict=True) if h > 0)
            lines.append(f"| {label} | {path} | {user:.2f} | {system:.2f} | {total:.2f} | {ratio:.2f}× |")
        if "create" in label:  # its goal is in µs, not against HAProxy (run.py's targets)
            continue
        gate_system = statistics.median(s for _, s in by_path["gate"])
        relay_user = statistics.median(u for u, _ in by_path["relay"])
        haproxy_total = statistics.median(haproxy)
        floors.append(
            f"- {label}: 0.8× HAProxy is {0.8 * haproxy_total:.2f} µs; the gate's system time alone is "
            f"{gate_system:.2f} µs ({gate_system / haproxy_total:.2f}×), which leaves "
            f"{0.8 * haproxy_total - gate_system:.2f} µs for all of the gate's user time, against the "
            f"relay's {relay_user:.2f} µs for copying bytes and nothing else."
        )
    lines += ["", "What 0.8× HAProxy's CPU leaves for the gate's own code:", "", *floors, ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    stack.raise_fd_limit()
    workdir = Path(tempfile.mkdtemp(prefix="rdc-split-"))
    st = stack.Stack(workdir)
    try:
        docker_sock = st.start_dockerd()
        st.import_image()
        socks = {"haproxy": st.start_haproxy(docker_sock)}
        gate_launch.write_machine(st.machine_root)
        launch = gate_launch.launch(workdir, st.machine_root, docker_sock)
        socks["gate"] = st.start_gate(launch.argv, launch.sock, launch.env)
        relay_sock = str(workdir / "relay.sock")
        relay = stack.spawn(
            "relay",
            [
                sys.executable,
                str(BENCH / "relay_floor.py"),
                "--listen",
                relay_sock,
                "--upstream",
                docker_sock,
            ],
            workdir / "relay.log",
        )
        st.procs.append(relay)
        if not stack.wait_for(lambda: os.path.exists(relay_sock), 20):
            raise SystemExit(f"the relay did not start: {relay.log_tail()}")
        socks["relay"] = relay_sock
        assert st.haproxy_proc is not None and st.gate_proc is not None
        pids = {"haproxy": st.haproxy_proc.pid, "relay": relay.pid, "gate": st.gate_proc.pid}
        binary = loadgen.build(workdir)
        api = "v" + str(uds.call(docker_sock, "GET", "/version").json()["ApiVersion"])
        body, _ = cli_capture.capture_create_body(workdir, api[1:], stack.IMAGE, gate_launch.DEVICE)
        body_file = workdir / "create-body.json"
        body_file.write_bytes(body)
        uds.call(docker_sock, "POST", f"/{api}/containers/create?name={TAKEN}", json.loads(body))
        rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        for scenario in scenarios(api):
            by_path: dict[str, list[tuple[float, float]]] = {path: [] for path in PATHS}
            for cycle in range(args.cycles):
                for path in PATHS[cycle % 3 :] + PATHS[: cycle % 3]:
                    by_path[path].append(
                        measure(binary, socks[path], pids[path], scenario, body_file, args.seconds)
                    )
            rows[scenario.label] = by_path
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        meta = (
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPUs, "
            f"{args.cycles} cycles of {args.seconds:g} s per path and request, the paths' order rotating; "
            f"load average {' '.join(load_before)} before, {' '.join(load_after)} after."
        )
        text = report(rows, meta)
        print(text)
        if args.out is not None:
            args.out.write_text(text)
    finally:
        st.close()
        stack.remove_tree(workdir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
