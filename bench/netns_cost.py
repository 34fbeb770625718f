"""What a repo's own network namespace costs, on each path out: the same work on three daemons
started side by side.

- **host**: a daemon in the host's network namespace, as repo daemons ran before (no iptables,
  its containers on a user-defined bridge in the host's routing table);
- **user**: a daemon in a namespace of its own behind its slirp4netns uplink (`net-path=user`,
  `rediacc_core/runtime/netns.py`), its networks at the uplink's MTU (65520);
- **kernel**: a daemon in a namespace of its own on the kernel path (`net-path=kernel`,
  `rediacc_core/runtime/kernelpath.py`): a veth pair routed and masqueraded by the host.

Measured, in interleaved rounds whose order rotates (medians; ratios taken seconds apart):
daemon start (the namespace, uplink and veth included), `docker run --rm` (create, start, wait,
remove) of a container on a network, and a download by a container (every network at the MTU a
repo daemon gives its networks, 65520) from an HTTP server on the host (busybox httpd; the rules
against the host's own address are lifted for these namespaces, since that server stands for a
registry outside), whole or failed. CPU per GiB downloaded, two ways: the slirp4netns process's
own CPU (the user path's uplink), and the whole machine's softirq time (/proc/stat, all CPUs,
over the download): the kernel's forwarding (bridges, veth, NAT) and its TCP receive work run
there; what a path adds to the host route's of the same round is its own.

Needs root, Docker Engine >= 25, slirp4netns, busybox-static, and a host that forwards IPv4 for
the kernel path: where it does not, run it under .ci/forwarding-host (a throwaway namespace with
forwarding on, standing for the host; its "host" daemon and server are in there too). ~4 minutes.

    bash .ci/forwarding-host .venv/bin/python bench/netns_cost.py [--rounds 7] [--mib 256] \
        [--starts 5] [--out bench/results/netns-cost.md]

`--starts-only` measures the daemon starts alone (`--starts` times each, interleaved), and the part
of each namespace's that is `netns.bring_up` (its rules, uplink and veth, made while the daemon's
containerd starts). Under a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from rediacc_core import unixhttp
from rediacc_core.runtime import daemon, kernelpath, layout, netns
from rediacc_core.testing.dockerenv import import_busybox

IMAGE = "bb:latest"
NETWORK = "benchnet"
PORT = 18765
# Issue 41's targets for the kernel path against the host's namespace (time ratios: a rate of
# 0.95x is 1.05x the time); the user path's, issue 32's, for comparison.
TARGETS = {"start": 1.5, "fetch": 1 / 0.95, "cpu": 0.3}
PATHS = ("host", "user", "kernel")
OWNS = PATHS[1:]

Times = dict[str, list[float]]


def call(sock: Path, method: str, target: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    return unixhttp.request(sock, method, target, body=data, headers=headers, timeout=300)


def run_rm(sock: Path, cmd: list[str], network: str = NETWORK) -> float:
    """`docker run --rm` over the API, on `network`; its wall time in seconds."""
    began = time.perf_counter()
    status, body = call(
        sock, "POST", "/v1.45/containers/create",
        {"Image": IMAGE, "Cmd": cmd, "HostConfig": {"NetworkMode": network}},
    )  # fmt: skip
    assert status == 201, body
    ident = json.loads(body)["Id"]
    status, body = call(sock, "POST", f"/v1.45/containers/{ident}/start")
    assert status == 204, body
    status, body = call(sock, "POST", f"/v1.45/containers/{ident}/wait")
    took = time.perf_counter() - began
    if status != 200 or json.loads(body)["StatusCode"] != 0:
        _, logs = call(sock, "GET", f"/v1.45/containers/{ident}/logs?stdout=1&stderr=1")
        raise AssertionError(f"{cmd} ended {body!r}: {logs!r}")
    call(sock, "DELETE", f"/v1.45/containers/{ident}")
    return took


def softirq_seconds() -> float:
    """The whole machine's softirq time so far (/proc/stat's first line, every CPU)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[7]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_address() -> str:
    """The host's address on its way out (its default route's source): a bridge's address, such as
    a system Docker's docker0, would be the namespace's own bridge's inside."""
    said = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.255"], capture_output=True, text=True)
    words = said.stdout.split()
    if "src" not in words:
        raise SystemExit(f"the host has no IPv4 route out to serve from: {said.stderr.strip()}")
    return words[words.index("src") + 1]


def gateway_of(sock: Path) -> str:
    status, body = call(sock, "GET", f"/v1.45/networks/{NETWORK}")
    assert status == 200, body
    gateway: str = json.loads(body)["IPAM"]["Config"][0]["Gateway"]
    return gateway


def start_all(
    root: Path, base: Path, nets: dict[str, layout.RepoNetwork], parts: Times | None = None
) -> tuple[dict[str, daemon.RunningDaemon], dict[str, float]]:
    """A daemon on each path (host, then each namespace on its own path), each start timed; with
    `parts`, each path's `bring_up` there too (as `<path> bring_up`)."""
    began = time.perf_counter()
    running = {"host": daemon.start_dockerd(root, base / "h")}
    took = {"host": time.perf_counter() - began}
    for path, net in nets.items():

        def bring_up(net: layout.RepoNetwork = net, path: str = path) -> None:
            # As `rdc repo up` does it: while the daemon's containerd starts.
            began = time.perf_counter()
            netns.bring_up(net, root, base / path[0] / "docker.sock", path)
            if parts is not None:
                parts.setdefault(f"{path} bring_up", []).append(time.perf_counter() - began)

        began = time.perf_counter()
        running[path] = daemon.start_dockerd(root, base / path[0], network=net, bring_up=bring_up)
        took[path] = time.perf_counter() - began
    return running, took


def stop_all(running: dict[str, daemon.RunningDaemon], nets: dict[str, layout.RepoNetwork]) -> None:
    for one in running.values():
        one.stop()
    for net in nets.values():
        netns.tear_down(net, "bench")


def measure_starts(
    root: Path, base: Path, nets: dict[str, layout.RepoNetwork], times: int = 5, parts: Times | None = None
) -> Times:
    """Daemon start: all of them again each time, the order of the paths rotating."""
    starts: Times = {path: [] for path in PATHS}
    order = list(nets)
    for _ in range(times):
        order = order[1:] + order[:1]
        running, took = start_all(root, base, {path: nets[path] for path in order}, parts)
        for path, seconds in took.items():
            starts[path].append(seconds)
        stop_all(running, nets)
    return starts


def starts_report(starts: Times, parts: Times) -> str:
    """The start row alone, and each namespace's `bring_up` (done while its containerd starts)."""
    ms: Callable[[Sequence[float]], str] = lambda s: f"{statistics.median(s) * 1e3:.0f} ms"  # noqa: E731
    lines = [
        "| daemon start | " + " | ".join(PATHS) + " | " + " | ".join(f"{p} / host" for p in OWNS) + " |",
        "|---|" + "---|" * (len(PATHS) + len(OWNS)),
        f"| whole | {' | '.join(ms(starts[p]) for p in PATHS)} | "
        + " | ".join(f"{ratio(starts['host'], starts[p]):.2f}x" for p in OWNS)
        + " |",
        f"| `netns.bring_up` | — | {' | '.join(ms(parts[f'{p} bring_up']) for p in OWNS)} | | |",
    ]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return (
        f"# Daemon start ({time.strftime('%Y-%m-%d')}, commit {commit}, {len(starts['host'])} starts "
        f"each, medians; {os.cpu_count()} CPUs)\n\n" + "\n".join(lines) + "\n"
    )


# The whole body must arrive (nc's own status says nothing of a connection cut short).
FETCH = (
    f"n=$(printf 'GET /blob HTTP/1.0\\r\\n\\r\\n' | nc {{}} {PORT} | wc -c); "
    '[ "$n" -gt {} ] || {{ echo "got $n bytes"; exit 1; }}'
)


def measure_work(
    routes: dict[str, tuple[Path, str, str]], uplink: int | None, rounds: int, mib: int
) -> tuple[Times, Times, Times, Times]:
    """`docker run --rm` and the download on each route (daemon socket, network, server address);
    the uplink's CPU seconds per GiB on the user path, the machine's softirq seconds on each."""
    runs: Times = {path: [] for path in routes}
    fetches: Times = {path: [] for path in routes}
    cpu: Times = {"user": []}
    softirq: Times = {path: [] for path in routes}
    order = list(routes)
    for round_ in range(rounds + 1):  # one warm-up round, not counted
        order = order[1:] + order[:1]
        for path in order:
            sock, network, server = routes[path]
            took_run = run_rm(sock, ["true"], network)
            cpu_before, softirq_before = cpu_seconds(uplink), softirq_seconds()
            try:
                took_fetch = run_rm(sock, ["sh", "-c", FETCH.format(server, mib << 20)], network)
            except AssertionError as exc:
                raise SystemExit(f"the download on the route {path!r} failed: {exc}") from exc
            if round_ == 0:
                continue
            runs[path].append(took_run)
            fetches[path].append(took_fetch - took_run)
            softirq[path].append((softirq_seconds() - softirq_before) * 1024 / mib)
            if path in cpu:
                cpu[path].append((cpu_seconds(uplink) - cpu_before) * 1024 / mib)
    return runs, fetches, cpu, softirq


def ratio(host_s: Sequence[float], own_s: Sequence[float]) -> float:
    return statistics.median(n / h for h, n in zip(host_s, own_s, strict=True))


def report(
    starts: Times, runs: Times, fetches: Times, cpu: Times, softirq: Times, mib: int, rounds: int
) -> str:
    ms: Callable[[float], str] = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731

    def met(value: float, target: float | None) -> str:
        return "" if target is None else (" ✓" if value <= target else " ✗")

    def row(what: str, times: Times, fmt: Callable[[float], str], target: float | None = None) -> str:
        cells = [fmt(statistics.median(times[p])) for p in PATHS]
        found = {p: ratio(times["host"], times[p]) for p in OWNS}
        # The targets are the kernel path's; the user path's ratio is shown beside it.
        ratios = [f"{found[p]:.2f}x{met(found[p], target if p == 'kernel' else None)}" for p in OWNS]
        return f"| {what} | {' | '.join(cells)} | {' | '.join(ratios)} |"

    rates = [f"{mib / statistics.median(fetches[p]):.0f} MiB/s" for p in PATHS]
    rate_ratios = [f"{1 / ratio(fetches['host'], fetches[p]):.2f}x" for p in OWNS]
    rate_ratios[1] += " ✓" if 1 / ratio(fetches["host"], fetches["kernel"]) >= 0.95 else " ✗"
    soft = [f"{statistics.median(softirq[p]):.2f} s" for p in PATHS]
    # The path's own: each round's softirq less the host route's of the same round (the TCP
    # receive work and the container's bridge are on both).
    beyond = {
        p: statistics.median(a - b for a, b in zip(softirq[p], softirq["host"], strict=True)) for p in OWNS
    }
    beyond_cells = [f"{beyond[p]:.2f} s" for p in OWNS]
    beyond_cells[1] += met(beyond["kernel"], TARGETS["cpu"])
    lines = [
        "| measure | " + " | ".join(PATHS) + " | " + " | ".join(f"{p} / host" for p in OWNS) + " |",
        "|---|" + "---|" * (len(PATHS) + len(OWNS)),
        row("daemon start (namespace, uplink and veth included)", starts, ms, TARGETS["start"]),
        row("`docker run --rm … true` on a network", runs, ms),
        row(f"download of {mib} MiB from the host (time)", fetches, ms, TARGETS["fetch"]),
        f"| the same download (rate) | {' | '.join(rates)} | {' | '.join(rate_ratios)} |",
        f"| the machine's softirq CPU per GiB downloaded | {' | '.join(soft)} | | |",
        f"| the same, beyond the host route's (the path's own) | — | {' | '.join(beyond_cells)} | | |",
        f"| slirp4netns CPU per GiB downloaded | — | {statistics.median(cpu['user']):.2f} s | — | | |",
    ]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    targets = (
        f"Targets (issue 41), the kernel path against the host's namespace: daemon start ≤ "
        f"{TARGETS['start']}x, download rate ≥ 0.95x (time ≤ {TARGETS['fetch']:.2f}x), ≤ "
        f"{TARGETS['cpu']} s of CPU per GiB on the path (softirq). Run with ip_forward={forwarding} "
        "in the bench's network namespace."
    )
    return (
        f"# Network namespace cost ({time.strftime('%Y-%m-%d')}, commit {commit}, {rounds} rounds, "
        f"medians; {os.cpu_count()} CPUs)\n\n" + "\n".join(lines) + "\n\n" + targets + "\n"
    )


def create_networks(socks: Sequence[Path]) -> None:
    """NETWORK on each daemon, all at the MTU repo daemons give their networks (65520), so the
    routes differ only in the path out, not in the size of their packets."""
    mtu = {"com.docker.network.driver.mtu": str(netns.UPLINK_MTU)}
    body: dict[str, object] = {"Name": NETWORK, "Options": mtu}
    for sock in socks:
        status, answer = call(sock, "POST", "/v1.45/networks/create", body)
        assert status == 201, answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--starts", type=int, default=5, help="daemon starts on each path")
    parser.add_argument("--starts-only", action="store_true", help="measure the daemon starts alone")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rdcn", dir="/tmp"))
    root = base / "m"
    (root / "etc/cdi").mkdir(parents=True)
    www = base / "www"
    www.mkdir()
    with open(www / "blob", "wb") as blob:
        blob.truncate(args.mib << 20)
    state = root / "var/lib/rediacc/repos"
    nets = {
        path: layout.network_for(f"benchnetns0{n}", base / f"run{n}", state / f"bench-{path}")
        for n, path in enumerate(OWNS)
    }
    address = host_address()
    server = subprocess.Popen(["busybox", "httpd", "-f", "-p", f"0.0.0.0:{PORT}", "-h", str(www)])
    running: dict[str, daemon.RunningDaemon] = {}
    try:
        parts: Times = {}
        starts = measure_starts(root, base, nets, args.starts, parts)
        if args.starts_only:
            text = starts_report(starts, parts)
            print(text)
            if args.out is not None:
                args.out.write_text(text)
            return 0
        running, _ = start_all(root, base, nets)
        # The bench's server stands for the outside: the rules against the host's address lifted
        # (the uplink's; the kernel path's jump for what comes to the host itself), and the
        # keepers, whose watchers would write them again at the host bridge's creation, stopped; the
        # kernel path's raw chain, which drops what goes to the host's own addresses, unjumped.
        for net in nets.values():
            net.keeper.stop(netns.PROCESS_STOP_TIMEOUT)
            netns.apply_rules(net, [])
        into = kernelpath.chain_names(nets["kernel"].short)[0]
        veth = kernelpath.veth_name(nets["kernel"].short)
        subprocess.run(["iptables", "-D", "INPUT", "-i", veth, "-j", into], check=True)
        raw = kernelpath.raw_chain(nets["kernel"].short)
        subprocess.run(["iptables", "-t", "raw", "-D", "PREROUTING", "-i", veth, "-j", raw], check=True)
        for one in running.values():
            import_busybox(one.socket, IMAGE)
        create_networks([one.socket for one in running.values()])
        # Where each daemon's containers reach the server: the host's bridge address for the daemon
        # in the host's namespace, the host's own address out of a namespace for the others.
        routes = {
            "host": (running["host"].socket, NETWORK, gateway_of(running["host"].socket)),
            **{path: (running[path].socket, NETWORK, address) for path in OWNS},
        }
        runs, fetches, cpu, softirq = measure_work(
            routes, netns.uplink_pid(nets["user"]), args.rounds, args.mib
        )
        text = report(starts, runs, fetches, cpu, softirq, args.mib, args.rounds)
        print(text)
        if args.out is not None:
            args.out.write_text(text)
    finally:
        server.terminate()
        stop_all(running, nets)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
