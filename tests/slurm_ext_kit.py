"""A real Slurm 26.05 cluster for external mode: slurmctld, slurmdbd on MariaDB and MUNGE from a
Debian sid root (`.ci/install-slurm-sid.sh`), and no slurmd at all.

Installing sid's Slurm on this bookworm host would replace its libc, so every Slurm and MUNGE
program runs inside the sid root (`sidrun`: a mount namespace of its own with the host's /tmp, /dev
and a /proc bound in, then chroot), in one network namespace (`<prefix>c`: loopback and an address
on an empty bridge) with a private slurm.conf, so nothing of the host's network or the bookworm
suite's is touched. The pieces are `slurm_kit`'s, run through `Cluster.wrap`. MariaDB is the host's
(see below). The operator's host is one more rdc machine, `ops`, whose Slurm tools are the sid ones.

The nodes are three simulated rdc machines with two fake A100s each (their gres.conf lines and
slurm.conf node lines from `rdc slurm gres`), declared in slurm.conf with `State=EXTERNAL`.
What Slurm 26.05 does with them, as found by running it (the man pages say little):

- `State=EXTERNAL` on a slurm.conf node line is accepted (slurm.conf(5) does not say so; scontrol(1)
  names EXTERNAL among the states of `scontrol create`); the node shows `IDLE+EXTERNAL`, BootTime
  and SlurmdStartTime None, and is scheduled with no slurmd ever answering.
- An external job is `sbatch --external [options]` with no script ("Submitted batch job N", or the
  id alone with `--parsable`); `--wrap` or script arguments are refused. Its name is `external`,
  `batch_flag` false, `command` empty; it starts at once when the node has room (backfill, about a
  second here) and then stays RUNNING, holding its cores, memory and GPUs, until `scancel`
  (CANCELLED by <uid>) or its time limit (not waited for here): there is no process to end it.
- `squeue --json` (26.05): `job_state` is a list (`["RUNNING"]`, `["PENDING"]`), `nodes` the node,
  `start_time`/`end_time` objects `{"set": true, "infinite": false, "number": EPOCH}`, `comment`,
  `user_name`, `account` as given. `gres_detail` is a count per type, `["gpu:a100(CNT:1)"]`, with
  no `(IDX:…)`, even with a gres.conf of the nodes' `File=` lines beside slurm.conf: Slurm counts
  an external node's GPUs but numbers none of them (it learns the numbering from slurmd);
  `scontrol show job -d` has `JOB_GRES=gpu:a100:1` and no per-node index either. The bridge
  therefore picks the cards (`slurm.bridge`).
- A job whose account has `GrpTRESMins=gres/gpu=0` stays PENDING with reason `AssocGrpGRESMinutes`;
  one that does not fit waits with `Resources`/`Priority` and starts when an earlier one ends.
- slurmdbd 26.05 with sid's MariaDB 11.8 server fails its first query (`select @var := concat('')`:
  "Number of columns in result set exceeds maximum allowed number of columns (=0)", error 5027),
  so this kit runs the host's MariaDB (bookworm's 10.11, installed by `.ci/install-slurm.sh`) for
  it; slurmdbd also needs an address other than loopback in its namespace to bind its port.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_kit import (
    Cluster,
    _sh,
    _which,
    accounts,
    budgets,
    machine_tools,
    slurm_conf,
    start_accounting,
    start_controller,
    wait_for,
)

from rediacc_core.config import Config
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine

EXT_ENV = "RDC_SLURM_EXT"
REQUIRED = "RDC_SLURM_EXT_REQUIRED"
SID_ROOT = Path(os.environ.get("RDC_SLURM_SID_ROOT", "/var/cache/rediacc/sid-slurm"))
READY = ".rdc-slurm-sid-ready"
NODES = ("x1", "x2", "x3")
HOST = "10.214.0.1"
UUIDS = {
    "x1": "GPU-31111111-7d4f-4c11-9a3e-0b1c2d3e4f50",
    "x2": "GPU-32222222-7d4f-4c11-9a3e-0b1c2d3e4f50",
    "x3": "GPU-33333333-7d4f-4c11-9a3e-0b1c2d3e4f50",
}
SIDRUN = """#!/bin/sh
# Run a program of the sid root at {root}, with this host's /tmp and /dev, in a mount namespace of its own.
exec unshare --mount --propagation private /bin/sh -c '
  r=$0
  mount --rbind /tmp "$r/tmp" && mount --rbind /dev "$r/dev" && mount -t proc proc "$r/proc" &&
  exec chroot "$r" "$@"' {root} "$@"
"""


def ext_skip_reason() -> str | None:
    if os.environ.get(EXT_ENV) != "1":
        return f"external-mode Slurm tests run with {EXT_ENV}=1 (tox -e slurm-ext)"
    if os.geteuid() != 0:
        return "the Slurm tests need root (namespaces, chroot)"
    if not (SID_ROOT / READY).is_file():
        return f"no Slurm sid root at {SID_ROOT} (bash .ci/install-slurm-sid.sh)"
    if _which("mariadbd") is None:
        return "not installed: the host's mariadbd (bash .ci/install-slurm.sh)"
    return None


def ext_unmet_requirement(reason: str | None) -> str | None:
    if reason is None or os.environ.get(REQUIRED) != "1":
        return None
    return f"{REQUIRED}=1, but the external-mode Slurm tests cannot run here: {reason}"


def machine(cluster: Cluster, name: str) -> Machine:
    """The rdc machine `name` of the cluster's config (a box, or `ops`)."""
    return Config.load(cluster.config_path).machine(name)


def make_network(cluster: Cluster) -> None:
    """The controller's namespace: loopback and one address of its own on an empty bridge (a namespace
    with loopback alone has no address that getaddrinfo's AI_ADDRCONFIG counts, and slurmdbd then
    cannot bind its port)."""
    ns = cluster.ns("c")
    for argv in (
        ["ip", "netns", "add", ns],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "link", "add", "d0", "type", "bridge"],
        ["ip", "-n", ns, "addr", "add", f"{HOST}/24", "dev", "d0"],
        ["ip", "-n", ns, "link", "set", "d0", "up"],
    ):
        _sh(*argv)


def sid_cluster(base: Path) -> Cluster:
    """A cluster whose programs are the sid root's, through `<base>/sidrun`."""
    runner = base / "sidrun"
    runner.write_text(SIDRUN.format(root=SID_ROOT))
    runner.chmod(0o755)
    return Cluster(base, f"rx{base.name[-5:]}", base / "rdc.yaml", wrap=(str(runner),), nodes=NODES)


def _box(cluster: Cluster, node: str) -> None:
    # Here, not at the top: the core env (no vendor plugin) imports this kit too.
    nvidia_testing = importlib.import_module("rediacc_nvidia.testing")

    fm = FakeMachine(cluster.root(node), name=node)
    first, second = UUIDS[node], UUIDS[node].replace("-7d4f-", "-1e2f-")
    nvidia_testing.nvidia_machine(fm, nvidia_testing.two_a100s(first, second), compute_caps=("8.0", "8.0"))
    plugins = get_plugins()
    run_setup(fm.machine, plugins, {opt.name: opt.default for opt in plugins.setup_options() if opt.name})


@contextmanager
def running_ext_cluster() -> Iterator[Cluster]:
    """The whole external-mode cluster, built in a new directory under /tmp and stopped on the way
    out: the operator's host `ops` (the Slurm tools, no GPU) and the boxes, each a simulated machine
    set up as `rdc machine setup` does with repos `alpha` and `beta` and its gres map, a
    `State=EXTERNAL` node; the accounts, the QOS and the budgets. Needs the NVIDIA plugin (the
    boxes' fake cards come from its test kit)."""
    base = Path(tempfile.mkdtemp(prefix="rdcx", dir="/tmp"))
    cluster = sid_cluster(base)
    try:
        config = Config.load(cluster.config_path)
        (base / "ops").mkdir()
        config.add("ops", base / "ops")
        for node in NODES:
            cluster.root(node).mkdir(parents=True)
            config.add(node, cluster.root(node))
        config.save()
        machine_tools(cluster, base / "ops")
        (base / "etc").mkdir()
        lines, gres = [], ["AutoDetect=off"]
        for node in NODES:
            _box(cluster, node)
            box = machine(cluster, node)
            RepoStore(box).create("alpha")
            RepoStore(box).create("beta")
            made = cluster.rdc("slurm", "gres", node, "--node", node, "--conf", "/etc/slurm/gres.conf")
            assert made.returncode == 0, made.stderr
            lines.append(f"{made.stdout.strip()} CPUs=2 RealMemory=1000 State=EXTERNAL")
            text = box.path("/etc/slurm/gres.conf").read_text()
            gres += [line for line in text.splitlines() if line.startswith("NodeName=")]
        cluster.conf.write_text(slurm_conf(cluster, lines, host=HOST, hooks=False))
        (base / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        make_network(cluster)
        start_accounting(cluster)
        cluster.slurm("sacctmgr", "-i", "add", "cluster", "rdcs")
        accounts(cluster)
        start_controller(cluster)
        wait_for(
            "slurmctld", lambda: cluster.slurm("scontrol", "ping", check=False).returncode == 0, timeout=60
        )
        budgets(cluster)
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get("RDC_SLURM_KEEP"):  # set it to read the daemons' logs after a run
            shutil.rmtree(base, ignore_errors=True)
