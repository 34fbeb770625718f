"""The fleet benchmark: warm `rdc` commands over SSH against the same commands on a local machine.

    python bench/fleet.py [--runs N] [--machines 8] [--out bench/results]

Starts the distribution's sshd on loopback (rediacc_core.testing.sshd) serving demo machines, adds
them as SSH machines (plus one local machine with the first one's root), warms every connection,
then times, interleaved, a bare `python3 -c pass` (t_py), `rdc machine gpu list` and `rdc repo gpu
list` locally and over SSH (served by the machine's resident agent, and with resident agents off:
the one-shot agent each time), each machine's `rdc machine gpu list` alone, and `rdc machine gpu
list --all` over all of them. Writes `fleet.md` and `fleet.json` to the output directory, times also
as multiples of t_py, with the client process's own CPU time and all the CPU the host spent meanwhile.
Needs root and OpenSSH (.ci/install-ssh.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from rediacc_core.demo import build_demo_machine
from rediacc_core.remote import resident
from rediacc_core.testing.sshd import running_sshd, sshd_unavailable

RDC = str(Path(sys.executable).parent / "rdc")
BARE = "python3 -c pass (t_py)"
RUN_TIMEOUT = 300  # seconds one command may take


def timed(env: dict[str, str], *args: str) -> float:
    return run(env, *args)[0]


def host_busy() -> float:
    """CPU seconds this host has spent busy (all cores, all processes) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run(env: dict[str, str], *args: str) -> tuple[float, float]:
    """Wall time and the CPU time of the client process itself (user + system), in seconds."""
    argv = ["python3", "-c", "pass"] if args == ("-c", "pass") else [RDC, *args]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        # A blocking wait4, not Popen.wait(timeout), which polls and so rounds the times it measures.
        watchdog = threading.Timer(RUN_TIMEOUT, proc.kill)
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"rdc {' '.join(args)} failed ({proc.returncode}): {err.read().decode()}")
    return elapsed, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--machines", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    options = parser.parse_args()
    reason = sshd_unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run: {reason}")
    work = Path(tempfile.mkdtemp(prefix="rdc-fb-", dir="/tmp"))
    try:
        samples, summary = measure(work, options.machines, options.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(samples, summary, options.runs, options.out)


Samples = dict[str, dict[str, list[float]]]  # "wall" | "client CPU" | "host CPU" -> case -> seconds


def measure(work: Path, count: int, runs: int) -> tuple[Samples, dict[str, float]]:
    names = [f"f{n}" for n in range(count)]
    fakes = {name: build_demo_machine(work / name, name=name).fake for name in names}
    for fm in fakes.values():
        agent = fm.root / "opt/rediacc/bin/rdc-agent"
        agent.parent.mkdir(parents=True)
        agent.symlink_to(Path(sys.executable).parent / "rdc-agent")
    base = dict(os.environ, RDC_SSH_CONTROL_DIR=str(work / "cm"), COLUMNS="200")
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's rdc has its bytecode cached
    env_ssh = dict(base, REDIACC_CONFIG=str(work / "ssh" / "config.yaml"))
    env_oneshot = dict(env_ssh, RDC_AGENT_IDLE="0")
    env_local = dict(base, REDIACC_CONFIG=str(work / "local" / "config.yaml"))
    with running_sshd(work / "sshd") as server:
        for name, fm in fakes.items():
            key = server.authorize(name, fm.bin_dir)
            args = ["machine", "add", name, "--ssh", server.address, "--root", str(fm.root)]
            timed(env_ssh, *args, "--identity", str(key), "--accept-host-key")
        first = names[0]
        timed(env_local, "machine", "add", first, "--root", str(fakes[first].root))
        for name in names:
            timed(env_ssh, "machine", "setup", name)
        timed(env_ssh, "repo", "create", f"bench@{first}")
        timed(env_ssh, "repo", "gpu", "grant", f"bench@{first}", "--device", "nvidia.com/gpu=0")
        cases = {
            BARE: (base, ["-c", "pass"]),
            "machine gpu list, local": (env_local, ["machine", "gpu", "list", first]),
            "machine gpu list, ssh": (env_ssh, ["machine", "gpu", "list", first]),
            "machine gpu list, ssh, one-shot agent": (env_oneshot, ["machine", "gpu", "list", first]),
            "repo gpu list, local": (env_local, ["repo", "gpu", "list", f"bench@{first}"]),
            "repo gpu list, ssh": (env_ssh, ["repo", "gpu", "list", f"bench@{first}"]),
            "repo gpu list, ssh, one-shot agent": (env_oneshot, ["repo", "gpu", "list", f"bench@{first}"]),
            f"machine gpu list --all ({len(names)} ssh machines)": (
                env_ssh,
                ["machine", "gpu", "list", "--all"],
            ),
        }
        cases |= {f"single {name}": (env_ssh, ["machine", "gpu", "list", name]) for name in names}
        for env, args in cases.values():  # warm: master connections up, files in the page cache
            timed(env, *args)
        samples: dict[str, list[float]] = {case: [] for case in cases}
        client_cpu: dict[str, list[float]] = {case: [] for case in cases}
        host_cpu: dict[str, list[float]] = {case: [] for case in cases}
        for _ in range(runs):
            for case, (env, args) in cases.items():
                busy = host_busy()
                wall, cpu = run(env, *args)
                host_cpu[case].append(host_busy() - busy)  # the client, sshd, ssh, the agents (and noise)
                samples[case].append(wall)
                client_cpu[case].append(cpu)
        server.stop()
        for fm in fakes.values():
            resident.stop(str(fm.root))
    medians = {case: statistics.median(values) * 1000 for case, values in samples.items()}
    singles = [medians[f"single {name}"] for name in names]
    fleet_case = next(case for case in cases if "--all" in case)
    t_py = medians[BARE]
    summary = {
        "t_py (ms)": t_py,
        "machine gpu list, local (t_py)": medians["machine gpu list, local"] / t_py,
        "repo gpu list, local (t_py)": medians["repo gpu list, local"] / t_py,
    }
    for command in ("machine gpu list", "repo gpu list"):
        for how in ("", ", one-shot agent"):
            added = medians[f"{command}, ssh{how}"] - medians[f"{command}, local"]
            summary[f"{command} added by ssh{how} (t_py)"] = added / t_py
    client = {case: statistics.median(values) for case, values in client_cpu.items()}
    host = {case: statistics.median(values) for case, values in host_cpu.items()}
    slowest = max(names, key=lambda name: medians[f"single {name}"])
    summary |= {
        "--all / slowest single": medians[fleet_case] / max(singles),
        "--all / sum of singles": medians[fleet_case] / sum(singles),
        # On a real fleet each machine answers on its own CPUs, so what --all adds is the client's
        # own work; here the 8 agents, sshd and the client share this host's cores.
        "--all client CPU / single client CPU": client[fleet_case] / client[f"single {slowest}"],
        # The least wall time --all could take here: all the CPU it made this host spend, on every core.
        "--all host CPU / cores / slowest single": host[fleet_case]
        / (os.cpu_count() or 1)
        / (medians[f"single {slowest}"] / 1000),
    }
    return {"wall": samples, "client CPU": client_cpu, "host CPU": host_cpu}, summary


def report(samples: Samples, summary: dict[str, float], runs: int, out: Path) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Fleet benchmark, {when}, commit {commit or '?'}",
        "",
        f"{platform.node()}: {os.cpu_count()} CPUs; {runs} interleaved runs per case, medians; warm "
        "(ControlMaster up). sshd and the machines are on this host (loopback).",
        "",
        "| case | median ms | min ms | max ms | median / t_py | client CPU ms | host CPU ms |",
        "|---|---|---|---|---|---|---|",
    ]
    t_py = statistics.median(samples["wall"][BARE]) * 1000
    for case, values in samples["wall"].items():
        ms = [v * 1000 for v in values]
        median = statistics.median(ms)
        client = statistics.median(samples["client CPU"][case]) * 1000
        host = statistics.median(samples["host CPU"][case]) * 1000
        lines.append(
            f"| {case} | {median:.0f} | {min(ms):.0f} | {max(ms):.0f} | {median / t_py:.1f} "
            f"| {client:.0f} | {host:.0f} |"
        )
    lines += ["", "| result | value |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in summary.items()]
    out.mkdir(parents=True, exist_ok=True)
    (out / "fleet.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "fleet.json").write_text(
        json.dumps({"when": when, "commit": commit, "samples_s": samples, "summary": summary}, indent=2)
        + "\n",
        encoding="utf-8",
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
