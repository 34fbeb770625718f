"""The measurements. Each returns plain records (dicts) that `report.py` turns into tables.

Paths are measured interleaved: within a round every path runs once per scenario, and the order of
the paths rotates from round to round, so a slow minute on the machine (another tenant, a GC in the
daemon) falls on every path alike.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
import stack
import uds

Record = dict[str, Any]


@dataclass(frozen=True)
class Settings:
    """Sizes of one run. A round is `slices` short cycles, each measuring every path once."""

    rounds: int
    slices: int
    rate_seconds: float  # per path and cycle
    rate_conns: int
    creates: int  # per path and cycle
    decisions: int  # per path and cycle
    bulk_mib: int
    bulk_per_round: int
    idle_conns: int
    attached: int
    cli_creates: int = 3  # `docker create` through the CLI, per path and cycle

    @property
    def cycles(self) -> int:
        return self.rounds * self.slices


# Short cycles, many of them: this machine is shared, and a burst of someone else's work then
# spoils one short sample of every path alike instead of one long sample of one path.
FULL = Settings(
    rounds=3,
    slices=8,
    rate_seconds=0.75,
    rate_conns=8,
    creates=5,
    decisions=50,
    bulk_mib=256,
    bulk_per_round=2,
    idle_conns=1000,
    attached=200,
)
QUICK = Settings(
    rounds=1,
    slices=1,
    rate_seconds=1.0,
    rate_conns=8,
    creates=5,
    decisions=50,
    bulk_mib=16,
    bulk_per_round=1,
    idle_conns=100,
    attached=10,
)


def rotated(paths: Sequence[str], cycle: int) -> list[str]:
    """The paths in the order one cycle measures them; each cycle starts one further along."""
    shift = cycle % len(paths)
    return list(paths[shift:]) + list(paths[:shift])


# --- request rate ----------------------------------------------------------------------------------
def with_proxy_cpu(pid: int | None, run: Callable[[], Record]) -> Record:
    """Runs one load and adds the proxy's CPU time per request served (None for the direct path).

    The CPU time is that of the process `pid` and its descendants (a proxy's forked workers), and
    `proxy_processes` says how many there were when the load ended. CPU per request hardly moves
    when other work shares the machine, unlike requests per second.
    """
    if pid is None:
        return {**run(), "proxy_cpu_us_per_req": None}
    before = stack.cpu_seconds(pid)
    result = run()
    spent = stack.cpu_seconds(pid) - before
    served = result.get("completed_total") or result.get("requests") or 0
    return {
        **result,
        "proxy_cpu_s": spent,
        "proxy_cpu_us_per_req": spent / served * 1e6 if served else None,
        "proxy_processes": len(stack.process_tree(pid)),
    }


def _posting(body_file: Path) -> dict[str, Any]:
    """loadgen.run's arguments that send the captured create body, as the docker CLI does."""
    return {"method": "POST", "body_file": body_file, "headers": ("Content-Type: application/json",)}


def _loadgen(
    scenario: str,
    binary: Path,
    socks: dict[str, str],
    pids: dict[str, int],
    endpoint: str,
    cycle: int,
    *,
    conns: int,
    duration_s: float,
    warmup_s: float,
    label: str | None = None,
    **request: Any,
) -> list[Record]:
    """One load-generator run per path, in this cycle's rotated order, with each proxy's CPU
    (`request`: loadgen.run's method, body_file, headers and requests, for other requests than
    GETs; `label`: what the records call the endpoint, when not its path)."""
    records = []
    for name in rotated(list(socks), cycle):
        result = with_proxy_cpu(
            pids.get(name),
            functools.partial(
                loadgen.run,
                binary,
                socks[name],
                endpoint,
                conns=conns,
                duration_s=duration_s,
                warmup_s=warmup_s,
                **request,
            ),
        )
        records.append(
            {"scenario": scenario, "endpoint": label or endpoint, "path": name, "cycle": cycle, **result}
        )
    return records


def rate(
    binary: Path, socks: dict[str, str], pids: dict[str, int], endpoint: str, cycle: int, settings: Settings
) -> list[Record]:
    """Keep-alive GETs from several connections at once, as fast as each path answers."""
    return _loadgen(
        "rate",
        binary,
        socks,
        pids,
        endpoint,
        cycle,
        conns=settings.rate_conns,
        duration_s=settings.rate_seconds,
        warmup_s=0.25,
    )


def parallel_decisions(
    binary: Path,
    socks: dict[str, str],
    pids: dict[str, int],
    body_file: Path,
    api: str,
    taken: str,
    cycle: int,
    settings: Settings,
) -> list[Record]:
    """The create body with a name already taken (the daemon answers 409) from several connections
    at once, as fast as each path answers. Here the decision is most of the work on the path, and
    the gate is what limits the rate: what its worker processes buy shows most plainly."""
    return _loadgen(
        "parallel",
        binary,
        socks,
        pids,
        f"/{api}/containers/create?name={taken}",
        cycle,
        conns=settings.rate_conns,
        duration_s=settings.rate_seconds,
        warmup_s=0.25,
        **_posting(body_file),
    )


def latency(
    binary: Path, socks: dict[str, str], pids: dict[str, int], endpoint: str, cycle: int, settings: Settings
) -> list[Record]:
    """One connection, one request at a time: what each hop adds to a single request."""
    return _loadgen(
        "latency",
        binary,
        socks,
        pids,
        endpoint,
        cycle,
        conns=1,
        duration_s=settings.rate_seconds / 2,
        warmup_s=0.2,
    )


# --- container create --------------------------------------------------------------------------------
def create(
    binary: Path,
    socks: dict[str, str],
    body_file: Path,
    api: str,
    docker_sock: str,
    keep: set[str],
    cycle: int,
    settings: Settings,
) -> list[Record]:
    """`docker run --device ...`'s create request, one at a time, each making a real container.

    The containers are removed after each batch so every batch starts from the same daemon state.
    """
    records = []
    for name in rotated(list(socks), cycle):
        result = loadgen.run(
            binary,
            socks[name],
            f"/{api}/containers/create",
            conns=1,
            duration_s=120,
            warmup_s=0,
            requests=settings.creates,
            **_posting(body_file),
        )
        records.append({"scenario": "create", "endpoint": "create", "path": name, "cycle": cycle, **result})
        remove_all_but(docker_sock, keep)
    return records


def cli_create(
    socks: dict[str, str],
    docker_sock: str,
    keep: set[str],
    image: str,
    device: str,
    config_dir: Path,
    cycle: int,
    settings: Settings,
) -> list[Record]:
    """`docker create --device DEVICE IMAGE true` through the installed CLI, timed whole (the CLI's
    start, its ping, the create, its exit): what a user waits for on each path. The median of
    `cli_creates` runs per path and cycle; none when no `docker` CLI is installed."""
    docker = shutil.which("docker")
    if docker is None or not settings.cli_creates:
        return []
    argv = [docker, "create", "--network", "none", "--device", device, image, "true"]
    records = []
    for name in rotated(list(socks), cycle):
        env = dict(os.environ, DOCKER_HOST=f"unix://{socks[name]}", DOCKER_CONFIG=str(config_dir))
        spent = []
        for _ in range(settings.cli_creates):
            start = time.perf_counter()
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            spent.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise RuntimeError(f"docker create via {name} failed: {done.stderr.strip()}")
        median_us = statistics.median(spent) * 1e6
        records.append(
            {
                "scenario": "cli-create",
                "endpoint": "docker create",
                "path": name,
                "cycle": cycle,
                "latency_us": {"p50": median_us, "p99": max(spent) * 1e6},
            }
        )
        remove_all_but(docker_sock, keep)
    return records


def decision(
    binary: Path,
    socks: dict[str, str],
    pids: dict[str, int],
    body_file: Path,
    api: str,
    taken: str,
    cycle: int,
    settings: Settings,
) -> list[Record]:
    """The same create body with a name already in use: the daemon answers 409 after decoding it.

    The daemon's own work is then small and steady, so the difference between paths is the proxy's
    cost: reading the body, deciding, re-encoding and forwarding it. This is the create-decision
    target's measure; the real creates above show it against a whole create.
    """
    return _loadgen(
        "decision",
        binary,
        socks,
        pids,
        f"/{api}/containers/create?name={taken}",
        cycle,
        label="create (409)",
        conns=1,
        duration_s=120,
        warmup_s=0,
        requests=settings.decisions,
        **_posting(body_file),
    )


def remove_all_but(docker_sock: str, keep: set[str]) -> None:
    listed = uds.call(docker_sock, "GET", "/containers/json?all=1", timeout=60).json()
    doomed = [c["Id"] for c in listed if not ({n.lstrip("/") for n in c["Names"]} & keep)]
    stack.remove_containers(docker_sock, doomed)


# --- bulk transfer -----------------------------------------------------------------------------------
def write_bulk_tar(path: Path, mib: int) -> int:
    """A tar holding one file `big` of `mib` MiB of incompressible bytes; returns the tar's size."""
    block = os.urandom(1 << 20)
    info = tarfile.TarInfo("big")
    info.size = mib << 20
    info.mode = 0o644
    info.mtime = int(time.time())
    with open(path, "wb") as out:
        out.write(info.tobuf(format=tarfile.GNU_FORMAT))
        for _ in range(mib):
            out.write(block)
        out.write(b"\0" * 1024)  # two empty blocks end a tar; the data already fills whole blocks
    return path.stat().st_size


def _curl(argv: list[str], timeout: float) -> tuple[int, int, float]:
    """(HTTP status, bytes moved, seconds) of one curl transfer."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"curl failed ({result.returncode}): {result.stderr.strip()}")
    status, size, seconds = result.stdout.split()
    return int(status), int(float(size)), float(seconds)


def bulk(
    socks: dict[str, str], tar_path: Path, api: str, container: str, cycle: int, settings: Settings
) -> list[Record]:
    """A `docker cp` sized tar in (PUT, with Content-Length and chunked as the CLI sends it) and out (GET)."""
    timeout = 30 + settings.bulk_mib  # generous: even 10 MB/s finishes
    base = f"http://docker/{api}/containers/{container}/archive"
    records = []
    for name in rotated(list(socks), cycle):
        sock = socks[name]
        common = ["curl", "-sS", "--unix-socket", sock, "-o", "/dev/null", "-H", "Expect:"]
        ops: list[tuple[str, list[str], str]] = [
            (
                "PUT archive (Content-Length)",
                ["-T", str(tar_path), "-H", "Content-Type: application/x-tar"],
                "upload",
            ),
            (
                "PUT archive (chunked)",
                [
                    "-T",
                    str(tar_path),
                    "-H",
                    "Content-Type: application/x-tar",
                    "-H",
                    "Transfer-Encoding: chunked",
                ],
                "upload",
            ),
            ("GET archive", [], "download"),
        ]
        for op, extra, direction in ops:
            target = f"{base}?path=/tmp" if direction == "upload" else f"{base}?path=/tmp/big"
            write_out = f"%{{http_code}} %{{size_{direction}}} %{{time_total}}"
            status, size, seconds = _curl([*common, *extra, "-w", write_out, target], timeout)
            records.append(
                {
                    "scenario": "bulk",
                    "endpoint": op,
                    "path": name,
                    "cycle": cycle,
                    "status": status,
                    "bytes": size,
                    "seconds": seconds,
                    "mb_per_s": size / seconds / 1e6 if seconds else 0.0,
                }
            )
    return records


# --- memory ----------------------------------------------------------------------------------------
def settle_rss(pid: int) -> int:
    """RSS of the process and its descendants once it stops moving (they may still be finishing
    replies when we look); see `stack.rss_kib`."""
    last = stack.rss_kib(pid)
    for _ in range(20):
        time.sleep(0.1)
        now = stack.rss_kib(pid)
        if now == last:
            return now
        last = now
    return last


def warm_up(sock: str, requests: int = 50) -> None:
    """A few requests on one connection, so one-time imports and caches are not counted as memory per item."""
    with uds.Conn(sock) as conn:
        for _ in range(requests):
            conn.request("GET", "/_ping")
            conn.request("GET", "/containers/json")


def idle_connections(name: str, sock: str, pid: int, count: int) -> Record:
    """`count` keep-alive connections, each after one answered /_ping, held open together."""
    before = settle_rss(pid)
    conns: list[uds.Conn] = []
    failed = 0
    try:
        for _ in range(count):
            conn = uds.Conn(sock, timeout=30)
            conns.append(conn)
            if conn.request("GET", "/_ping").status != 200:
                failed += 1
        held = settle_rss(pid)
        processes = len(stack.process_tree(pid))
    finally:
        for conn in conns:
            conn.close()
    after_close = settle_rss(pid)
    return {
        "scenario": "memory",
        "endpoint": "idle keep-alive connections",
        "path": name,
        "count": count,
        "failed": failed,
        "rss_before_kib": before,
        "rss_held_kib": held,
        "rss_after_close_kib": after_close,
        "processes": processes,
        "kib_per_item": (held - before) / count,
    }


def start_attachable(docker_sock: str, count: int) -> list[str]:
    """`count` running containers whose `cat` echoes stdin back, for attach streams to hold open."""
    config = {
        "Image": stack.IMAGE,
        "Cmd": ["cat"],
        "OpenStdin": True,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "HostConfig": {"NetworkMode": "none"},
        "Labels": {"rediacc.bench": "attach"},
    }

    def make(_: int) -> str:
        resp = uds.call(docker_sock, "POST", "/containers/create", config, timeout=60)
        if resp.status != 201:
            raise RuntimeError(f"create for attach failed: {resp.status} {resp.body[:200]!r}")
        cid: str = resp.json()["Id"]
        started = uds.call(docker_sock, "POST", f"/containers/{cid}/start", timeout=60)
        if started.status not in (204, 304):
            raise RuntimeError(f"start for attach failed: {started.status} {started.body[:200]!r}")
        return cid

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(make, range(count)))


def attached_streams(name: str, sock: str, pid: int, api: str, ids: Sequence[str]) -> Record:
    """One `docker attach` stream per running container, held open together through one path.

    Each stream is checked end to end (a line written to stdin comes back on stdout), so the memory
    measured is that of working hijacked connections.
    """
    before = settle_rss(pid)
    conns: list[uds.Conn] = []
    echoed = 0
    try:
        for cid in ids:
            conn = uds.Conn(sock, timeout=30)
            conns.append(conn)
            status = conn.hijack(f"/{api}/containers/{cid}/attach?stream=1&stdin=1&stdout=1&stderr=1")
            if status != 101:
                continue
        for conn in conns:
            conn.sock.sendall(b"bench\n")
        for conn in conns:
            try:
                _, payload = conn.read_stream_frame()
                echoed += payload == b"bench\n"
            except (OSError, uds.HttpError):
                pass
        held = settle_rss(pid)
        processes = len(stack.process_tree(pid))
    finally:
        for conn in conns:
            conn.close()
    after_close = settle_rss(pid)
    return {
        "scenario": "memory",
        "endpoint": "attached containers",
        "path": name,
        "count": len(ids),
        "failed": len(ids) - echoed,
        "rss_before_kib": before,
        "rss_held_kib": held,
        "rss_after_close_kib": after_close,
        "processes": processes,
        "kib_per_item": (held - before) / max(1, len(ids)),
    }


def dump(records: list[Record], path: Path) -> None:
    path.write_text(json.dumps(records, indent=1, sort_keys=True))
