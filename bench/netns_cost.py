"""What a repo's own network namespace costs: the same work on two daemons started side by side.

- **host**: a daemon in the host's network namespace, as repo daemons ran before (no iptables,
  its containers on a user-defined bridge in the host's routing table);
- **netns**: a daemon in a namespace of its own behind a slirp4netns uplink, as `rdc repo up`
  starts it now (`rediacc_core/runtime/netns.py`).

Measured, in interleaved rounds whose order rotates (medians; ratios taken seconds apart):
daemon start (the namespace and uplink included), `docker run --rm` (create, start, wait, remove)
of a container on a network, and a download by a container from an HTTP server on the host
(busybox httpd; the uplink's rule against the host's own address is lifted for this one
namespace, since that server stands for a registry outside), with the CPU seconds the uplink
process spent per GiB. Needs root, Docker Engine >= 25, slirp4netns and busybox-static; ~3 minutes.

    python bench/netns_cost.py [--rounds 7] [--mib 256] [--out bench/results/netns-cost.md]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rediacc_core import unixhttp
from rediacc_core.runtime import daemon, netns
from rediacc_core.testing.dockerenv import import_busybox

IMAGE = "bb:latest"
NETWORK = "benchnet"


def call(sock: Path, method: str, target: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    return unixhttp.request(sock, method, target, body=data, headers=headers, timeout=300)


def run_rm(sock: Path, cmd: list[str]) -> float:
    """`docker run --rm` over the API, on NETWORK; its wall time in seconds."""
    began = time.perf_counter()
    status, body = call(
        sock, "POST", "/v1.45/containers/create",
        {"Image": IMAGE, "Cmd": cmd, "HostConfig": {"NetworkMode": NETWORK}},
    )  # fmt: skip
    assert status == 201, body
    ident = json.loads(body)["Id"]
    status, body = call(sock, "POST", f"/v1.45/containers/{ident}/start")
    assert status == 204, body
    status, body = call(sock, "POST", f"/v1.45/containers/{ident}/wait")
    took = time.perf_counter() - began
    assert status == 200 and json.loads(body)["StatusCode"] == 0, body
    call(sock, "DELETE", f"/v1.45/containers/{ident}")
    return took


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_address() -> str:
    for cidr in netns.host_destinations():
        network = ipaddress.ip_network(cidr)
        if network.prefixlen == 32 and not network.is_link_local:
            return str(network.network_address)
    raise SystemExit("the host has no non-loopback IPv4 address to serve from")


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
    inside = daemon.start_dockerd(root, base / "n", network=net)
    inside_took = time.perf_counter() - began
    return host, inside, host_took, inside_took


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
    server = subprocess.Popen(["busybox", "httpd", "-f", "-p", "0.0.0.0:18765", "-h", str(www)])
    host = inside = None
    starts: dict[str, list[float]] = {"host": [], "netns": []}
    try:
        for _ in range(3):  # daemon start: the whole pair again each time
            host, inside, host_took, inside_took = start_pair(root, base, net)
            starts["host"].append(host_took)
            starts["netns"].append(inside_took)
            host.stop()
            inside.stop()
            netns.tear_down(net, "benchnetns00")
        host, inside, _, _ = start_pair(root, base, net)
        netns.apply_rules(net, [])  # the bench's server stands for the outside
        socks = {"host": host.socket, "netns": inside.socket}
        for sock in socks.values():
            import_busybox(sock, IMAGE)
            status, body = call(sock, "POST", "/v1.45/networks/create", {"Name": NETWORK})
            assert status == 201, body
        # Where each daemon's containers reach the server: the host's bridge address for the daemon
        # in the host's namespace, the host's own address through the uplink for the other.
        targets = {"host": gateway_of(host.socket), "netns": address}
        fetch = "printf 'GET /blob HTTP/1.0\\r\\n\\r\\n' | nc {} 18765 > /dev/null"
        times: dict[str, dict[str, list[float]]] = {
            "run": {"host": [], "netns": []},
            "fetch": {"host": [], "netns": []},
        }
        uplink_cpu: list[float] = []
        order = list(socks)
        for round_ in range(args.rounds + 1):  # one warm-up round, not counted
            order = order[1:] + order[:1]
            for path in order:
                took_run = run_rm(socks[path], ["true"])
                cpu_before = cpu_seconds(netns.uplink_pid(net))
                took_fetch = run_rm(socks[path], ["sh", "-c", fetch.format(targets[path])])
                if round_ == 0:
                    continue
                times["run"][path].append(took_run)
                times["fetch"][path].append(took_fetch - took_run)
                if path == "netns":
                    uplink_cpu.append((cpu_seconds(netns.uplink_pid(net)) - cpu_before) * 1024 / args.mib)

        def row(what: str, host_s: list[float], netns_s: list[float], fmt: Callable[[float], str]) -> str:
            ratio = statistics.median(n / h for h, n in zip(host_s, netns_s, strict=True))
            medians = f"{fmt(statistics.median(host_s))} | {fmt(statistics.median(netns_s))}"
            return f"| {what} | {medians} | {ratio:.2f}x |"

        ms: Callable[[float], str] = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731
        rate: Callable[[float], str] = lambda s: f"{args.mib / s:.0f} MiB/s"  # noqa: E731
        lines = [
            "| measure | host namespace | own namespace | own / host |",
            "|---|---|---|---|",
            row("daemon start (namespace and uplink included)", starts["host"], starts["netns"], ms),
            row("`docker run --rm … true` on a network", times["run"]["host"], times["run"]["netns"], ms),
            row(
                f"download of {args.mib} MiB from the host (time)",
                times["fetch"]["host"],
                times["fetch"]["netns"],
                ms,
            ),
            f"| the same download (rate) | {rate(statistics.median(times['fetch']['host']))} "
            f"| {rate(statistics.median(times['fetch']['netns']))} | |",
            f"| uplink CPU per GiB downloaded | — | {statistics.median(uplink_cpu):.2f} s | |",
        ]
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        text = (
            f"# Network namespace cost ({time.strftime('%Y-%m-%d')}, commit {commit}, {args.rounds} rounds, "
            f"medians; {os.cpu_count()} CPUs)\n\n" + "\n".join(lines) + "\n"
        )
        print(text)
        if args.out is not None:
            args.out.write_text(text)
    finally:
        server.terminate()
        for running in (host, inside):
            if running is not None:
                running.stop()
        netns.tear_down(net, "benchnetns00")
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
