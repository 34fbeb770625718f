"""A real Slurm cluster on this host: Debian's slurmctld, slurmdbd on MariaDB, MUNGE, and one slurmd
per simulated rdc machine, each machine in a network and UTS namespace of its own.

Every address lives inside namespaces this kit makes: a controller namespace (`<prefix>c`, a
bridge on 10.213.0.0/24 with slurmctld, slurmdbd and MariaDB on its loopback) and one per node
(`<prefix>n1`, …; its hostname is its NodeName, its slurmd has its own spool and its own
slurm.conf directory, so its own gres.conf). Nothing of the host's network is touched. The nodes are
simulated rdc machines with two fake A100s each (device nodes made by mknod); their gres.conf is
written by `rdc slurm gres`. The machine's Slurm CLIs are its own tools (`<root>/usr/bin/squeue`, …):
each enters the controller's namespace and runs the real program, so `rdc` reaches the real
controller from the host's namespace and from a node's alike.

Runs only with RDC_SLURM=1 (tox -e slurm), as root, with `.ci/install-slurm.sh` done.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_kit import IMAGE, RepoEnv, client_env

from rediacc_core.config import Config
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine
from rediacc_core.testing.dockerenv import import_busybox

SLURM_ENV = "RDC_SLURM"
REQUIRED = "RDC_SLURM_REQUIRED"
BIN = Path(sys.executable).parent
SUBNET = "10.213.0"
CLUSTER = "rdcs"
NODES = ("n1", "n2")
TOOLS = ("squeue", "scontrol", "scancel", "salloc", "sbatch", "sacct", "sacctmgr", "sinfo", "sshare")
# Distinct cards on each node: a card is one machine's own.
UUIDS = {
    "n1": ("GPU-11111111-7d4f-4c11-9a3e-0b1c2d3e4f50", "GPU-11111111-1e2f-4a3b-8c4d-5e6f708192a3"),
    "n2": ("GPU-22222222-7d4f-4c11-9a3e-0b1c2d3e4f50", "GPU-22222222-1e2f-4a3b-8c4d-5e6f708192a3"),
}


def skip_reason() -> str | None:
    if os.environ.get(SLURM_ENV) != "1":
        return f"Slurm tests run with {SLURM_ENV}=1 (tox -e slurm)"
    return cannot_run()


def cannot_run() -> str | None:
    """Why this host cannot run the cluster, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests need root (namespaces, mknod, slurmd)"
    missing = [p for p in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd") if not _which(p)]
    if missing:
        return f"not installed: {', '.join(missing)} (bash .ci/install-slurm.sh)"
    return None


def unmet_requirement(reason: str | None) -> str | None:
    if reason is None or os.environ.get(REQUIRED) != "1":
        return None
    return f"{REQUIRED}=1, but the Slurm tests cannot run here: {reason}"


def _which(program: str) -> str | None:
    return shutil.which(program, path="/usr/sbin:/usr/bin:/sbin:/bin")


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0, every: float = 0.25) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Cluster:
    """The running cluster: its directories, namespaces and daemons (stopped by `stop`)."""

    base: Path
    prefix: str
    config_path: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # What every Slurm, MUNGE and MariaDB program runs through: nothing for the host's own, a runner
    # into another root for another release's (`slurm_ext_kit`).
    wrap: tuple[str, ...] = ()
    db_wrap: tuple[str, ...] = ()  # MariaDB's programs, likewise
    nodes: tuple[str, ...] = NODES

    def cmd(self, *argv: str) -> list[str]:
        return [*self.wrap, *argv]

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    def ns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def root(self, node: str) -> Path:
        return self.base / node / "root"

    # --- running Slurm's programs ----------------------------------------------------------------
    def slurm(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client program, run in the controller's namespace as root."""
        try:
            result = subprocess.run(
                ["nsenter", f"--net=/run/netns/{self.ns('c')}", *self.cmd(*argv)],
                env={**os.environ, "SLURM_CONF": str(self.conf)},
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            if check:
                raise
            return subprocess.CompletedProcess(list(argv), 124, "", f"timed out after {timeout}s")
        if check:
            assert result.returncode == 0, f"{argv}: {result.stderr}{result.stdout}"
        return result

    def rdc(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "rdc"), *argv],
            env={**os.environ, "REDIACC_CONFIG": str(self.config_path)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def lease(
        self,
        repo: str,
        *,
        account: str = "teama",
        gpus: int = 1,
        minutes: int = 10,
        uid: int | None = None,
        node: str | None = None,
        extra: Sequence[str] = (),
        ready: bool = True,
        mem: str | None = "100",
    ) -> str:
        """`salloc --no-shell` of GPUs for `repo` (as rdc asks for a lease); the job's id. With
        `ready`, once salloc has returned: the job ran its prolog (or was refused there)."""
        argv = [
            "salloc", "--no-shell", "--immediate=0", f"--account={account}", f"--gres=gpu:{gpus}",
            *([f"--mem={mem}"] if mem else []), "--cpus-per-task=1", f"--time={minutes}",
            f"--comment=rdc-repo={repo}",
            "--job-name=rdc-lease", *([f"--uid={uid}"] if uid is not None else []),
            *([f"--nodelist={node}"] if node else []), *extra,
        ]  # fmt: skip
        result = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.ns('c')}", *argv],
            env={**os.environ, "SLURM_CONF": str(self.conf)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # salloc --no-shell returns once granted; a pending job keeps it waiting: read its id early.
        assert result.stderr is not None
        line = result.stderr.readline()
        while line and "job allocation" not in line and "Pending job allocation" not in line:
            line = result.stderr.readline()
        assert line, f"salloc said nothing of a job: {result.stderr.read()}"
        job_id = line.rstrip().rsplit(" ", 1)[-1]
        if ready:
            result.communicate(timeout=60)
        else:
            self.procs[f"salloc-{job_id}"] = result  # type: ignore[assignment]
        return job_id

    def job(self, job_id: str) -> dict[str, object]:
        jobs = json.loads(self.slurm("squeue", "--json").stdout)["jobs"]
        found: dict[str, object] = next((j for j in jobs if str(j["job_id"]) == job_id), {})
        return found

    def job_state(self, job_id: str) -> str:
        found = self.job(job_id)
        if found:
            state = found["job_state"]  # a list of flags from Slurm 23.02 on, e.g. ["RUNNING"]
            return str(state[0] if isinstance(state, list) and state else state)
        text = self.slurm("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id).stdout.strip()
        return text.split()[0] if text else ""

    def admin_comment(self, job_id: str) -> str:
        text = self.slurm("scontrol", "show", "job", job_id, "-o", check=False).stdout
        if "AdminComment=" in text:
            return text.split("AdminComment=", 1)[1].split(" Comment=")[0].split(" OverSubscribe")[0]
        return self.slurm("sacct", "-n", "-X", "-P", "-o", "AdminComment", "-j", job_id).stdout.strip()

    def node_state(self, node: str) -> str:
        return self.slurm("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip()

    def node_reason(self, node: str) -> str:
        return self.slurm("sinfo", "-h", "-n", node, "-o", "%E").stdout.strip()

    def resume(self, *nodes: str) -> None:
        self.slurm("scontrol", "update", f"NodeName={','.join(nodes)}", "State=RESUME", check=False)

    def cancel_all(self) -> None:
        self.slurm("scancel", "--full", "--user=root", check=False)
        self.slurm("scancel", "--full", "--user=daemon", check=False)

        def ended() -> bool:
            jobs = json.loads(self.slurm("squeue", "--json").stdout)["jobs"]
            states = [j["job_state"] if isinstance(j["job_state"], list) else [j["job_state"]] for j in jobs]
            return not any({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING"} & set(s) for s in states)

        wait_for("every job to end", ended, timeout=60)

    # --- the daemons ------------------------------------------------------------------------------
    def start(self, name: str, argv: Sequence[str], *, conf: Path | None = None) -> None:
        log = open(self.base / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen(
            list(argv),
            env={**os.environ, "SLURM_CONF": str(conf or self.conf)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_slurmd(self, node: str) -> None:
        self.start(
            f"slurmd-{node}",
            [
                "nsenter", f"--net=/run/netns/{self.ns(node)}", "unshare", "--uts", "sh", "-c",
                f"hostname {node} && exec slurmd -D -N {node}",
            ],
            conf=self.root(node) / "etc/slurm/slurm.conf",
        )  # fmt: skip

    def kill(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        order = [n for n in self.procs if n.startswith("salloc")] + [
            f"slurmd-{n}" for n in self.nodes
        ] + ["slurmctld", "slurmdbd", "mariadb", "munged"]  # fmt: skip
        for name in order:
            self.kill(name)
        for name in (*self.nodes, "c"):
            subprocess.run(["ip", "netns", "del", self.ns(name)], capture_output=True)


# --- building it ------------------------------------------------------------------------------------


@contextmanager
def running_cluster() -> Iterator[Cluster]:
    """The whole cluster, built in a new directory under /tmp and stopped on the way out: every node
    a simulated machine set up as `rdc machine setup` does, with repos `alpha` and `beta`, its
    gres.conf from `rdc slurm gres`; the accounts, the QOS and the budgets; both nodes idle. The
    nodes' fake cards come from the NVIDIA plugin's test kit (rediacc_nvidia.testing)."""
    base = Path(tempfile.mkdtemp(prefix="rdcs", dir="/tmp"))
    cluster = Cluster(base, f"rs{base.name[-5:]}", base / "rdc.yaml")
    try:
        config = Config.load(cluster.config_path)
        for node in NODES:
            cluster.root(node).mkdir(parents=True)
            config.add(node, cluster.root(node))
        config.save()
        (base / "etc").mkdir()
        lines = []
        for i, node in enumerate(NODES):
            machine = Config.load(cluster.config_path).machine(node)
            _node_machine(cluster, node)
            plugins = get_plugins()
            run_setup(
                machine, plugins, {opt.name: opt.default for opt in plugins.setup_options() if opt.name}
            )
            RepoStore(machine).create("alpha")
            RepoStore(machine).create("beta")
            made = cluster.rdc("slurm", "gres", node, "--node", node, "--conf", "/etc/slurm/gres.conf")
            assert made.returncode == 0, made.stderr
            lines.append(
                f"{made.stdout.strip()} NodeAddr={SUBNET}.{11 + i} CPUs=2 RealMemory=1000 State=UNKNOWN"
            )
            (base / node / "spool").mkdir(parents=True)
        text = slurm_conf(cluster, lines)
        cluster.conf.write_text(text)
        for node in NODES:
            (cluster.root(node) / "etc/slurm/slurm.conf").write_text(text)
        make_network(cluster)
        start_accounting(cluster)
        hook_scripts(cluster)
        cluster.slurm("sacctmgr", "-i", "add", "cluster", "rdcs")
        accounts(cluster)
        start_controller(cluster)
        for node in NODES:
            cluster.start_slurmd(node)
        wait_for("both nodes idle", lambda: all(cluster.node_state(n) == "idle" for n in NODES), timeout=60)
        budgets(cluster)
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get("RDC_SLURM_KEEP"):  # set it to read the daemons' and hooks' logs after a run
            shutil.rmtree(base, ignore_errors=True)


def _node_machine(cluster: Cluster, node: str) -> Machine:
    # Looked up when called: the core env (no vendor plugin) imports this kit too.
    nvidia_testing = importlib.import_module("rediacc_nvidia.testing")
    fm = FakeMachine(cluster.root(node), name=node)
    nvidia_testing.nvidia_machine(fm, nvidia_testing.two_a100s(*UUIDS[node]), compute_caps=("8.0", "8.0"))
    machine_tools(cluster, fm.root)
    return fm.machine


@contextmanager
def repo_up(cluster: Cluster, node: str, label: str) -> Iterator[RepoEnv]:
    """Repo `label` of machine `node` up (its own dockerd behind its gate, the busybox image
    imported), brought down on the way out. Needs a Docker Engine with CDI."""
    machine = Config.load(cluster.config_path).machine(node)
    repo = RepoStore(machine).get_by_label(label)
    # The gate, a child process, finds everything on the machine, as under systemd.
    saved = os.environ.get("REDIACC_CONFIG")
    os.environ["REDIACC_CONFIG"] = str(cluster.base / "no-client-config.yaml")
    try:
        runtime = lifecycle.repo_up(machine, repo)
    finally:
        if saved is None:
            os.environ.pop("REDIACC_CONFIG")
        else:
            os.environ["REDIACC_CONFIG"] = saved
    try:
        env = RepoEnv(
            repo, runtime, {**client_env(cluster.base / "docker"), "DOCKER_HOST": runtime.docker_host_url}
        )
        import_busybox(env.daemon, IMAGE)
        yield env
    finally:
        lifecycle.repo_down(machine, repo)


def _sh(*argv: str) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True)
    assert result.returncode == 0, f"{argv}: {result.stderr}"


def make_network(cluster: Cluster) -> None:
    ctl = cluster.ns("c")
    for name in (ctl, *(cluster.ns(n) for n in NODES)):
        _sh("ip", "netns", "add", name)
        _sh("ip", "-n", name, "link", "set", "lo", "up")
    _sh("ip", "-n", ctl, "link", "add", "br0", "type", "bridge")
    _sh("ip", "-n", ctl, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
    _sh("ip", "-n", ctl, "link", "set", "br0", "up")
    for i, node in enumerate(NODES):
        _sh(
            "ip",
            "-n",
            ctl,
            "link",
            "add",
            f"v{node}",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            cluster.ns(node),
        )
        _sh("ip", "-n", ctl, "link", "set", f"v{node}", "master", "br0")
        _sh("ip", "-n", ctl, "link", "set", f"v{node}", "up")
        _sh("ip", "-n", cluster.ns(node), "addr", "add", f"{SUBNET}.{11 + i}/24", "dev", "eth0")
        _sh("ip", "-n", cluster.ns(node), "link", "set", "eth0", "up")


def slurm_conf(
    cluster: Cluster, node_lines: Iterable[str], *, host: str = f"{SUBNET}.1", hooks: bool = True
) -> str:
    """The cluster's slurm.conf: the controller at `host`, the nodes of `node_lines` in one
    partition, with the rdc prolog and epilog when `hooks`."""
    b = cluster.base
    return "\n".join(
        [
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost=ctl({host})",
            "AuthType=auth/munge",
            f"AuthInfo=socket={b}/munge/munge.sock",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={b}/ctl",
            f"SlurmdSpoolDir={b}/%n/spool",
            f"SlurmctldPidFile={b}/ctl/slurmctld.pid",
            f"SlurmdPidFile={b}/%n/slurmd.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log",
            f"SlurmdLogFile={b}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            *(["PrologFlags=Alloc", f"Prolog={b}/hooks/prolog", f"Epilog={b}/hooks/epilog"] if hooks else []),
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={host}",
            f"AccountingStoragePass={b}/munge/munge.sock",
            "AccountingStorageTRES=gres/gpu",
            "AccountingStoreFlags=job_comment",
            "AccountingStorageEnforce=limits,qos,safe",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdTimeout=8",
            "MessageTimeout=5",
            "KillWait=2",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",
            "PriorityType=priority/multifactor",
            "PriorityWeightFairshare=10000",
            "PriorityUsageResetPeriod=MONTHLY",
            "PreemptType=preempt/qos",
            "PreemptMode=CANCEL",
            "MailProg=/bin/true",
            *node_lines,
            f"PartitionName=gpu Nodes={','.join(cluster.nodes)} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def start_accounting(cluster: Cluster) -> None:
    b = cluster.base
    ctl = f"--net=/run/netns/{cluster.ns('c')}"
    for d in ("munge", "db", "ctl", "log", "hooks", "dbd"):
        (b / d).mkdir(parents=True, exist_ok=True)
    # salloc --uid runs as that user: it must reach the config and MUNGE's socket (never the key).
    b.chmod(0o755)
    (b / "munge").chmod(0o755)
    _sh(*cluster.cmd("mungekey", "-c", "-k", f"{b}/munge/munge.key"))
    cluster.start("munged", [
        *cluster.wrap, "munged", "-F", "--force", f"--key-file={b}/munge/munge.key",
        f"--socket={b}/munge/munge.sock",
        f"--pid-file={b}/munge/munged.pid", f"--log-file={b}/log/munged.log", f"--seed-file={b}/munge/seed",
    ])  # fmt: skip
    _sh(*cluster.db_wrap, "mariadb-install-db", "--user=root", f"--datadir={b}/db",
        "--auth-root-authentication-method=normal", "--skip-test-db")  # fmt: skip
    cluster.start("mariadb", [
        "nsenter", ctl, *cluster.db_wrap, "mariadbd", "--user=root", f"--datadir={b}/db",
        f"--socket={b}/mysqld.sock",
        "--bind-address=127.0.0.1", "--port=3306", f"--pid-file={b}/mysqld.pid",
        f"--log-error={b}/log/mariadb.log",
        "--innodb-buffer-pool-size=64M", "--skip-log-bin",
    ])  # fmt: skip
    sql = (
        "create user 'slurm'@'127.0.0.1' identified by 'rdcslurm'; "
        "grant all on slurm_acct_db.* to 'slurm'@'127.0.0.1';"
    )
    wait_for("MariaDB", lambda: subprocess.run(
        [*cluster.db_wrap, "mariadb", f"--socket={b}/mysqld.sock", "-uroot", "-e", sql], capture_output=True
    ).returncode == 0)  # fmt: skip
    dbd = b / "etc" / "slurmdbd.conf"
    dbd.parent.mkdir(parents=True, exist_ok=True)
    dbd.write_text(
        "\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={b}/munge/munge.sock", "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            "DbdPort=6819", "SlurmUser=root", f"LogFile={b}/log/slurmdbd.log",
            f"PidFile={b}/dbd/slurmdbd.pid",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", "StoragePort=3306",
            "StorageUser=slurm", "StoragePass=rdcslurm", "StorageLoc=slurm_acct_db", "",
        ])
    )  # fmt: skip
    dbd.chmod(0o600)
    cluster.start("slurmdbd", ["nsenter", ctl, *cluster.cmd("slurmdbd", "-D")])
    wait_for(
        "slurmdbd",
        lambda: cluster.slurm("sacctmgr", "-n", "list", "cluster", check=False, timeout=5).returncode == 0,
    )


def machine_tools(cluster: Cluster, root: Path) -> None:
    """The machine's own Slurm CLIs: the real programs, in the controller's namespace."""
    tools = root / "usr/bin"
    tools.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        script = tools / tool
        script.write_text(
            f"#!/bin/sh\nexec nsenter --net=/run/netns/{cluster.ns('c')} env SLURM_CONF={cluster.conf} "
            f'{" ".join(cluster.cmd(f"/usr/bin/{tool}"))} "$@"\n'
        )
        script.chmod(0o755)


def hook_scripts(cluster: Cluster) -> None:
    """slurm.conf's Prolog and Epilog: one line each, as a site writes them (the machine is the node)."""
    for hook in ("prolog", "epilog"):
        script = cluster.base / "hooks" / hook
        script.write_text(
            f"#!/bin/sh\nexport REDIACC_CONFIG={cluster.config_path}\n"
            f'exec {BIN / "rdc"} slurm {hook} "$SLURMD_NODENAME" 2>>{cluster.base}/log/{hook}.log\n'
        )
        script.chmod(0o755)


def accounts(cluster: Cluster) -> None:
    s = cluster.slurm
    s("sacctmgr", "-i", "add", "account", "teama", "teamb", "teamc")
    s("sacctmgr", "-i", "add", "user", "root", "account=teama,teamb,teamc")
    s("sacctmgr", "-i", "add", "user", "daemon", "account=teamb")
    # QOS `urgent` preempts `normal` (PreemptMode=CANCEL): the preempted lease ends as by scancel;
    # and `spare`, whose jobs are requeued (PreemptMode=REQUEUE): a batch lease ends and runs again.
    s("sacctmgr", "-i", "add", "qos", "urgent", "spare")
    s("sacctmgr", "-i", "modify", "qos", "where", "name=spare", "set", "PreemptMode=requeue")
    s("sacctmgr", "-i", "modify", "qos", "where", "name=urgent", "set", "Preempt=normal,spare")
    s("sacctmgr", "-i", "modify", "user", "where", "name=root", "set", "QOS=normal,urgent,spare")


def budgets(cluster: Cluster) -> None:
    """teamc has no GPU minutes left (once slurmctld has told slurmdbd of the gres/gpu TRES)."""
    wait_for(
        "the gres/gpu TRES",
        lambda: "gres|gpu|" in cluster.slurm("sacctmgr", "-n", "-P", "list", "tres").stdout,
    )
    cluster.slurm(
        "sacctmgr", "-i", "modify", "account", "where", "name=teamc", "set", "GrpTRESMins=gres/gpu=0"
    )


def skip_suite(items: list[pytest.Item], here: Path, reason: str | None, unmet: str | None) -> None:
    """A suite's collection: an unmet requirement (CI) stops the run; a missing Slurm skips the suite."""
    if unmet is not None:
        raise pytest.UsageError(unmet)
    for item in items:
        if here in item.path.parents and reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def start_controller(cluster: Cluster) -> None:
    """slurmctld in the controller's namespace, its hostname `ctl` (through the cluster's `wrap`)."""
    cluster.start(
        "slurmctld",
        ["nsenter", f"--net=/run/netns/{cluster.ns('c')}", "unshare", "--uts", "sh", "-c",
         f"hostname ctl && exec {' '.join([*cluster.wrap, 'slurmctld'])} -D -i"],
    )  # fmt: skip
