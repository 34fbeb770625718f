"""What a repo's own network namespace costs: the same work on two daemons started side by side.

- **host**: a daemon in the host's network namespace, as repo daemons ran before (no iptables,
  its containers on a user-defined bridge in the host's routing table);
- **own**: a daemon in a namespace of its own behind its slirp4netns uplink, as `rdc repo up`
  starts it (`rediacc_core/runtime/netns.py`), its networks at the uplink's MTU (65520);
- **own, MTU 1500**: the same daemon, on a network created at Docker's usual MTU, as its
  networks were before (the download only).

Measured, in interleaved rounds whose order rotates (medians; ratios taken seconds apart):
daemon start (the namespace and uplink included), `docker run --rm` (create, start, wait, remove)
of a container on a network, and a download by a container from an HTTP server on the host
(busybox httpd; the uplink's rule against the host's own address is lifted for this namespace,
since that server stands for a registry outside), whole or failed, with the CPU seconds the
uplink process spent per GiB. Needs root, Docker Engine >= 25, slirp4netns and busybox-static;
~3 minutes.

    python bench/netns_cost.py [--rounds 7] [--mib 256] [--out bench/results/netns-cost.md]
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
from rediacc_core.runtime import daemon, netns
from rediacc_core.testing.dockerenv import import_busybox

IMAGE = "bb:latest"
NETWORK = "benchnet"
PORT = 18765
SMALL_MTU = 1500
# The targets, own namespace against the host's (time ratios: a rate of 0.8x is 1.25x the time).
TARGETS = {"start": 1.1, "fetch": 1 / 0.8, "cpu": 1.0}
PATHS = ("host", "own", f"own, MTU {SMALL_MTU}")

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


def start_pair(
    root: Path, base: Path, net: netns.RepoNetwork
) -> tuple[daemon.RunningDaemon, daemon.RunningDaemon, float, float]:
    began = time.perf_counter()
    host = daemon.start_dockerd(root, base / "h")
    host_took = time.perf_counter() - began
    began = time.perf_counter()
    netns.bring_up(net, root, base / "n" / "docker.sock")
    own = daemon.start_dockerd(root, base / "n", network=net)
    own_took = time.perf_counter() - began
    return host, own, host_took, own_took


def measure_starts(root: Path, base: Path, net: netns.RepoNetwork, times: int = 3) -> Times:
    """Daemon start: the whole pair again each time."""
    starts: Times = {"host": [], "own": []}
    for _ in range(times):
        host, own, host_took, own_took = start_pair(root, base, net)
        starts["host"].append(host_took)
        starts["own"].append(own_took)
        host.stop()
        own.stop()
        netns.tear_down(net, "bench")
    return starts


# The whole body must arrive (nc's own status says nothing of a connection cut short).
FETCH = (
    f"n=$(printf 'GET /blob HTTP/1.0\\r\\n\\r\\n' | nc {{}} {PORT} | wc -c); "
    '[ "$n" -gt {} ] || {{ echo "got $n bytes"; exit 1; }}'
)


def measure_work(
    routes: dict[str, tuple[Path, str, str]], uplink: int | None, rounds: int, mib: int
) -> tuple[Times, Times, Times]:
    """`docker run --rm` and the download on each route (daemon socket, network, server address);
    the uplink's CPU seconds per GiB on the routes through it."""
    runs: Times = {path: [] for path in routes}
    fetches: Times = {path: [] for path in routes}
    cpu: Times = {path: [] for path in routes if path != "host"}
    order = list(routes)
    for round_ in range(rounds + 1):  # one warm-up round, not counted
        order = order[1:] + order[:1]
        for path in order:
            sock, network, server = routes[path]
            took_run = run_rm(sock, ["true"], network)
            cpu_before = cpu_seconds(uplink)
            try:
                took_fetch = run_rm(sock, ["sh", "-c", FETCH.format(server, mib << 20)], network)
            except AssertionError as exc:
                raise SystemExit(f"the download on the route {path!r} failed: {exc}") from exc
            if round_ == 0:
                continue
            runs[path].append(took_run)
            fetches[path].append(took_fetch - took_run)
            if path in cpu:
                cpu[path].append((cpu_seconds(uplink) - cpu_before) * 1024 / mib)
    return runs, fetches, cpu


def ratio(host_s: Sequence[float], own_s: Sequence[float]) -> float:
    return statistics.median(n / h for h, n in zip(host_s, own_s, strict=True))


def report(starts: Times, runs: Times, fetches: Times, cpu: Times, mib: int, rounds: int) -> str:
    owns = PATHS[1:]
    ms: Callable[[float], str] = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731

    def met(value: float, target: float | None) -> str:
        return "" if target is None else (" ✓" if value <= target else " ✗")

    def row(what: str, times: Times, fmt: Callable[[float], str], target: float | None = None) -> str:
        cells = [fmt(statistics.median(times[p])) if p in times else "—" for p in PATHS]
        found = {p: ratio(times["host"], times[p]) for p in owns if p in times}
        ratios = [f"{found[p]:.2f}x{met(found[p], target)}" if p in found else "—" for p in owns]
        return f"| {what} | {' | '.join(cells)} | {' | '.join(ratios)} |"

    rates = [f"{mib / statistics.median(fetches[p]):.0f} MiB/s" for p in PATHS]
    rate_ratios = [f"{1 / ratio(fetches['host'], fetches[p]):.2f}x" for p in owns]
    cpu_cells = [
        f"{statistics.median(cpu[p]):.2f} s{met(statistics.median(cpu[p]), TARGETS['cpu'])}" for p in owns
    ]
    lines = [
        "| measure | " + " | ".join(PATHS) + " | " + " | ".join(f"{p} / host" for p in owns) + " |",
        "|---|" + "---|" * (len(PATHS) + len(owns)),
        row("daemon start (namespace and uplink included)", starts, ms, TARGETS["start"]),
        row("`docker run --rm … true` on a network", {p: runs[p] for p in PATHS[:2]}, ms),
        row(f"download of {mib} MiB from the host (time)", fetches, ms, TARGETS["fetch"]),
        f"| the same download (rate) | {' | '.join(rates)} | {' | '.join(rate_ratios)} |",
        f"| uplink CPU per GiB downloaded | — | {' | '.join(cpu_cells)} | | |",
    ]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    targets = (
        f"Targets (issue 32), own namespace against the host's: daemon start ≤ {TARGETS['start']}x, "
        f"download rate ≥ 0.8x (time ≤ {TARGETS['fetch']:.2f}x), uplink CPU ≤ {TARGETS['cpu']:.0f} s per GiB."
    )
    return (
        f"# Network namespace cost ({time.strftime('%Y-%m-%d')}, commit {commit}, {rounds} rounds, "
        f"medians; {os.cpu_count()} CPUs)\n\n" + "\n".join(lines) + "\n\n" + targets + "\n"
    )


def create_networks(host: Path, own: Path) -> None:
    """NETWORK on both daemons (the own daemon's at its default, the uplink's MTU), and the own
    daemon's network at the usual MTU."""
    small: dict[str, object] = {
        "Name": f"{NETWORK}{SMALL_MTU}",
        "Options": {"com.docker.network.driver.mtu": str(SMALL_MTU)},
    }
    plain: dict[str, object] = {"Name": NETWORK}
    for sock, body in ((host, plain), (own, plain), (own, small)):
        status, answer = call(sock, "POST", "/v1.45/networks/create", body)
        assert status == 201, answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rdcn", dir="/tmp"))
    root = base / "m"
    (root / "etc/cdi").mkdir(parents=True)
    www = base / "www"
    www.mkdir()
    with open(www / "blob", "wb") as blob:
        blob.truncate(args.mib << 20)
    net = netns.network_for("benchnetns00", base / "run")
    address = host_address()
    server = subprocess.Popen(["busybox", "httpd", "-f", "-p", f"0.0.0.0:{PORT}", "-h", str(www)])
    host = own = None
    try:
        starts = measure_starts(root, base, net)
        host, own, _, _ = start_pair(root, base, net)
        # The bench's server stands for the outside: its rule lifted, and the keeper, whose watcher
        # would write it again at the host bridge's creation, stopped (no port is published).
        net.keeper.stop(netns.PROCESS_STOP_TIMEOUT)
        netns.apply_rules(net, [])
        for sock in (host.socket, own.socket):
            import_busybox(sock, IMAGE)
        create_networks(host.socket, own.socket)
        # Where each daemon's containers reach the server: the host's bridge address for the daemon
        # in the host's namespace, the host's own address through the uplink for the other.
        routes = {
            "host": (host.socket, NETWORK, gateway_of(host.socket)),
            "own": (own.socket, NETWORK, address),
            PATHS[2]: (own.socket, f"{NETWORK}{SMALL_MTU}", address),
        }
        runs, fetches, cpu = measure_work(routes, netns.uplink_pid(net), args.rounds, args.mib)
        text = report(starts, runs, fetches, cpu, args.mib, args.rounds)
        print(text)
        if args.out is not None:
            args.out.write_text(text)
    finally:
        server.terminate()
        for running in (host, own):
            if running is not None:
                running.stop()
        netns.tear_down(net, "bench")
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
