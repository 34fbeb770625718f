"""The corpus `rdc repo check` is held to against the live gate (tests/e2e/test_e2e_check_corpus.py):
docker create lines and Compose projects, each sent by the real docker CLI or Compose and checked
offline, which must agree on admitted or refused and on the rules.

Devices: GPU0 is granted to the repo while the corpus runs, GPU1 is not. `{files}` in a case is the
repo's own files directory (a bind source the gate admits), `{dir}` the case's own directory.
"""

from __future__ import annotations

from dataclasses import dataclass

from run_cases import REFUSED_RUNS

GPU0 = "vendor.example/gpu=0"
GPU1 = "vendor.example/gpu=1"
IMAGE = "bb:latest"


@dataclass(frozen=True)
class Case:
    """One docker command line (the words after `docker`), run in a directory holding `files`."""

    name: str
    words: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()


def _run(name: str, *options: str) -> Case:
    return Case(name, ("create", *options, IMAGE, "true"))


_RUNS: list[Case] = [
    *(_run(" ".join(options), *options) for options, _ in REFUSED_RUNS),
    _run("granted CDI device", "--device", GPU0),
    _run("granted CDI device, = form", f"--device={GPU0}"),
    _run("ungranted CDI device", "--device", GPU1),
    _run("gpus 1", "--gpus", "1"),
    _run("gpus count=all", "--gpus", "count=all"),
    _run("gpus device id", "--gpus", "device=GPU-aaaa"),
    _run("gpus with driver", "--gpus", "driver=vendor,count=1"),
    _run("device node with permissions", "--device", "/dev/fakegpu0:/dev/x:r"),
    _run("publish long form", "--publish", "published=80,target=80"),
    _run("publish long form udp", "--publish", "published=8081,target=81,protocol=udp"),
    _run("publish long form, no published port", "--publish", "target=80"),
    _run("publish short", "-p", "80:80"),
    _run("publish on an address", "-p", "127.0.0.1:8080:80"),
    _run("publish a range", "-p", "9000-9001:9000-9001"),
    _run("publish no host port", "-p", "80"),
    _run("publish all", "-P", "--expose", "80"),
    _run("mount tmpfs", "--mount", "type=tmpfs,dst=/t"),
    _run("mount tmpfs sized", "--mount", "type=tmpfs,dst=/t,tmpfs-size=1m,tmpfs-mode=1777"),
    _run("mount named volume", "--mount", "type=volume,src=checkvol,dst=/v"),
    _run("mount volume nocopy", "--mount", "type=volume,src=checkvol,dst=/v,volume-nocopy"),
    _run("mount volume with a label", "--mount", "type=volume,src=checkvol2,dst=/v,volume-label=a=b"),
    _run("mount bind of /srv", "--mount", "type=bind,src=/srv,dst=/x"),
    _run("mount bind of /dev read-only", "--mount", "type=bind,source=/dev,target=/d,readonly"),
    _run("mount bind of the repo's files", "--mount", "type=bind,src={files},dst=/data"),
    _run("mount bind propagation", "--mount", "type=bind,src={files},dst=/data,bind-propagation=rshared"),
    _run(
        "mount volume of tmpfs type",
        "--mount",
        "type=volume,dst=/x,volume-opt=type=tmpfs,volume-opt=device=tmpfs",
    ),
    _run("bind the repo's files", "-v", "{files}:/data"),
    _run("bind the repo's files read-only", "-v", "{files}:/data:ro"),
    _run("bind /", "-v", "/:/host"),
    _run("bind /proc", "-v", "/proc:/p"),
    _run("bind /sys", "-v", "/sys:/s"),
    _run("bind the docker socket", "-v", "/var/run/docker.sock:/s"),
    _run("named volume", "-v", "checkvol:/x"),
    _run("anonymous volume", "-v", "/anon"),
    _run("volume driver local", "--volume-driver", "local", "-v", "checkvol:/x"),
    _run("cap-add NET_ADMIN", "--cap-add", "NET_ADMIN"),
    _run("cap-add ALL", "--cap-add", "ALL"),
    _run("cap-add CAP_SYS_ADMIN", "--cap-add", "CAP_SYS_ADMIN"),
    _run("cap-add CHOWN", "--cap-add", "CHOWN"),
    _run("cap-drop ALL", "--cap-drop", "ALL"),
    _run("seccomp unconfined", "--security-opt", "seccomp=unconfined"),
    _run("apparmor unconfined", "--security-opt", "apparmor=unconfined"),
    _run("no-new-privileges", "--security-opt", "no-new-privileges"),
    _run("label disable", "--security-opt", "label=disable"),
    _run("network host", "--network", "host"),
    _run("network none", "--network", "none"),
    _run("pid host", "--pid", "host"),
    _run("ipc host", "--ipc", "host"),
    _run("ipc shareable", "--ipc", "shareable"),
    _run("uts host", "--uts", "host"),
    _run("userns host", "--userns", "host"),
    _run("cgroupns host", "--cgroupns", "host"),
    _run("cgroupns private", "--cgroupns", "private"),
    _run("cgroup parent", "--cgroup-parent", "/evil"),
    _run("sysctl of the host", "--sysctl", "kernel.shm_rmid_forced=1"),
    _run("sysctl of the network", "--sysctl", "net.ipv4.ip_unprivileged_port_start=0"),
    _run("ulimit within", "--ulimit", "nofile=1024:2048"),
    _run("ulimit raised", "--ulimit", "nofile=2000000"),
    _run("pids limit", "--pids-limit", "100"),
    _run("pids unlimited", "--pids-limit", "-1"),
    _run("oom score lowered", "--oom-score-adj", "-1000"),
    _run("oom score raised", "--oom-score-adj", "500"),
    _run("oom kill disabled", "--oom-kill-disable"),
    _run("storage opt", "--storage-opt", "size=1G"),
    _run("tmpfs", "--tmpfs", "/t:rw,size=1m"),
    _run("tmpfs exec", "--tmpfs", "/t:exec"),
    _run("log driver none", "--log-driver", "none"),
    _run("log driver syslog", "--log-driver", "syslog"),
    _run("log options", "--log-driver", "json-file", "--log-opt", "max-size=1m"),
    _run("visible devices all", "-e", "NVIDIA_VISIBLE_DEVICES=all"),
    _run("visible devices void", "-e", "NVIDIA_VISIBLE_DEVICES=void"),
    _run("visible devices from an env file", "--env-file", "{dir}/gpu.env"),
    _run("an annotation", "--annotation", "x.example/a=b"),
    _run("runtime runc", "--runtime", "runc"),
    _run("privileged=false", "--privileged=false"),
    _run("device cgroup rule for all", "--device-cgroup-rule", "a *:* rwm"),
    _run(
        "the free options",
        "--init",
        "--read-only",
        "-u",
        "0",
        "--group-add",
        "video",
        "--cpus",
        "1",
        "-m",
        "100m",
        "--shm-size",
        "64m",
        "--restart",
        "always",
        "--dns",
        "1.1.1.1",
        "--add-host",
        "a:1.2.3.4",
        "-w",
        "/tmp",
        "-l",
        "a=b",
        "-h",
        "box",
    ),
]


def _compose(name: str, compose: str, *line: str, **files: str) -> Case:
    """A Compose project: compose.yaml (and `files`), `docker compose LINE up --no-start`."""
    every = {"compose.yaml": compose, **{k.replace("__", "."): v for k, v in files.items()}}
    return Case(name, ("compose", *line, "up", "--no-start"), tuple(every.items()))


_SVC = f"services:\n  web:\n    image: {IMAGE}\n    command: ['true']\n"

_COMPOSES: list[Case] = [
    _compose("compose plain", _SVC),
    _compose("compose granted device", _SVC + f"    devices: ['{GPU0}']\n"),
    _compose("compose ungranted device", _SVC + f"    devices: ['{GPU1}']\n"),
    _compose("compose device node", _SVC + "    devices: ['/dev/fakegpu0']\n"),
    _compose(
        "compose deploy devices",
        _SVC + "    deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}\n",
    ),
    _compose(
        "compose deploy cdi devices",
        _SVC + "    deploy: {resources: {reservations: {devices: "
        f"[{{driver: cdi, device_ids: ['{GPU0}'], capabilities: [gpu]}}]}}}}}}\n",
    ),
    _compose("compose gpus all", _SVC + "    gpus: all\n"),
    _compose("compose gpus with ids", _SVC + "    gpus: [{device_ids: ['0'], capabilities: [gpu]}]\n"),
    _compose(
        "compose override privileged", _SVC, compose__override__yaml="services:\n  web: {privileged: true}\n"
    ),
    _compose("compose override harmless", _SVC, compose__override__yaml="services:\n  web: {init: true}\n"),
    _compose(
        "compose include",
        "include: [inc.yaml]\n" + _SVC,
        inc__yaml=f"services:\n  side: {{image: {IMAGE}, network_mode: host}}\n",
    ),
    _compose(
        "compose include harmless",
        "include: [inc.yaml]\n" + _SVC,
        inc__yaml=f"services:\n  side: {{image: {IMAGE}, command: ['true']}}\n",
    ),
    _compose(
        "compose extends",
        f"services:\n  web: {{image: {IMAGE}, extends: {{file: base.yaml, service: b}}}}\n",
        base__yaml=f"services:\n  b: {{image: {IMAGE}, pid: host}}\n",
    ),
    _compose("compose env_file", _SVC + "    env_file: [gpu.env]\n"),
    _compose("compose env_file long form", _SVC + "    env_file: [{path: gpu.env, required: true}]\n"),
    _compose(
        "compose env_file optional, missing", _SVC + "    env_file: [{path: none.env, required: false}]\n"
    ),
    _compose(
        "compose --env-file and -f",
        _SVC,
        "--env-file",
        "x.env",
        "-f",
        "evil.yaml",
        evil__yaml=f"services:\n  evil: {{image: {IMAGE}, pid: '${{MODE}}'}}\n",
    ),
    _compose(
        "compose -f harmless beside an evil compose.yaml",
        _SVC + "    privileged: true\n",
        "-f",
        "ok.yaml",
        ok__yaml=f"services:\n  ok: {{image: {IMAGE}, command: ['true']}}\n",
    ),
    _compose("compose -p", _SVC, "-p", "checkp"),
    _compose("compose nested default, outer", _SVC + "    ports: ['${NOPE1:-${NOPE2:-8080}}:80']\n"),
    _compose("compose nested default into a bind", _SVC + "    volumes: ['${NOPE1:-${NOPE2:-/dev}}:/d']\n"),
    _compose(".env interpolation", _SVC + "    pid: ${MODE}\n"),
    _compose(
        "compose secret file of a device", _SVC + "    secrets: [s]\nsecrets:\n  s: {file: /dev/fakegpu0}\n"
    ),
    _compose("compose secret file", _SVC + "    secrets: [s]\nsecrets:\n  s: {file: ./x.env}\n"),
    _compose(
        "compose config file of /dev/null", _SVC + "    configs: [c]\nconfigs:\n  c: {file: /dev/null}\n"
    ),
    _compose(
        "compose config file",
        _SVC + "    configs: [{source: c, target: /etc/c}]\nconfigs:\n  c: {file: ./x.env}\n",
    ),
    _compose(
        "compose inactive profile", _SVC + f"  dbg: {{image: {IMAGE}, privileged: true, profiles: [dbg]}}\n"
    ),
    _compose(
        "compose active profile",
        _SVC + f"  dbg: {{image: {IMAGE}, privileged: true, profiles: [dbg]}}\n",
        "--profile",
        "dbg",
    ),
    _compose("compose long publish", _SVC + "    ports: [{target: 80, published: '80'}]\n"),
    _compose("compose publish on an address", _SVC + "    ports: ['127.0.0.1:8080:80']\n"),
    _compose("compose bind of the project", _SVC + "    volumes: ['./data:/data']\n"),
    _compose("compose long bind of /dev", _SVC + "    volumes: [{type: bind, source: /dev, target: /d}]\n"),
    _compose(
        "compose named volume of /dev",
        _SVC
        + "    volumes: ['vol:/v']\nvolumes:\n  vol: {driver_opts: {type: none, o: bind, device: /dev}}\n",
    ),
    _compose("compose named volume", _SVC + "    volumes: ['vol:/v']\nvolumes:\n  vol: {}\n"),
    _compose("compose tmpfs volume", _SVC + "    volumes: [{type: tmpfs, target: /t}]\n"),
    _compose(
        "compose network with a subnet",
        _SVC + "    networks: [n]\nnetworks:\n  n: {ipam: {config: [{subnet: 10.99.0.0/24}]}}\n",
    ),
    _compose("compose internal network", _SVC + "    networks: [n]\nnetworks:\n  n: {internal: true}\n"),
    _compose("compose namespaces", _SVC + "    ipc: host\n"),
    _compose(
        "compose another service's namespaces",
        _SVC
        + f"  side: {{image: {IMAGE}, command: ['true'], network_mode: 'service:web', pid: 'service:web'}}\n",
    ),
    _compose("compose capabilities", _SVC + "    cap_add: [SYS_ADMIN]\n"),
    _compose("compose harmless capability", _SVC + "    cap_add: [CHOWN]\n"),
    _compose("compose sysctls", _SVC + "    sysctls: {kernel.shm_rmid_forced: 1}\n"),
    _compose("compose ulimits", _SVC + "    ulimits: {nofile: {soft: 1024, hard: 2048}}\n"),
    _compose("compose logging", _SVC + "    logging: {driver: syslog}\n"),
    _compose("compose runtime", _SVC + "    runtime: runc\n"),
    _compose("compose security_opt", _SVC + "    security_opt: ['seccomp=unconfined']\n"),
    _compose("compose environment", _SVC + "    environment: {NVIDIA_VISIBLE_DEVICES: all}\n"),
    _compose(
        "compose build on the host network",
        "services:\n  web:\n    build: {context: ., network: host}\n",
        Dockerfile=f'FROM {IMAGE}\nRUN true\nCMD ["true"]\n',
    ),
    _compose(
        "compose build",
        "services:\n  web:\n    build: .\n",
        Dockerfile=f'FROM {IMAGE}\nRUN true\nCMD ["true"]\n',
    ),
]

# Every case's directory also holds these (unless it names its own).
COMMON_FILES = {"gpu.env": "NVIDIA_VISIBLE_DEVICES=all\n", "x.env": "MODE=host\n", ".env": "MODE=host\n"}

CORPUS: list[Case] = [*_RUNS, *_COMPOSES]
