"""A repo's own network namespace: where its dockerd, its containers' bridges and its builds live.

A repo daemon in the host's network namespace has an address on every repo's bridge and on the
host's loopback, and fetches (pulls, `ADD http://…`, `fromSrc=`) as root from there. So each repo
daemon runs in a namespace of its own, `rdc-<12 of ID>` (`ip netns`, under /run/netns), whose only
way out is a user-mode uplink, `slirp4netns` (the uplink rootless Docker uses):

- No routing through the host: slirp4netns turns the namespace's packets into ordinary sockets of
  its own process, so the host's IP forwarding stays as it is, and no other repo's bridge is on
  any path (each lives in its own namespace).
- `--disable-host-loopback`: the uplink's gateway (10.0.2.2) does not lead to the host's loopback,
  and 127.0.0.1 inside is the namespace's own.
- Because slirp4netns connects from the host, the host's own addresses and the networks it reaches
  directly (a system Docker's bridge, a VM bridge) would answer; `uplink_rules` rejects them, and
  link-local (the cloud metadata service), in the namespace's own netfilter, before anything leaves.
  The host gains addresses and bridges while repos are up (a VPN, a VM, a system Docker started
  later): the port keeper's `uplinkwatch` thread writes the rules again at every change.

Inside the namespace dockerd manages iptables and forwarding as usual: both are per namespace.
Containers resolve names through the uplink's DNS forwarder (10.0.2.3).

Pure parts (`blocked_destinations`, `uplink_rules`) are separate from the commands that apply them,
so the rule set is tested without root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from rediacc_core import publishing, repos
from rediacc_core.errors import StateError, ToolError
from rediacc_core.machine import Machine
from rediacc_core.runtime import kernelpath, rtnetlink
from rediacc_core.runtime.layout import RepoNetwork, path_of

UPLINK_DEVICE = "tap0"
UPLINK_ADDRESS = "10.0.2.100"  # the namespace's address on the uplink (slirp4netns's default)
UPLINK_DNS = "10.0.2.3"  # slirp4netns's DNS forwarder (its default 10.0.2.0/24 network)
UPLINK_MTU = 65520  # slirp4netns's recommended MTU: fewer, larger packets through user space
READY_TIMEOUT = 10.0
PROCESS_STOP_TIMEOUT = 5.0  # seconds the uplink and the port keeper get after SIGTERM
CHAIN = "RDC-UPLINK"
GUARD = "RDC-UPLINK-GUARD"  # the refusals again, in mangle POSTROUTING (`uplink_rules`)
# Always unreachable through the uplink: link-local (169.254.169.254 is the metadata service of
# every major cloud) and "this network".
ALWAYS_BLOCKED = ("169.254.0.0/16", "0.0.0.0/8")
LOOPBACK_INDEX = 1  # the kernel gives `lo` index 1 in every network namespace
_INSTALL_HINT = "install slirp4netns (Debian/Ubuntu: apt install slirp4netns) and iproute2"


def enter(net: RepoNetwork, argv: Sequence[str]) -> list[str]:
    """`argv` run inside the namespace (nsenter keeps every other namespace: dockerd still sees the
    host's filesystem, device nodes and CDI specs)."""
    return [_tool("nsenter"), f"--net={net.path}", "--", *argv]


def blocked_destinations(
    addresses: Iterable[rtnetlink.Address], routes: Iterable[rtnetlink.Route]
) -> list[str]:
    """IPv4 destinations the uplink must not reach, from the host's addresses and routes
    (`rtnetlink`): each host address (its services), each local range the host answers as its own
    (`ip route add local …`), each network of the main table on an interface that carries no
    default route (bridges and VMs the host reaches directly), and ALWAYS_BLOCKED. The network of
    the default route's interface stays reachable: that is the machine's network, as seen from
    outside. IPv6 is left out: the uplink carries none (slirp4netns runs without --enable-ipv6, so
    the namespace has no IPv6 route out).
    """
    blocked: list[str] = list(ALWAYS_BLOCKED)
    for address in addresses:
        if address.family == socket.AF_INET and not ipaddress.ip_address(address.local).is_loopback:
            # The namespace has its own loopback; the uplink's gateway is not the host's.
            blocked.append(f"{address.local}/32")
    v4 = [r for r in routes if r.family == socket.AF_INET]
    main = [r for r in v4 if r.table == rtnetlink.RT_TABLE_MAIN and r.kind == rtnetlink.RTN_UNICAST]
    uplinks = {r.oif for r in main if r.is_default}
    for route in v4:
        own = route.table == rtnetlink.RT_TABLE_LOCAL and route.kind == rtnetlink.RTN_LOCAL
        direct = route in main and not (route.is_default or route.gateway or route.oif in uplinks)
        network = ipaddress.ip_network(route.dst)
        if (own or (direct and route.oif != LOOPBACK_INDEX)) and not network.is_loopback:
            blocked.append(str(network))
    return sorted(set(blocked), key=lambda n: (ipaddress.ip_network(n).network_address, n))


def uplink_rules(blocked: Sequence[str]) -> str:
    """iptables-restore input (for `--noflush`) that fills CHAIN with rejections of `blocked`, and
    GUARD with drops of the same, replacing what they held: one atomic step per table, so a
    namespace never has half a rule set."""
    lines = ["*filter", f":{CHAIN} - [0:0]"]
    # Only what leaves through the uplink: a network of the repo's own that happens to overlap one
    # of `blocked` (its default bridge and a system Docker's docker0 are both 172.17.0.0/16) is
    # the repo's own traffic, never the host's.
    lines += [
        f"-A {CHAIN} -o {UPLINK_DEVICE} -d {cidr} -j REJECT --reject-with icmp-admin-prohibited"
        for cidr in blocked
    ]
    # The kernel path's veth refuses the same, and every repo's range, here too: should the host's
    # firewall lose the repo's chains (a reload), this namespace still lets none of it out. (No
    # such device on the user path: the rules then match nothing.)
    lines += [
        f"-A {CHAIN} -o {kernelpath.INSIDE_DEVICE} -d {cidr} -j REJECT --reject-with icmp-admin-prohibited"
        for cidr in [str(kernelpath.RANGE), *blocked]
    ]
    # The same again as drops in mangle POSTROUTING (GUARD), which dockerd never writes: dockerd
    # takes FORWARD's jump to DOCKER-USER out and puts it back in two iptables runs at every network
    # a tenant creates (Engine 26), and a packet sent in between would pass the filter chain by.
    guard = ["*mangle", f":{GUARD} - [0:0]"]
    guard += [f"-A {GUARD} -o {UPLINK_DEVICE} -d {cidr} -j DROP" for cidr in blocked]
    guard += [
        f"-A {GUARD} -o {kernelpath.INSIDE_DEVICE} -d {cidr} -j DROP"
        for cidr in [str(kernelpath.RANGE), *blocked]
    ]
    return "\n".join([*lines, "COMMIT", *guard, "COMMIT", ""])


# Where CHAIN is jumped to from: the daemon's own connections (OUTPUT) and its containers'
# (DOCKER-USER, the chain dockerd keeps first in FORWARD and never flushes).
JUMPS = ("OUTPUT", "DOCKER-USER")


def _tool(name: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise ToolError(
            f"{name} is not installed; a repo daemon runs in a network namespace of its own", _INSTALL_HINT
        )
    return found


def _run(argv: Sequence[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolError(
            f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}",
            "run rdc repo up as root on a host with network namespaces; " + _INSTALL_HINT,
        )
    return done.stdout


def _host_routes() -> list[rtnetlink.Route]:
    found = rtnetlink.dump(rtnetlink.RTM_GETROUTE, socket.AF_INET)
    return [r for r in map(rtnetlink.route, found) if r is not None]


def host_destinations() -> list[str]:
    """`blocked_destinations` of the host as it is now (read at each `rdc repo up`, and at each
    change of its addresses and routes by `uplinkwatch`)."""
    found = rtnetlink.dump(rtnetlink.RTM_GETADDR, socket.AF_INET)
    addresses = [a for a in map(rtnetlink.address, found) if a is not None]
    return blocked_destinations(addresses, _host_routes())


def uplink_pid(net: RepoNetwork) -> int | None:
    """The running slirp4netns of `net`, when its pidfile names a live one."""
    return net.uplink.pid()


def ports_pid(net: RepoNetwork) -> int | None:
    return net.keeper.pid()


def exists(net: RepoNetwork) -> bool:
    return net.path.exists()


def create(net: RepoNetwork) -> None:
    """The namespace itself, with its loopback up and nothing else (no route out), unless it
    exists: what a process needs to start in it (`bring_up` gives it the rest)."""
    if exists(net):
        return
    ip = _tool("ip")
    net.path_record.unlink(missing_ok=True)  # a namespace gone (a reboot) takes its path with it
    _run([ip, "netns", "add", net.name])
    _run([ip, "-n", net.name, "link", "set", "lo", "up"])


def bring_up(net: RepoNetwork, root: Path, daemon_socket: Path, path: str | None = None) -> None:
    """Make the namespace, its rules, its uplink and its port keeper, whatever of them is missing
    (idempotent: `rdc repo up` after a crash or a reboot finds some, all or none of them). The
    rules are written again each time, from the host's addresses as they are now; the keeper's
    `uplinkwatch` thread keeps them so while the host changes. The path out is the one the
    namespace came up with while it lives, else `path` (`kernel` or `user`, the bench's), else
    the machine's `net-path` setting."""
    create(net)
    path, at = _path_for(net, root, path)
    blocked = host_destinations()
    # Before any route out exists (the uplink's, the veth's): the namespace's refusals and, on the
    # kernel path (recorded by `_path_for`), the repo's chains and jumps on the host, which match
    # the veth by name, so they are in place before `kernelpath.set_up` makes it.
    apply_rules(net, blocked)
    if uplink_pid(net) is None:
        _start_uplink(net, configure=path == kernelpath.USER)
    if at is not None:  # the uplink then carries only published ports and DNS, the veth the rest
        uplink = [f"addr replace {UPLINK_ADDRESS}/24 dev {UPLINK_DEVICE}"]
        uplink.append(f"link set {UPLINK_DEVICE} mtu {UPLINK_MTU} up")
        kernelpath.set_up(net.name, net.short, at, UPLINK_MTU, enter(net, []), uplink)
    if ports_pid(net) is None:
        keeper = [sys.executable, "-m", "rediacc_core.runtime.ports", "--root", str(root)]
        keeper += ["--daemon", str(daemon_socket), "--api", str(net.api_socket), "--netns", net.name]
        state = publishing.state_file(Machine(name="local", root=root).run_dir, net.name.removeprefix("rdc-"))
        keeper += ["--state", str(state)]
        net.keeper.start(keeper)


def _path_for(net: RepoNetwork, root: Path, forced: str | None = None) -> tuple[str, kernelpath.Slot | None]:
    """The path out `net` takes (setting `net-path`, `kernelpath.choose`), its slot taken and
    recorded on the kernel path."""
    recorded = path_of(net)
    if recorded is not None:
        return recorded
    from rediacc_core import settings  # here: only choosing a path at up reads the settings

    machine = Machine(name="local", root=root)
    setting = forced or settings.effective(settings.read_settings(machine))["net-path"]
    usable = kernelpath.forwarding() and net.state_dir is not None and shutil.which("iptables") is not None
    path = kernelpath.choose(setting, usable)
    at = None
    if path == kernelpath.KERNEL:
        if net.state_dir is None:
            raise StateError(
                f"{net.name} has no state directory to keep its kernel path's slot in", "use net-path=user"
            )
        known = {repo.id for repo in repos.RepoStore(machine).list()}
        try:  # the repo's own veth (left by an up cut short) holds no other repo's slot
            own = socket.if_nametoindex(kernelpath.veth_name(net.short))
        except OSError:
            own = -1
        routes = [r.dst for r in _host_routes() if r.table == rtnetlink.RT_TABLE_MAIN and r.oif != own]
        at = kernelpath.allocate(net.state_dir, known, routes)
    net.workdir.mkdir(parents=True, exist_ok=True)
    net.path_record.write_text(f"{path} {at.index}\n" if at is not None else f"{path}\n")
    return path, at


def apply_rules(net: RepoNetwork, blocked: Sequence[str]) -> None:
    """The namespace's uplink rules, and on the kernel path the repo's chains on the host, from the
    host's `blocked` destinations as they are now."""
    recorded = path_of(net)
    if recorded is not None and recorded[1] is not None:
        kernelpath.apply(net.short, recorded[1], blocked)
    # One process in the namespace: the chain filled (atomic), then DOCKER-USER and each jump to
    # the chain made where missing, in that order, stopping at the first failure (each command
    # through nsenter of its own cost a repo's start some milliseconds).
    iptables = shlex.quote(_tool("iptables"))
    # `-w`: wait for the xtables lock dockerd may hold (legacy iptables), rather than fail.
    iptables += " -w"
    steps = [
        f"{shlex.quote(_tool('iptables-restore'))} -w --noflush",
        f"{{ {iptables} -n -L DOCKER-USER >/dev/null 2>&1 || {iptables} -N DOCKER-USER; }}",
        *(
            f"{{ {iptables} -C {chain} -j {CHAIN} 2>/dev/null || {iptables} -I {chain} 1 -j {CHAIN}; }}"
            for chain in JUMPS
        ),
        f"{{ {iptables} -t mangle -C POSTROUTING -j {GUARD} 2>/dev/null || "
        f"{iptables} -t mangle -I POSTROUTING 1 -j {GUARD}; }}",
    ]
    inside = enter(net, ["sh", "-c", " && ".join(steps)])
    done = subprocess.run(inside, input=uplink_rules(blocked), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolError(f"cannot write the uplink rules of {net.name}: {done.stderr.strip()}", _INSTALL_HINT)


def host_rules_intact(net: RepoNetwork, blocked: Sequence[str]) -> bool:
    """Whether the repo's chains and jumps on the host are all there (always, on the user path)."""
    recorded = path_of(net)
    if recorded is None or recorded[1] is None:
        return True
    return kernelpath.intact(kernelpath.saved(), net.short, recorded[1], blocked)


def _start_uplink(net: RepoNetwork, *, configure: bool = True) -> None:
    slirp = _tool("slirp4netns")
    net.workdir.mkdir(parents=True, exist_ok=True)
    ready_r, ready_w = os.pipe()
    argv = [
        slirp,
        # Unconfigured beside the kernel path: its default route would take the veth's place.
        *(["--configure"] if configure else []),
        f"--mtu={UPLINK_MTU}",
        "--disable-host-loopback",
        "--enable-seccomp",
        f"--api-socket={net.api_socket}",
        f"--ready-fd={ready_w}",
        "--netns-type=path",
        str(net.path),
        UPLINK_DEVICE,
    ]
    # Detached: it outlives `rdc repo up`, like the daemon; its pid is recorded once it is ready.
    process = net.uplink.start(argv, record=False, pass_fds=(ready_w,))
    os.close(ready_w)
    try:
        ready = _wait_ready(ready_r, process)
    finally:
        os.close(ready_r)
    if not ready:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise ToolError(
            f"the network uplink of {net.name} (slirp4netns) did not come up; its log: {net.log}",
            _INSTALL_HINT + "; /dev/net/tun must exist",
        )
    net.uplink.record(process.pid)


def _wait_ready(fd: int, process: subprocess.Popen[bytes]) -> bool:
    # slirp4netns writes "1" to the ready fd once tap0 is configured in the namespace: woken by it
    # (a repo's start waits on this), looking at the process itself every 0.1 s. The fd reads
    # empty once slirp4netns exited without writing (it held the pipe's only write end).
    deadline = time.monotonic() + READY_TIMEOUT
    os.set_blocking(fd, False)
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.1)
        if readable:
            with contextlib.suppress(BlockingIOError):
                return os.read(fd, 1) == b"1"
        if process.poll() is not None:
            return False
    return False


def tear_down(net: RepoNetwork, ref: str) -> list[str]:
    """Stop the uplink and delete the namespace of repo `ref` (what is left in it goes with its last
    process: `rdc repo down` stops those first). Returns what it removed, for the user; raises,
    keeping the namespace and the pidfile, when the uplink or the port keeper would not exit."""
    done = []
    for child in (net.keeper, net.uplink):  # each gone before its namespace is
        pid = child.stop(PROCESS_STOP_TIMEOUT)
        if pid is not None and child.pidfile.exists():
            raise StateError(
                f"the {child.what} of {net.name} (pid {pid}) did not exit after SIGKILL",
                f"find out what holds it (cat /proc/{pid}/stack), then run rdc repo down {ref} again",
            )
        if pid is not None:
            done.append(f"{child.what} (pid {pid})")
    if shutil.which("iptables") is not None:  # found by name: a failed up's leftovers go too
        done += kernelpath.tear_down(net.short)
    if exists(net):
        _run([_tool("ip"), "netns", "del", net.name])
        done.append(f"network namespace {net.name}")
    net.path_record.unlink(missing_ok=True)
    return done
