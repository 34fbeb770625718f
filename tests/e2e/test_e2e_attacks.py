"""A tenant attacking its own repo's Docker API: each attack runs for real through the gate, and its
effect is checked on the machine (the grants file, the specs, another repo, the host's /proc/sys).

The refusal alone proves little; what matters is that the command the tenant wanted to run never
ran anywhere it could reach the host. Each attack's command leaves a mark if it runs; the test
checks the mark is absent and that the daemon holds no container with host access.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import subprocess
import tarfile
import textwrap
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv, post, raw_exchange, refused

from rediacc_core.repos import RepoStore, files_dir
from rediacc_core.runtime import layout
from rediacc_core.runtime.process import read_pid
from rediacc_core.testing.dockerenv import import_busybox

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


@pytest.fixture
def watched(e2e: E2E) -> Iterator[dict[Path, str]]:
    """The machine state no container may touch, fingerprinted before each attack."""
    beta_files = files_dir(e2e.machine, e2e.beta.repo.id)
    paths = [
        e2e.machine.grants_path,
        e2e.machine.repos_path,
        e2e.machine.cdi_dir / "vendor-example.json",
        e2e.machine.cdi_dir / "evil.yaml",
        beta_files / "mark",
        CORE_PATTERN,
    ]
    before = {p: digest(p) for p in paths}
    yield before
    after = {p: digest(p) for p in paths}
    assert after == before, "an attack changed the machine"


def attack_args(e2e: E2E) -> dict[str, tuple[list[str], str, str]]:
    root = e2e.root
    beta_files = files_dir(e2e.machine, e2e.beta.repo.id)
    beta_files.mkdir(parents=True, exist_ok=True)
    write = "echo pwned > /x/gpu/grants.json"
    return {
        "grants": (["-v", f"{root}/etc/rediacc:/x"], write, "etc/rediacc"),
        "specs": (["-v", f"{root}/etc/cdi:/x"], "echo x > /x/evil.yaml", "etc/cdi"),
        "specs-mount": (
            ["--mount", f"type=bind,src={root}/etc/cdi,dst=/x"],
            "echo x > /x/evil.yaml",
            "etc/cdi",
        ),
        "other-repo": (["-v", f"{beta_files}:/x"], "touch /x/mark", "var/lib/rediacc"),
        "raw-daemon": (["-v", f"{e2e.beta.runtime.run_dir}:/x:ro"], "ls /x", "run/rediacc"),
        "host-proc": (["-v", "/proc:/hp"], "echo '|/bin/x' > /hp/sys/kernel/core_pattern", "/proc"),
        "proc-self-root": (["-v", "/proc/self/root:/hr"], "touch /hr/tmp/rdc-pwned", "/proc"),
        "systempaths": (
            ["--security-opt", "systempaths=unconfined"],
            "echo '|/bin/x' > /proc/sys/kernel/core_pattern",
            "MaskedPaths drops /proc/asound",  # the CLI sends systempaths=unconfined as empty lists
        ),
        "seccomp": (["--security-opt", "seccomp=unconfined"], "true", "seccomp=unconfined"),
        "apparmor": (["--security-opt", "apparmor=unconfined"], "true", "apparmor=unconfined"),
        "pid-host": (["--pid", "host"], "ls /proc/1/root", "PidMode=host"),
        "ipc-host": (["--ipc", "host"], "true", "IpcMode=host"),
        "net-host": (["--network", "host", "--cap-add", "NET_ADMIN"], "true", "NetworkMode=host"),
        "uts-host": (["--uts", "host"], "hostname pwned", "UTSMode=host"),
        "cgroupns-host": (["--cgroupns", "host"], "true", "CgroupnsMode=host"),
        "dac-read-search": (["--cap-add", "DAC_READ_SEARCH"], "true", "DAC_READ_SEARCH"),
        "sys-ptrace": (["--cap-add", "SYS_PTRACE"], "true", "SYS_PTRACE"),
        "sys-time": (["--cap-add", "SYS_TIME"], "date -s 2000-01-01", "SYS_TIME"),
        "sysctl": (["--sysctl", "net.ipv4.ip_forward=1"], "true", "net.ipv4.ip_forward"),
        "cgroup-parent": (["--cgroup-parent", "/"], "true", "CgroupParent"),
        "proc-volume": (
            ["--mount", "type=volume,dst=/x,volume-opt=type=proc,volume-opt=device=proc"],
            "echo '|/bin/x' > /x/sys/kernel/core_pattern",
            "type proc",
        ),
        "cgroup-volume": (
            [
                "--mount",
                "type=volume,dst=/x,volume-opt=type=cgroup,volume-opt=o=devices,volume-opt=device=cgroup",
            ],
            "true",
            "type cgroup",
        ),
        "log-driver": (["--log-driver", "syslog"], "true", "syslog"),
    }


ATTACKS = [
    "grants",
    "specs",
    "specs-mount",
    "other-repo",
    "raw-daemon",
    "host-proc",
    "proc-self-root",
    "systempaths",
    "seccomp",
    "apparmor",
    "pid-host",
    "ipc-host",
    "net-host",
    "uts-host",
    "cgroupns-host",
    "dac-read-search",
    "sys-ptrace",
    "sys-time",
    "sysctl",
    "cgroup-parent",
    "proc-volume",
    "cgroup-volume",
    "log-driver",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_attack_is_refused_and_leaves_no_mark(e2e: E2E, watched: dict[Path, str], attack: str) -> None:
    args, command, needle = attack_args(e2e)[attack]
    before = e2e.alpha.container_ids()
    refused(e2e.alpha.docker("run", "--rm", *args, IMAGE, "sh", "-c", command), needle)
    assert e2e.alpha.container_ids() == before, "a refused container was created anyway"
    assert not Path("/tmp/rdc-pwned").exists()


@pytest.mark.parametrize(
    ("opts", "needle"),
    [
        (["type=proc", "device=proc"], "type proc"),
        (["type=sysfs", "device=sysfs"], "type sysfs"),
        (["type=cgroup", "o=devices", "device=cgroup"], "type cgroup"),
        (["type=none", "o=bind", "device=/etc"], "device /etc is refused"),
        (["type=none", "o=bind", "device=/srv"], "outside the allowed bind roots"),
    ],
)
def test_volumes_of_host_filesystems_are_refused(e2e: E2E, opts: list[str], needle: str) -> None:
    flags = [part for opt in opts for part in ("--opt", opt)]
    refused(e2e.alpha.docker("volume", "create", *flags, "evilvol"), needle)
    assert "evilvol" not in e2e.alpha.docker("volume", "ls", "-q").stdout.split()


def test_plugins_and_swarm_are_refused(e2e: E2E) -> None:
    refused(e2e.alpha.docker("plugin", "install", "--grant-all-permissions", "vieux/sshfs"), "plugins")
    refused(e2e.alpha.docker("swarm", "init"), "swarm mode is refused")
    listed = e2e.alpha.docker("plugin", "ls", "-q")
    assert listed.returncode == 0 and listed.stdout.strip() == ""


def test_a_classic_build_on_the_host_network_is_refused(e2e: E2E, tmp_short: Path) -> None:
    (tmp_short / "Dockerfile").write_text(f"FROM {IMAGE}\nRUN touch /built\n")
    result = e2e.alpha.docker(
        "build", "--network", "host", "-t", "evil:1", str(tmp_short), extra_env={"DOCKER_BUILDKIT": "0"}
    )
    refused(result, "networkmode=host")
    assert e2e.alpha.docker("image", "inspect", "evil:1").returncode != 0


@pytest.fixture
def served_context(tmp_short: Path) -> Iterator[str]:
    """A build context (a tar whose one step records the network interfaces it sees) served over
    HTTP on the host, where the daemon fetches a `remote` context from."""
    context = tmp_short / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {IMAGE}\nRUN cat /proc/net/dev > /netdev && readlink /proc/self/ns/net > /netns\n"
    )
    with tarfile.open(tmp_short / "ctx.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.add(context / "Dockerfile", arcname="Dockerfile")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_short))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/ctx.tar"
    finally:
        server.shutdown()
        server.server_close()


def test_build_options_in_a_form_body_never_reach_the_daemon(e2e: E2E, served_context: str) -> None:
    """Go's ParseForm lets a form body's fields override the query: the gate checks
    `networkmode=none` in the query, the daemon would build with `networkmode=host` from the body
    (padded past the 4 KiB the daemon reads ahead) and see the host's interfaces."""
    remote = urllib.parse.quote(served_context, safe="")
    escaped = f"rdc-escaped-{uuid.uuid4().hex[:8]}"
    attack = b"&" * 8192 + f"&networkmode=host&cgroupparent=/{escaped}".encode()
    target = f"/v1.45/build?remote={remote}&networkmode=none&t=formhost:1"
    form = "application/x-www-form-urlencoded"
    status, said = raw_exchange(e2e.alpha.gate, post(target, attack, content_type=form))
    assert status == 400 and b"form fields that override the query string" in said, said
    assert e2e.alpha.docker("image", "inspect", "formhost:1").returncode != 0
    # Had the daemon built it, its step would have left a cgroup outside the daemon's.
    cgroups = Path("/sys/fs/cgroup")
    assert not (cgroups / escaped).exists() and not list(cgroups.glob(f"*/{escaped}"))

    # The same remote build as the docker CLI sends it: built, and its step ran in a network
    # namespace of its own (its container's, on the repo's default bridge), not the host's nor
    # the repo daemon's.
    built = e2e.alpha.docker("build", "-t", "formnone:1", served_context, extra_env={"DOCKER_BUILDKIT": "0"})
    assert built.returncode == 0, built.stderr
    try:
        seen = e2e.alpha.docker("run", "--rm", "formnone:1", "cat", "/netdev", "/netns").stdout
        interfaces = {line.split(":")[0].strip() for line in seen.splitlines()[2:-1]}
        assert interfaces <= {"lo", "eth0"}
        daemon_pid = read_pid(e2e.alpha.runtime.daemon_paths.pidfile)
        step_netns = seen.splitlines()[-1].strip()
        assert step_netns not in (os.readlink("/proc/self/ns/net"), os.readlink(f"/proc/{daemon_pid}/ns/net"))
    finally:
        e2e.alpha.docker("rmi", "-f", "formnone:1")


def test_a_shared_bind_is_refused_so_no_container_mount_reaches_the_host(e2e: E2E) -> None:
    files = files_dir(e2e.machine, e2e.alpha.repo.id)
    files.mkdir(parents=True, exist_ok=True)
    result = e2e.alpha.docker(
        "run", "--name", "shared", "-v", f"{files}:/x:rshared", "--tmpfs", "/x/t", IMAGE, "true"
    )
    refused(result, "shared propagation is refused", "rslave")
    assert e2e.alpha.docker("container", "inspect", "shared").returncode != 0
    # Had it run on a host whose mounts are shared, its tmpfs would sit on the repo's pin of `files`.
    with open("/proc/self/mountinfo") as info:
        leaked = [
            line for line in info if f"/pins/{e2e.alpha.repo.id}/" in line and line.split()[4].endswith("/t")
        ]
    assert leaked == []


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("version=2&t=bk:1", b"DOCKER_BUILDKIT=0"),  # a `# syntax=` frontend would send its own steps
        ("remote=git%40internal.example%3Asecrets.git&t=bk:1", b"with the host's SSH keys"),
    ],
)
def test_build_requests_the_gate_cannot_follow_are_refused(e2e: E2E, query: str, said: bytes) -> None:
    status, answer = raw_exchange(
        e2e.alpha.gate, post(f"/v1.45/build?{query}", b"", content_type="application/x-tar")
    )
    assert status == 403 and said in answer, answer
    assert e2e.alpha.docker("image", "inspect", "bk:1").returncode != 0


def test_an_empty_masked_paths_list_at_the_top_level_never_unmasks_proc(e2e: E2E) -> None:
    """dockerd 26.1 still reads HostConfig fields at the top level of a create body that has no
    HostConfig, and `"MaskedPaths": []` there would leave /proc/sys writable in the container."""
    body = {"Image": IMAGE, "Cmd": ["sleep", "30"], "MaskedPaths": [], "ReadonlyPaths": []}
    request = post("/v1.45/containers/create?name=unmasked", json.dumps(body).encode())
    status, said = raw_exchange(e2e.alpha.gate, request)
    assert status == 400 and b"belongs inside HostConfig" in said, said
    assert e2e.alpha.docker("container", "inspect", "unmasked").returncode != 0


def test_a_network_with_a_subnet_of_the_tenants_choosing_is_refused(e2e: E2E) -> None:
    """On a shared daemon a repo's bridges are in the host's routing table, where a narrower subnet
    would take the host's or another network's traffic: refused, for every repo alike."""
    result = e2e.alpha.docker("network", "create", "--subnet", "172.31.0.0/25", "narrow")
    refused(result, "IPAM.Config")
    assert e2e.alpha.docker("network", "inspect", "narrow").returncode != 0
    assert "172.31.0.0/25" not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def test_a_symlink_swapped_in_after_create_mounts_nothing_outside_the_root(e2e: E2E) -> None:
    """Time of check vs time of use: the bind source is swapped for a symlink to /dev between
    `docker create` (checked) and `docker start` (mounted); the container still sees what was checked."""
    files = files_dir(e2e.machine, e2e.alpha.repo.id)
    work = files / "swap"
    work.mkdir(parents=True, exist_ok=True)
    (work / "checked").write_text("yes")
    created = e2e.alpha.docker("create", "--name", "swapped", "-v", f"{work}:/w", IMAGE, "ls", "/w")
    assert created.returncode == 0, created.stderr
    try:
        # The tenant swaps the directory through another admitted bind of its files directory.
        swap = e2e.alpha.docker(
            "run",
            "--rm",
            "-v",
            f"{files}:/f",
            IMAGE,
            "sh",
            "-c",
            "mv /f/swap /f/swap.old && ln -s /dev /f/swap",
        )
        assert swap.returncode == 0, swap.stderr
        assert (files / "swap").is_symlink()
        started = e2e.alpha.docker("start", "-a", "swapped")
        assert started.returncode == 0, started.stderr
        assert started.stdout.split() == ["checked"]  # not /dev's null, zero, ...
    finally:
        e2e.alpha.docker("rm", "-f", "swapped")


def test_everyday_workloads_still_work(e2e: E2E) -> None:
    files = files_dir(e2e.machine, e2e.alpha.repo.id)
    (files / "data").mkdir(parents=True, exist_ok=True)
    run = e2e.alpha.docker(
        "run", "--rm", "--cap-add", "NET_BIND_SERVICE", "--tmpfs", "/scratch:size=1m",
        "-v", f"{files}/data:/data", "-v", "named-e2e:/v", "--security-opt", "no-new-privileges",
        "--sysctl", "net.ipv4.ip_unprivileged_port_start=0",
        IMAGE, "sh", "-c", "echo hello > /data/out && echo v > /v/x && touch /scratch/t && cat /data/out",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "hello"
    assert (files / "data" / "out").read_text().strip() == "hello"
    e2e.alpha.docker("volume", "rm", "named-e2e")


def test_compose_with_named_volumes_and_relative_binds(e2e: E2E) -> None:
    project = files_dir(e2e.machine, e2e.alpha.repo.id) / "shop"
    project.mkdir(parents=True, exist_ok=True)
    (project / "compose.yaml").write_text(
        textwrap.dedent(
            f"""\
            services:
              app:
                image: {IMAGE}
                network_mode: none
                command: sh -c 'echo ok > /data/ok && echo v > /cache/v'
                volumes:
                  - ./data:/data
                  - cache:/cache
                tmpfs:
                  - /run/app
                healthcheck:
                  test: ["CMD", "true"]
                  interval: 1s
            volumes:
              cache: {{}}
            """
        )
    )
    try:
        up = e2e.alpha.compose(project, "up", "--abort-on-container-exit")
        assert up.returncode == 0, up.stderr
        assert (project / "data" / "ok").read_text().strip() == "ok"
    finally:
        e2e.alpha.compose(project, "down", "-v")


def test_a_stopped_container_with_a_bind_starts_again_after_the_repo_restarts(e2e: E2E) -> None:
    """Pins live in /run and go with `rdc repo down` (or a reboot); the next gate pins them again."""
    created = e2e.rdc("repo", "create", "epsilon@m1")
    assert created.returncode == 0, created.stderr
    repo = RepoStore(e2e.machine).get_by_label("epsilon")
    env = {**e2e.alpha.env, "DOCKER_HOST": layout.runtime_for(e2e.machine, repo).docker_host_url}
    keep = files_dir(e2e.machine, repo.id) / "keep"
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "note").write_text("kept")
    try:
        assert e2e.rdc("repo", "up", repo.ref).returncode == 0
        import_busybox(layout.runtime_for(e2e.machine, repo).upstream_socket, IMAGE)
        docker = RepoEnv(repo, layout.runtime_for(e2e.machine, repo), env).docker
        created = docker("create", "--name", "keeper", "-v", f"{keep}:/k", IMAGE, "cat", "/k/note")
        assert created.returncode == 0, created.stderr
        down = e2e.rdc("repo", "down", repo.ref)
        assert down.returncode == 0 and "pinned bind source" in down.stderr, down.stderr
        assert e2e.rdc("repo", "up", repo.ref).returncode == 0
        started = docker("start", "-a", "keeper")
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == "kept"
    finally:
        e2e.rdc("repo", "down", repo.ref)
        e2e.rdc("repo", "delete", repo.ref, "--yes")


def test_naming_runc_as_the_runtime_is_refused(e2e: E2E) -> None:
    """runc by name would run the container without the runtime guard (whose check at every start
    keeps a revoked device out): refused from the CLI, and in the create body in any case of
    `HostConfig.Runtime` the daemon reads (Go's JSON matches field names case-insensitively). In
    beta, so alpha's gate log (test_e2e_audit) holds none of these refusals."""
    run = e2e.beta.docker("run", "--rm", "--runtime", "runc", IMAGE, "true")
    refused(run, "runtime 'runc' is refused", "use instead: no --runtime")
    for spelled in ("Runtime", "runtime", "RUNTIME"):
        document = {"Image": IMAGE, "Cmd": ["true"], "HostConfig": {spelled: "runc"}}
        # The attack is real: sent straight to the daemon, the spelling selects runc.
        status, direct = e2e.beta.daemon_api(
            "POST", "/containers/create?name=runc-direct", json.dumps(document).encode()
        )
        assert status == 201, direct
        _, inspected = e2e.beta.daemon_api("GET", "/containers/runc-direct/json")
        assert inspected["HostConfig"]["Runtime"] == "runc"
        e2e.beta.docker("rm", "-f", "runc-direct")
        status, answer = raw_exchange(
            e2e.beta.gate, post("/containers/create?name=runc-gated", json.dumps(document).encode())
        )
        assert status == 403 and b"runtime 'runc' is refused" in answer, (spelled, answer)
        assert e2e.beta.daemon_api("GET", "/containers/runc-gated/json")[0] == 404  # nothing created
