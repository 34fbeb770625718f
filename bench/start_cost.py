"""What checking a container at every start costs: `POST /containers/{id}/start` timed three ways.

- **gate**: through the repo's gate, which asks the daemon what the container holds first;
- **direct**: the same repo daemon's own socket (its runtime guard still checks the devices);
- **unguarded**: a daemon started the same way but without the runtime guard (plain runc).

Each for a container holding a granted CDI device (the guard reads the grants and specs) and one
without (the guard hands straight to runc). Rounds interleave the paths and rotate their order, so
the ratios (gate/direct, direct/unguarded) are taken seconds apart; the medians are the result.
Needs root, Docker Engine >= 25 with CDI and busybox-static; ~2 minutes. Nothing stays behind.

    python bench/start_cost.py [--rounds 15] [--out bench/results/start-cost.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rediacc_core import unixhttp
from rediacc_core.config import Config
from rediacc_core.grants.store import GrantStore
from rediacc_core.repos import RepoStore
from rediacc_core.runtime import daemon, lifecycle
from rediacc_core.testing.dockerenv import import_busybox

DEVICE = "vendor.example/gpu=0"
IMAGE = "bb:latest"


def machine_root(root: Path) -> None:
    (root / "etc/cdi").mkdir(parents=True)
    node = root / "dev/fakegpu0"
    node.parent.mkdir(parents=True)
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "vendor.example/gpu",
        "devices": [
            {
                "name": "0",
                "containerEdits": {"deviceNodes": [{"path": "/dev/fakegpu0", "hostPath": str(node)}]},
            }
        ],
    }
    (root / "etc/cdi/vendor.json").write_text(json.dumps(spec))


def call(sock: Path, method: str, target: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    return unixhttp.request(sock, method, target, body=data, headers=headers, timeout=60)


def create(sock: Path, name: str, device: bool) -> str:
    host: dict[str, object] = {}
    if device:
        host["DeviceRequests"] = [{"Driver": "cdi", "DeviceIDs": [DEVICE]}]
    status, body = call(
        sock,
        "POST",
        f"/v1.45/containers/create?name={name}",
        {"Image": IMAGE, "Cmd": ["sleep", "300"], "HostConfig": host},
    )
    assert status == 201, body
    ident: str = json.loads(body)["Id"]
    return ident


def timed_start(start_sock: Path, daemon_sock: Path, ident: str) -> float:
    began = time.perf_counter()
    status, body = call(start_sock, "POST", f"/v1.45/containers/{ident}/start")
    took = time.perf_counter() - began
    assert status == 204, body
    call(daemon_sock, "POST", f"/v1.45/containers/{ident}/kill")
    call(daemon_sock, "POST", f"/v1.45/containers/{ident}/wait")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="rdcs", dir="/tmp"))
    root = base / "m"
    machine_root(root)
    config = Config.load(base / "rdc.yaml")
    config.add("bench", root)
    config.save()
    machine = Config.load(base / "rdc.yaml").machine("bench")
    repo = RepoStore(machine).create("starts")
    plain: daemon.RunningDaemon | None = None
    try:
        GrantStore(machine).grant(repo, [DEVICE])
        runtime = lifecycle.repo_up(machine, repo)
        plain = daemon.start_dockerd(root, base / "plain")  # no guard: plain runc
        for sock in (runtime.upstream_socket, plain.socket):
            import_busybox(sock, IMAGE)
        paths = {
            "gate": (runtime.gate_socket, runtime.upstream_socket),
            "direct": (runtime.upstream_socket, runtime.upstream_socket),
            "unguarded": (plain.socket, plain.socket),
        }
        ids = {
            (path, dev): create(paths[path][1], f"{path}-{int(dev)}", dev)
            for path in paths
            for dev in (True, False)
        }
        times: dict[tuple[str, bool], list[float]] = {key: [] for key in ids}
        order = list(paths)
        for round_ in range(args.rounds + 2):  # two warm-up rounds, not counted
            order = order[1:] + order[:1]
            for dev in (True, False):
                for path in order:
                    took = timed_start(*paths[path], ids[(path, dev)])
                    if round_ >= 2:
                        times[(path, dev)].append(took)
        lines = [
            "| container | gate | direct | unguarded | gate / direct | direct / unguarded |",
            "|---|---|---|---|---|---|",
        ]
        for dev in (True, False):
            med = {p: statistics.median(times[(p, dev)]) for p in paths}
            ratio_gate = statistics.median(
                g / d for g, d in zip(times[("gate", dev)], times[("direct", dev)], strict=True)
            )
            ratio_guard = statistics.median(
                d / u for d, u in zip(times[("direct", dev)], times[("unguarded", dev)], strict=True)
            )
            what = f"with {DEVICE} (granted)" if dev else "without devices"
            lines.append(
                f"| {what} | {med['gate'] * 1e3:.1f} ms | {med['direct'] * 1e3:.1f} ms "
                f"| {med['unguarded'] * 1e3:.1f} ms "
                f"| {ratio_gate:.3f}x | {ratio_guard:.3f}x |"
            )
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        text = (
            f"# Container start cost ({time.strftime('%Y-%m-%d')}, commit {commit}, "
            f"{args.rounds} rounds, medians)\n\n" + "\n".join(lines) + "\n"
        )
        print(text)
        if args.out is not None:
            args.out.write_text(text)
    finally:
        lifecycle.repo_down(machine, repo)
        if plain is not None:
            plain.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
