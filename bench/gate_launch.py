"""How the benchmark sets up a machine for the gate and starts the gate: the one place to adapt.

The machine is a directory root (as in the tests): one CDI spec defining `vendor.example/gpu=0`
backed by a real character device node, a repo named `bench` whose Docker host is the benchmark's
own dockerd, and a grant of that device to it. The gate then runs as `rdc` runs it for such a repo;
for the rate scenarios a second gate for the same repo runs beside it in two worker processes
(`--workers 2`), so that one run shows what worker processes buy.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

DEVICE = "vendor.example/gpu=0"
MACHINE = "bench"
REPO = "bench"

# Set to a command to benchmark something else in the gate's place: another proxy from {listen} to
# {upstream}, or the gate run differently (fields: {python} {machine} {root} {repo_id} {workdir}).
OVERRIDE_ENV = "RDC_BENCH_GATE_CMD"

# The path name of the second gate: the same command line with `--workers WORKER_COUNT`.
WORKER_COUNT = 2
WORKERS = "gate-w2"


@dataclass(frozen=True)
class GateLaunch:
    argv: list[str]
    sock: str
    env: dict[str, str]
    repo_id: str


def gate_available() -> str | None:
    """None when the gate can be started, else why not."""
    if importlib.util.find_spec("rediacc_core.runtime.serve") is None:
        return "rediacc_core.runtime.serve does not exist yet"
    return None


def write_machine(root: Path) -> None:
    """The CDI spec and its device node (a real char device: the daemon injects it on create+start)."""
    node = root / "dev" / "benchgpu0"
    node.parent.mkdir(parents=True, exist_ok=True)
    if not node.exists():
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    cdi = root / "etc" / "cdi"
    cdi.mkdir(parents=True, exist_ok=True)
    (cdi / "vendor-example.yaml").write_text(
        "cdiVersion: 0.5.0\n"
        "kind: vendor.example/gpu\n"
        "devices:\n"
        '  - name: "0"\n'
        "    containerEdits:\n"
        "      deviceNodes:\n"
        "        - path: /dev/benchgpu0\n"
        f"          hostPath: {node}\n"
    )


def prepare(workdir: Path, root: Path, docker_sock: str) -> tuple[dict[str, str], str]:
    """Registers the machine in a private rdc config, creates the repo and grants it the device.

    Returns the environment the gate runs with and the repo's id.
    """
    from rediacc_core.config import Config
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.repos import RepoStore

    config_path = workdir / "rdc-config.yaml"
    env = dict(os.environ, REDIACC_CONFIG=str(config_path))
    os.environ["REDIACC_CONFIG"] = str(config_path)  # the store classes below read it too
    config = Config.load(config_path)
    machine = config.add(MACHINE, root)
    config.save()
    repo = RepoStore(machine).create(REPO, None, docker_host=f"unix://{docker_sock}")
    GrantStore(machine).grant(repo, [DEVICE])
    return env, repo.id


def launch(workdir: Path, root: Path, docker_sock: str) -> GateLaunch:
    sock = str(workdir / "gate" / "gate.sock")
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    env, repo_id = prepare(workdir, root, docker_sock)
    override = os.environ.get(OVERRIDE_ENV)
    if override:
        fields = {
            "listen": sock, "upstream": docker_sock, "workdir": workdir, "root": root,
            "repo_id": repo_id, "machine": MACHINE, "python": sys.executable,
        }  # fmt: skip
        return GateLaunch(shlex.split(override.format(**fields)), sock, env, repo_id)
    # The same command line `rdc repo up` uses (rediacc_core.runtime.lifecycle.gate_argv), with the
    # benchmark's dockerd as the upstream.
    argv = [
        sys.executable, "-m", "rediacc_core.runtime.serve",
        "--machine", MACHINE, "--root", str(root), "--repo-id", repo_id,
        "--listen", sock, "--upstream", docker_sock,
    ]  # fmt: skip
    return GateLaunch(argv, sock, env, repo_id)


def with_workers(default: GateLaunch, workdir: Path) -> GateLaunch | str:
    """The default gate's command line on a socket of its own, with `--workers 2`; else why not.

    Same machine root and repo id: the two gates share the repo's files (audit log, pins), which the
    gate locks, so they can run side by side. With RDC_BENCH_GATE_CMD set, the command is not the
    gate's own and `--workers` may mean nothing to it, so there is no variant with workers to run.
    """
    if os.environ.get(OVERRIDE_ENV):
        return f"{OVERRIDE_ENV} replaces the gate's command line"
    sock = str(workdir / WORKERS / "gate.sock")
    Path(sock).parent.mkdir(parents=True, exist_ok=True)
    argv = list(default.argv)
    argv[argv.index("--listen") + 1] = sock
    # The last --workers wins in argparse, should the default command line ever carry one.
    return GateLaunch([*argv, "--workers", str(WORKER_COUNT)], sock, default.env, default.repo_id)


def event_loop() -> str:
    """Which event loop the gate will run on (it uses uvloop when that is installed)."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
