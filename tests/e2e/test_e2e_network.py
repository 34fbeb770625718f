"""Each repo's daemon, its containers' bridges and its builds live in a network namespace of the
repo's own: a container or a daemon fetch of one repo reaches no service of another repo and none
of the host's (its loopback, its addresses), proven by listeners that record every connection."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv, refused

from rediacc_core import pids
from rediacc_core.publishing import short_id, state_file
from rediacc_core.runtime import kernelpath, layout, netns
from rediacc_core.runtime.process import read_pid
from rediacc_core.settings import set_setting, unset_setting
from rediacc_core.testing.dockerenv import docker_api

TOKEN = "rdc-network-token-5173"
UPLINK_GATEWAY = "10.0.2.2"  # slirp4netns's gateway: the host's loopback were it not disabled
REQUEST_WAIT = 10.0  # seconds a listener waits for a request's head (a client that sends none gets no answer)


@dataclass
class Listener:
    """A TCP server on the host that records who connected and answers each request with TOKEN."""

    address: str
    sock: socket.socket
    seen: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.seen.append(peer[0])
            threading.Thread(target=_answer, args=(conn,), daemon=True).start()


def _answer(conn: socket.socket) -> None:
    """TOKEN, once the request's head has come, as from any HTTP server. Answering before it comes
    breaks Go's HTTP client (the daemon's fetches, both builders' `ADD http://`): an answer that
    arrives before its request is registered is dropped as "Unsolicited response received on idle
    HTTP channel" with the connection, and a fresh one is not retried (the build fails with
    `readLoopPeekFailLocked`). Under CPU load about one fetch in fifty through the uplink met that."""
    with conn, contextlib.suppress(OSError):
        conn.settimeout(REQUEST_WAIT)
        head = b""
        while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
            head += chunk
        conn.sendall(f"HTTP/1.0 200 OK\r\nContent-Length: {len(TOKEN)}\r\n\r\n{TOKEN}".encode())


def _listen(address: str) -> Listener:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen(16)
    listener = Listener(address, sock)
    threading.Thread(target=listener.serve, daemon=True).start()
    return listener


def _host_address() -> str:
    """One of the host's own non-loopback IPv4 addresses (its services listen there too)."""
    for cidr in netns.host_destinations():
        network = ipaddress.ip_network(cidr)
        if network.prefixlen == 32 and not network.is_link_local:
            return str(network.network_address)
    pytest.skip("the host has no non-loopback IPv4 address")


@pytest.fixture
def host_services() -> Iterator[list[Listener]]:
    listeners = [_listen("127.0.0.1"), _listen(_host_address())]
    yield listeners
    for listener in listeners:
        listener.sock.close()


METADATA = "169.254.169.254"  # a cloud's metadata service: credentials of the host's own account
_METADATA_SERVER = r"""
import socket, sys
server = socket.socket()
server.bind((sys.argv[1], 80))
server.listen(16)
print("ready", flush=True)
while True:
    conn, peer = server.accept()
    print(peer[0], flush=True)
    conn.settimeout(5)
    head = b""
    try:
        while b"\r\n\r\n" not in head and (chunk := conn.recv(65536)):
            head += chunk
        token = sys.argv[2].encode()
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(token), token))
    except OSError:
        pass
    conn.close()
"""


@dataclass
class Metadata:
    """A stand-in for the cloud's metadata service; `seen()` lists who connected, in order."""

    log: Path

    def seen(self) -> list[str]:
        return self.log.read_text().splitlines()[1:]  # after its "ready"


@pytest.fixture
def metadata_service(tmp_path: Path) -> Iterator[Metadata | None]:
    """METADATA:80 one hop from the host, in a network namespace of its own that a route leads to,
    as a cloud's is; only on the stand-in host of `.ci/forwarding-host`, since on a real host the
    route would take the real service's place. None elsewhere."""
    if os.environ.get("RDC_STAND_IN_HOST") != "1":
        yield None
        return
    space, host_end = f"rdc-meta-{os.getpid()}", "rdcmeta0"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", space)
    server: subprocess.Popen[bytes] | None = None
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", "meta1", "netns", space)
        ip("addr", "add", "198.51.100.1/30", "dev", host_end)
        ip("link", "set", host_end, "up")
        # Through a gateway, as a cloud's is: no host network the rules block as directly reached
        # holds the address, so only the rule against link-local refuses it.
        ip("route", "add", f"{METADATA}/32", "via", "198.51.100.2", "dev", host_end)
        for step in (
            ["link", "set", "lo", "up"],
            ["addr", "add", "198.51.100.2/30", "dev", "meta1"],
            ["addr", "add", f"{METADATA}/32", "dev", "lo"],
            ["link", "set", "meta1", "up"],
            ["route", "add", "default", "via", "198.51.100.1", "dev", "meta1"],
        ):
            ip("netns", "exec", space, "ip", *step)
        log = tmp_path / "metadata.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(
                ["ip", "netns", "exec", space, sys.executable, "-c", _METADATA_SERVER, METADATA, TOKEN],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while log.read_text() != "ready\n":
            assert time.monotonic() < deadline and server.poll() is None, log.read_text()
            time.sleep(0.05)
        yield Metadata(log)
    finally:
        if server is not None:
            server.kill()
            server.wait(10)
        subprocess.run(["ip", "netns", "del", space], check=False, capture_output=True)


def _fetch(env: RepoEnv, network: str, address: str, port: int) -> str:
    """What a container of `env` on `network` reads from address:port (nc's errors included)."""
    script = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {address} {port} 2>&1; true"
    run = env.docker("run", "--rm", "--network", network, IMAGE, "sh", "-c", script)
    assert run.returncode == 0, run.stderr
    return run.stdout + run.stderr


def _network(env: RepoEnv, name: str) -> str:
    made = env.docker("network", "create", name)
    assert made.returncode == 0, made.stderr
    return name


def _path(env: RepoEnv) -> str:
    """The path out `env`'s namespace took: `kernel` or `user` (RDC_E2E_NET_PATH picks it)."""
    found = layout.path_of(env.runtime.network)
    assert found is not None, "the repo's namespace has no recorded path"
    return found[0]


def _host_chain(env: RepoEnv, table: str, chain: str) -> str:
    listed = subprocess.run(
        ["iptables", "-t", table, "-S", chain], capture_output=True, text=True, check=False
    )
    return listed.stdout


def _namespace_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_each_repo_daemon_runs_in_a_network_namespace_of_its_own(e2e: E2E) -> None:
    spaces = []
    for env in (e2e.alpha, e2e.beta):
        pid = read_pid(env.runtime.daemon_paths.pidfile)
        assert pid is not None
        spaces.append(_namespace_of(pid))
        assert env.runtime.network.path.exists()
        assert netns.uplink_pid(env.runtime.network) is not None
    assert spaces[0] != spaces[1]
    assert _namespace_of(os.getpid()) not in spaces
    # A repo's bridge is in its namespace, not on the host.
    made = e2e.alpha.docker("network", "create", "where")
    assert made.returncode == 0, made.stderr
    try:
        bridge = f"br-{made.stdout.strip()[:12]}"
        assert bridge not in os.listdir("/sys/class/net")
        inside = subprocess.run(
            netns.enter(e2e.alpha.runtime.network, ["ip", "-br", "link"]),
            capture_output=True,
            text=True,
            check=True,
        )
        assert bridge in inside.stdout
    finally:
        e2e.alpha.docker("network", "rm", "where")


def test_each_repo_takes_the_path_out_the_setting_names_and_repo_list_shows_it(e2e: E2E) -> None:
    wanted = os.environ.get("RDC_E2E_NET_PATH", "auto")
    expected = wanted if wanted != "auto" else ("kernel" if kernelpath.forwarding() else "user")
    for env in (e2e.alpha, e2e.beta):
        assert _path(env) == expected
        short = env.runtime.network.short
        veth = kernelpath.veth_name(short)
        on_host = subprocess.run(["ip", "link", "show", "dev", veth], capture_output=True).returncode == 0
        route = subprocess.run(
            netns.enter(env.runtime.network, ["ip", "route", "show", "default"]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if expected == "kernel":
            assert on_host and f"dev {kernelpath.INSIDE_DEVICE}" in route, route
            into, forward, nat = kernelpath.chain_names(short)
            assert f"-A INPUT -i {veth} -j {into}" in _host_chain(env, "filter", "INPUT")
            assert f"-i {veth} -m addrtype --dst-type LOCAL" in _host_chain(env, "filter", forward)
            assert "MASQUERADE" in _host_chain(env, "nat", nat)
        else:
            assert not on_host and f"dev {netns.UPLINK_DEVICE}" in route, route
    listed = e2e.rdc("repo", "list", "m1", "-o", "wide")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    column = header.split().index("NET")
    refs = (e2e.alpha.repo.ref, e2e.beta.repo.ref)
    assert [row.split()[column] for row in rows if row.split()[0] in refs] == [expected] * 2, listed.stdout


# Outside the machine: a network the host routes through a gateway (a namespace standing for the
# next router, 198.51.100.0/30), with a server on 203.0.113.1 (both documentation networks).
OUTSIDE, OUTSIDE_LINK = "203.0.113.1", ("198.51.100.1", "198.51.100.2")


@pytest.fixture
def outside() -> Iterator[int]:
    """The port of the outside server (on OUTSIDE)."""
    tag = os.getpid() % 10000
    space, link = f"rdc-e2e-out{tag}", f"rdcout{tag}"
    server = (
        "import socket\n"
        f"s = socket.create_server(({OUTSIDE!r}, 0)); print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.recv(65536)\n"
        f"    c.sendall(b'HTTP/1.0 200 OK\\r\\nContent-Length: {len(TOKEN)}\\r\\n\\r\\n{TOKEN}'); c.close()\n"
    )
    steps = [
        ["ip", "netns", "add", space],
        ["ip", "link", "add", link, "type", "veth", "peer", "name", "up0", "netns", space],
        ["ip", "addr", "add", f"{OUTSIDE_LINK[0]}/30", "dev", link],
        ["ip", "link", "set", link, "up"],
        ["ip", "-n", space, "addr", "add", f"{OUTSIDE_LINK[1]}/30", "dev", "up0"],
        ["ip", "-n", space, "addr", "add", f"{OUTSIDE}/32", "dev", "lo"],
        ["ip", "-n", space, "link", "set", "up0", "up"],
        ["ip", "-n", space, "link", "set", "lo", "up"],
        ["ip", "-n", space, "route", "add", "default", "via", OUTSIDE_LINK[0]],
        ["ip", "route", "add", f"{OUTSIDE}/32", "via", OUTSIDE_LINK[1]],
    ]
    process = None
    try:
        for step in steps:
            subprocess.run(step, check=True)
        process = subprocess.Popen(
            ["ip", "netns", "exec", space, "python3", "-c", server], stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        yield int(process.stdout.readline())
    finally:
        if process is not None:
            process.kill()
            process.wait()
        subprocess.run(["ip", "route", "del", f"{OUTSIDE}/32"], check=False)
        subprocess.run(["ip", "link", "del", link], check=False)
        subprocess.run(["ip", "netns", "del", space], check=False)


def test_a_container_and_the_daemon_reach_the_outside(e2e: E2E, outside: int) -> None:
    """The control of every refusal here: what is neither the host nor another repo answers, on
    either path out."""
    port = outside
    net = _network(e2e.alpha, "probe-out")
    try:
        assert TOKEN in _fetch(e2e.alpha, net, OUTSIDE, port)
        assert TOKEN in _fetch(e2e.alpha, "bridge", OUTSIDE, port)
    finally:
        e2e.alpha.docker("network", "rm", net)
    fetched = f"/images/create?fromSrc=http://{OUTSIDE}:{port}/x.tar&repo=o&tag=1"
    _status, answer = docker_api(e2e.alpha.daemon, "POST", fetched)
    assert "Importing" in str(answer), answer  # read whole (the page is no image: that it came is the point)


def test_a_container_reaches_neither_another_repos_namespace_nor_its_veth(e2e: E2E) -> None:
    """On the kernel path each namespace has an address on the host's side: another repo's is
    refused (its namespace end, and its host end, an address of the host's own)."""
    if _path(e2e.beta) != "kernel":
        pytest.skip("the user path gives a namespace no address the host routes to")
    found = layout.path_of(e2e.beta.runtime.network)
    assert found is not None and found[1] is not None
    at = found[1]
    server = (
        "import socket\n"
        "s = socket.create_server(('0.0.0.0', 0)); print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.recv(65536)\n"
        f"    c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\n{TOKEN}'); c.close()\n"
    )
    inside = subprocess.Popen(
        netns.enter(e2e.beta.runtime.network, ["python3", "-c", server]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert inside.stdout is not None
        port = int(inside.stdout.readline())
        assert TOKEN in _fetch(e2e.beta, "bridge", at.inside, port)  # control: beta's own containers
        for address in (at.inside, at.host):
            assert TOKEN not in _fetch(e2e.alpha, "bridge", address, port), address
    finally:
        inside.kill()
        inside.wait()


_ECHO = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))\n"
    "print(s.getsockname()[1], flush=True)\n"
    "while True:\n"
    "    d, a = s.recvfrom(2048); s.sendto(b'echo:' + d, a)\n"
)
_HEAR = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', int(sys.argv[1])))\n"
    "s.settimeout(float(sys.argv[2]))\n"
    "try:\n"
    "    print(s.recvfrom(2048)[0].decode(), flush=True)\n"
    "except TimeoutError:\n"
    "    print('nothing', flush=True)\n"
)
# A UDP packet written whole (IP header included), its source forged: what a container with
# NET_RAW (in Docker's default set, which the gate leaves) can send.
_FORGE = (
    "import socket, struct, sys\n"
    "src, sport, dst, dport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])\n"
    "data = b'forged'; udp = struct.pack('!HHHH', sport, dport, 8 + len(data), 0) + data\n"
    "ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,\n"
    "                 socket.inet_aton(src), socket.inet_aton(dst))\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)\n"
    "s.sendto(ip + udp, (dst, 0))\n"
)
_ASK = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)\n"
    "s.sendto(b'plain', (sys.argv[1], int(sys.argv[2]))); print(s.recvfrom(2048)[0].decode())\n"
)


def _forged_reaches_beta(e2e: E2E, echo_port: int, beta_inside: str, beta_port: int) -> str:
    """What beta's listener hears after alpha's namespace sends the outside echo a packet with
    beta's address as its source (the echo answers whoever the source says)."""
    hear = subprocess.Popen(
        netns.enter(e2e.beta.runtime.network, ["python3", "-c", _HEAR, str(beta_port), "3"]),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    forge = ["python3", "-c", _FORGE, beta_inside, str(beta_port), OUTSIDE, str(echo_port)]
    subprocess.run(netns.enter(e2e.alpha.runtime.network, forge), check=True)
    out, _ = hear.communicate(timeout=10)
    return out.strip()


def test_a_forged_source_from_one_repo_never_reaches_another_repos_namespace(e2e: E2E, outside: int) -> None:
    """A packet from alpha's namespace claiming beta's address is masqueraded to alpha's own
    inside the namespace, and dropped by the host's chains should it get past, and beta's
    namespace takes in no connection it did not start: the outside's answer never reaches beta.
    Control: without all three, it does."""
    if _path(e2e.beta) != "kernel":
        pytest.skip("the user path gives a namespace no address the host routes to")
    alpha_at, beta_at = layout.path_of(e2e.alpha.runtime.network), layout.path_of(e2e.beta.runtime.network)
    assert alpha_at is not None and alpha_at[1] is not None and beta_at is not None and beta_at[1] is not None
    space = f"rdc-e2e-out{os.getpid() % 10000}"  # the outside fixture's
    echo = subprocess.Popen(
        ["ip", "netns", "exec", space, "python3", "-c", _ECHO, OUTSIDE], stdout=subprocess.PIPE
    )
    short = e2e.alpha.runtime.network.short
    host_drop = [kernelpath.chain_names(short)[1], "-i", kernelpath.veth_name(short)]
    host_drop += ["!", "-s", f"{alpha_at[1].inside}/32", "-j", "DROP"]
    inside_masq = ["-t", "nat", "POSTROUTING", "-o", kernelpath.INSIDE_DEVICE, "-j", "MASQUERADE"]
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        asked = subprocess.run(
            netns.enter(e2e.alpha.runtime.network, ["python3", "-c", _ASK, OUTSIDE, str(port)]),
            capture_output=True,
            text=True,
            check=False,
        )
        assert asked.stdout.strip() == "echo:plain", asked.stderr  # control: alpha's own source is answered
        assert _forged_reaches_beta(e2e, port, beta_at[1].inside, 5399) == "nothing"
        # Control: both layers lifted, the same packet reaches beta (the hole this closes).
        subprocess.run(["iptables", "-D", *host_drop], check=True)
        raw_drop = [kernelpath.raw_chain(short), "!", "-s", f"{alpha_at[1].inside}/32", "-j", "DROP"]
        subprocess.run(["iptables", "-t", "raw", "-D", *raw_drop], check=True)
        lift = ["iptables", *inside_masq[:2], "-D", *inside_masq[2:]]
        subprocess.run(netns.enter(e2e.alpha.runtime.network, lift), check=True)
        subprocess.run(
            netns.enter(e2e.beta.runtime.network, ["iptables", "-t", "mangle", "-F", "PREROUTING"]),
            check=True,
        )
        # (another source port: the first packet's conntrack entry keeps its masquerade)
        assert _forged_reaches_beta(e2e, port, beta_at[1].inside, 5398) == "echo:forged"
    finally:
        echo.kill()
        echo.wait()
        kernelpath.apply(short, alpha_at[1], netns.host_destinations())
        restore = ["sh", "-c", kernelpath.inside_rules()]
        subprocess.run(netns.enter(e2e.alpha.runtime.network, restore), check=True)
        subprocess.run(netns.enter(e2e.beta.runtime.network, restore), check=True)


HOST_ONLY, HOST_ONLY_NET = ("198.18.7.1", "198.18.7.2"), "198.18.7.0/24"


@contextlib.contextmanager
def _host_only_server() -> Iterator[tuple[str, int]]:
    """A network only the host reaches (a host-only bridge's, a VM's): its link's host end and a
    server behind it, yielded as (the host end's device, the server's port)."""
    tag = os.getpid() % 10000
    space, link = f"rdc-e2e-ho{tag}", f"hoonly{tag}"
    server = (
        "import socket\n"
        f"s = socket.create_server(({HOST_ONLY[1]!r}, 0)); print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.recv(65536)\n"
        f"    c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\n{TOKEN}'); c.close()\n"
    )
    process = None
    try:
        subprocess.run(["ip", "netns", "add", space], check=True)
        subprocess.run(
            ["ip", "link", "add", link, "type", "veth", "peer", "name", "ho0", "netns", space], check=True
        )
        subprocess.run(["ip", "addr", "add", f"{HOST_ONLY[0]}/24", "dev", link], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        subprocess.run(["ip", "-n", space, "addr", "add", f"{HOST_ONLY[1]}/24", "dev", "ho0"], check=True)
        subprocess.run(["ip", "-n", space, "link", "set", "ho0", "up"], check=True)
        process = subprocess.Popen(
            ["ip", "netns", "exec", space, "python3", "-c", server], stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        yield link, int(process.stdout.readline())
    finally:
        if process is not None:
            process.kill()
            process.wait()
        subprocess.run(["ip", "link", "del", link], check=False)
        subprocess.run(["ip", "netns", "del", space], check=False)


def test_rules_the_host_puts_before_the_repos_let_nothing_refused_through(
    e2e: E2E, host_services: list[Listener]
) -> None:
    """An operator's (or a system Docker's) rules inserted first in INPUT and FORWARD after `rdc
    repo up` accept what rdc's chains there would refuse: the refusals hold all the same (on the
    kernel path in the host's raw table, which sees every packet before them)."""
    if _path(e2e.alpha) != "kernel":  # (and on the user path the host's rules are the real host's)
        pytest.skip("on the user path nothing of a repo's passes the host's INPUT or FORWARD")
    inserted = [["INPUT", "1", "-j", "ACCEPT"]]
    with _host_only_server() as (link, port):
        inserted.append(["FORWARD", "1", "-o", link, "-j", "ACCEPT"])
        try:
            assert TOKEN in _host_get(HOST_ONLY[1], port)  # control: the host itself reaches it
            raw = kernelpath.raw_chain(e2e.alpha.runtime.network.short)
            assert _until(lambda: HOST_ONLY_NET in _host_chain(e2e.alpha, "raw", raw), RULE_DEADLINE)
            for rule in inserted:
                subprocess.run(["iptables", "-I", *rule], check=True)
            assert TOKEN not in _fetch(e2e.alpha, "bridge", HOST_ONLY[1], port)
            for listener in host_services:
                assert TOKEN not in _fetch(e2e.alpha, "bridge", listener.address, listener.port), listener
        finally:
            for rule in inserted:
                subprocess.run(["iptables", "-D", rule[0], *rule[2:]], check=False)


def test_a_reload_of_the_hosts_firewall_lets_nothing_through_and_the_watcher_writes_it_again(
    e2e: E2E, host_services: list[Listener]
) -> None:
    """The host's tables flushed under a running repo (a firewall reload without --noflush): the
    namespace's own rules still refuse the host and what only it reaches, and the port keeper's
    watcher puts the repo's chains and jumps back within seconds."""
    if _path(e2e.alpha) != "kernel":  # (and on the user path the host's rules are the real host's)
        pytest.skip("the user path has no rules on the host")
    short = e2e.alpha.runtime.network.short
    veth, into = kernelpath.veth_name(short), kernelpath.chain_names(short)[0]
    with _host_only_server() as (_link, port):
        raw = kernelpath.raw_chain(short)
        assert _until(lambda: HOST_ONLY_NET in _host_chain(e2e.alpha, "raw", raw), RULE_DEADLINE)
        for table in ("raw", "filter", "nat"):
            subprocess.run(["iptables", "-t", table, "-F"], check=True)  # the forwarding-host's only
        assert TOKEN not in _fetch(e2e.alpha, "bridge", HOST_ONLY[1], port)
        for listener in host_services:
            assert TOKEN not in _fetch(e2e.alpha, "bridge", listener.address, listener.port), listener
        assert _until(
            lambda: f"-A INPUT -i {veth} -j {into}" in _host_chain(e2e.alpha, "filter", "INPUT"),
            RULE_DEADLINE,
        )
        assert f"-A PREROUTING -i {veth} -j {raw}" in _host_chain(e2e.alpha, "raw", "PREROUTING")
        assert HOST_ONLY_NET in _host_chain(e2e.alpha, "raw", raw)
        assert "written again" in e2e.alpha.runtime.network.ports_log.read_text()


def test_the_host_drops_ipv6_to_and_from_every_repos_veth(e2e: E2E) -> None:
    if _path(e2e.alpha) != "kernel":
        pytest.skip("the user path has no veth")
    if not Path("/proc/net/if_inet6").exists():
        pytest.skip("the host has no IPv6")
    for table, chain, rule in kernelpath.IPV6_GUARD:
        listed = subprocess.run(
            ["ip6tables", "-t", table, "-S", chain], capture_output=True, text=True, check=True
        )
        assert f"-A {chain} {' '.join(rule)}" in listed.stdout.splitlines(), listed.stdout


def test_containers_take_the_uplinks_mtu_on_every_network(e2e: E2E) -> None:
    # At Docker's usual 1500 a download through the uplink runs at about half the host's rate
    # for twice the uplink's CPU (bench/netns_cost.py); a network given its own MTU keeps it.
    _network(e2e.alpha, "wide")
    made = e2e.alpha.docker("network", "create", "--opt", "com.docker.network.driver.mtu=1400", "narrow")
    assert made.returncode == 0, made.stderr
    try:
        for network, mtu in (("bridge", "65520"), ("wide", "65520"), ("narrow", "1400")):
            run = e2e.alpha.docker(
                "run", "--rm", "--network", network, IMAGE, "cat", "/sys/class/net/eth0/mtu"
            )
            assert (run.returncode, run.stdout.strip()) == (0, mtu), (network, run.stderr)
    finally:
        e2e.alpha.docker("network", "rm", "wide", "narrow")


def test_a_container_reaches_no_container_of_another_repo_by_its_address(e2e: E2E) -> None:
    net_b = _network(e2e.beta, "svc-b")
    served = e2e.beta.docker(
        "run", "-d", "--network", net_b, IMAGE, "sh", "-c",
        f"mkdir /www && echo {TOKEN} > /www/index.html && exec httpd -f -p 8080 -h /www",
    )  # fmt: skip
    assert served.returncode == 0, served.stderr
    container = served.stdout.strip()
    try:
        status, inspected = e2e.beta.daemon_api("GET", f"/containers/{container}/json")
        assert status == 200
        address = inspected["NetworkSettings"]["Networks"][net_b]["IPAddress"]
        # Control: beta's own containers reach it.
        assert TOKEN in _fetch(e2e.beta, net_b, address, 8080)
        net_a = _network(e2e.alpha, "probe-a")
        assert TOKEN not in _fetch(e2e.alpha, net_a, address, 8080)
        assert TOKEN not in _fetch(e2e.alpha, "none", address, 8080)
    finally:
        e2e.beta.docker("rm", "-f", container)
        e2e.beta.docker("network", "rm", net_b)
        e2e.alpha.docker("network", "rm", "probe-a")


def test_a_moment_without_forwards_jump_to_docker_user_lets_nothing_out(
    e2e: E2E, host_services: list[Listener]
) -> None:
    """Engine 26 takes FORWARD's jump to DOCKER-USER (where the uplink's refusals hang) out and puts
    it back, in two iptables runs, at every network a tenant creates; a packet sent in between is
    still dropped, in mangle, which dockerd never writes."""
    _, own_address = host_services
    net = _network(e2e.alpha, "jumpless")
    inside = e2e.alpha.runtime.network
    subprocess.run(netns.enter(inside, ["iptables", "-D", "FORWARD", "-j", "DOCKER-USER"]), check=True)
    try:
        assert TOKEN not in _fetch(e2e.alpha, net, own_address.address, own_address.port)
    finally:
        back = ["iptables", "-I", "FORWARD", "1", "-j", "DOCKER-USER"]
        subprocess.run(netns.enter(inside, back), check=True)
        e2e.alpha.docker("network", "rm", net)
    assert own_address.seen == []


def test_a_container_reaches_no_service_of_the_host(
    e2e: E2E, host_services: list[Listener], metadata_service: Metadata | None
) -> None:
    loopback, own_address = host_services
    if metadata_service is not None:  # control: the host itself reaches the stand-in
        with socket.create_connection((METADATA, 80), timeout=10) as control:
            control.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert TOKEN in control.makefile("rb").read().decode()
        assert len(metadata_service.seen()) == 1
    net = _network(e2e.alpha, "probe-host")
    try:
        for address, port in (
            ("127.0.0.1", loopback.port),  # the namespace's own loopback, not the host's
            (UPLINK_GATEWAY, loopback.port),  # the uplink's gateway does not lead to the host's loopback
            (own_address.address, own_address.port),  # the host's own address is rejected
            (METADATA, 80),  # the cloud metadata service (a listening stand-in on a stand-in host)
        ):
            assert TOKEN not in _fetch(e2e.alpha, net, address, port), (address, port)
    finally:
        e2e.alpha.docker("network", "rm", net)
    assert loopback.seen == [] and own_address.seen == []
    if metadata_service is not None:
        assert len(metadata_service.seen()) == 1  # the control's connection, and no container's


def test_the_daemon_itself_fetches_nothing_from_the_host(e2e: E2E, host_services: list[Listener]) -> None:
    """Straight to the daemon, past the gate: even a fetch the gate admitted leaves from the repo's
    namespace, so the host's loopback and addresses are out of its reach."""
    loopback, own_address = host_services
    targets = [
        f"http://127.0.0.1:{loopback.port}/x.tar",
        f"http://{UPLINK_GATEWAY}:{loopback.port}/x.tar",
        f"http://{own_address.address}:{own_address.port}/x.tar",
    ]
    for url in targets:
        _status, answer = docker_api(
            e2e.alpha.daemon, "POST", f"/images/create?fromSrc={url}&repo=fetched&tag=1"
        )
        assert TOKEN not in str(answer), url
    assert loopback.seen == [] and own_address.seen == []


def test_a_classic_build_adds_nothing_from_the_host(
    e2e: E2E, host_services: list[Listener], tmp_short: Path
) -> None:
    _, own_address = host_services
    (tmp_short / "Dockerfile").write_text(
        f"FROM {IMAGE}\nADD http://{own_address.address}:{own_address.port}/page /page\n"
    )
    built = e2e.alpha.docker("build", "-t", "adds:1", str(tmp_short), extra_env={"DOCKER_BUILDKIT": "0"})
    assert built.returncode != 0
    assert own_address.seen == []


@pytest.fixture
def eta(e2e: E2E) -> Iterator[RepoEnv]:
    with e2e.extra_repo("eta") as env:
        yield env


def test_repo_down_removes_the_namespace_and_its_uplink(e2e: E2E, eta: RepoEnv) -> None:
    network = eta.runtime.network
    uplink = netns.uplink_pid(network)
    path = layout.path_of(network)
    assert network.path.exists() and uplink is not None and path is not None
    published = state_file(e2e.machine.run_dir, short_id(eta.repo.id))
    assert _until(published.exists)  # the keeper's state, for the other repos' gates
    down = e2e.rdc("repo", "down", eta.repo.ref)
    assert down.returncode == 0, down.stderr
    assert not published.exists()  # nothing it published is counted any more
    assert f"network namespace {network.name}" in down.stdout + down.stderr
    assert not network.path.exists()
    assert not pids.pid_alive(uplink)
    _assert_nothing_on_the_host(network.short)
    assert layout.path_of(network) is None
    # Up again: a new namespace, and the repo works in it, on the slot its state kept.
    again = e2e.rdc("repo", "up", eta.repo.ref)
    assert again.returncode == 0, again.stderr
    assert network.path.exists()
    assert layout.path_of(network) == path
    ran = eta.docker("run", "--rm", IMAGE, "true")
    assert ran.returncode == 0, ran.stderr


def _host_chain_all(table: str) -> str:
    return subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True).stdout


def _assert_nothing_on_the_host(short: str) -> None:
    """No veth of the repo's, and no chain or jump of its in the host's raw, filter and nat tables."""
    assert subprocess.run(
        ["ip", "link", "show", "dev", kernelpath.veth_name(short)], capture_output=True
    ).returncode
    assert f"-i {kernelpath.veth_name(short)} " not in _host_chain_all("filter")  # the FORWARD ACCEPT
    for table in ("raw", "filter", "nat"):
        listed = subprocess.run(
            ["iptables", "-t", table, "-S"], capture_output=True, text=True, check=True
        ).stdout
        assert f"RDC-{short}" not in listed, listed


def test_repo_down_removes_what_a_failed_up_left_on_the_host(e2e: E2E, eta: RepoEnv) -> None:
    """A `repo up` cut short on the kernel path can leave a veth and the repo's host chains with
    no namespace and no record: `repo down` finds them by the repo's name and removes them."""
    network = eta.runtime.network
    down = e2e.rdc("repo", "down", eta.repo.ref)
    assert down.returncode == 0, down.stderr
    if not kernelpath.forwarding():
        pytest.skip("the host does not forward IPv4: no kernel path to leave anything of")
    left = kernelpath.slot(kernelpath.SLOTS - 1)
    kernelpath.apply(network.short, left, [])
    veth = kernelpath.veth_name(network.short)
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"x{network.short}"], check=True
    )
    again = e2e.rdc("repo", "down", eta.repo.ref)
    assert again.returncode == 0, again.stderr
    assert f"veth {veth}" in again.stdout + again.stderr
    _assert_nothing_on_the_host(network.short)


def test_repo_delete_removes_what_a_failed_up_left_on_the_host(e2e: E2E, eta: RepoEnv) -> None:
    """A veth and host chains left by a `repo up` cut short go with the repo at `repo delete` too
    (found by its name), so no orphan keeps a slot's addresses or rules."""
    network = eta.runtime.network
    down = e2e.rdc("repo", "down", eta.repo.ref)
    assert down.returncode == 0, down.stderr
    if not kernelpath.forwarding():
        pytest.skip("the host does not forward IPv4: no kernel path to leave anything of")
    kernelpath.apply(network.short, kernelpath.slot(kernelpath.SLOTS - 1), [])
    veth = kernelpath.veth_name(network.short)
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"x{network.short}"], check=True
    )
    gone = e2e.rdc("repo", "delete", eta.repo.ref, "--yes")
    assert gone.returncode == 0, gone.stderr
    _assert_nothing_on_the_host(network.short)


def _host_read(port: int, attempts: int = 100) -> str:
    """What 127.0.0.1:port on the host answers; "" while nothing does (polled: the port keeper
    follows the daemon's events, a moment after `docker run -d` returns)."""
    for _ in range(attempts):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := conn.recv(65536):  # to the end: the head and body may come apart
                data += chunk
            if data:
                return data.decode(errors="replace")
        threading.Event().wait(0.1)
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_published_port_answers_on_the_hosts_loopback_and_goes_with_its_container(e2e: E2E) -> None:
    port = _free_port()
    served = e2e.alpha.docker(
        "run", "-d", "-p", f"{port}:8080", IMAGE, "sh", "-c",
        f"mkdir /www && echo {TOKEN} > /www/index.html && exec httpd -f -p 8080 -h /www",
    )  # fmt: skip
    assert served.returncode == 0, served.stderr
    container = served.stdout.strip()
    try:
        keeper_log = e2e.alpha.runtime.network.ports_log
        assert TOKEN in _host_read(port), keeper_log.read_text()[-2000:]
        # Another repo's container does not reach it: the host's loopback is not on its uplink.
        assert TOKEN not in _fetch(e2e.beta, "none", UPLINK_GATEWAY, port)
        net = _network(e2e.beta, "probe-pub")
        try:
            assert TOKEN not in _fetch(e2e.beta, net, UPLINK_GATEWAY, port)
        finally:
            e2e.beta.docker("network", "rm", net)
    finally:
        e2e.alpha.docker("rm", "-f", container)
    assert _host_read(port, attempts=20) == ""  # withdrawn with its container
    assert _until(lambda: _host_port_free(port)), e2e.alpha.runtime.network.ports_log.read_text()[-2000:]


def test_a_port_published_on_one_address_inside_stays_inside(e2e: E2E) -> None:
    port = _free_port()
    served = e2e.alpha.docker("run", "-d", "-p", f"127.0.0.1:{port}:8080", IMAGE, "httpd", "-f", "-p", "8080")
    assert served.returncode == 0, served.stderr
    try:
        assert _host_read(port, attempts=20) == ""
    finally:
        e2e.alpha.docker("rm", "-f", served.stdout.strip())


# --- which host ports a repo may publish (publish-ports, publish-limit, another repo's) ------------


def _until(check: Callable[[], bool], seconds: float = 15.0) -> bool:
    """Whether `check` came true before the deadline (polled: the keeper follows events)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        threading.Event().wait(0.1)
    return check()


def _serve(env: RepoEnv, publish: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return env.docker(
        "run", "-d", *extra, "-p", publish, IMAGE, "sh", "-c",
        f"mkdir -p /www && echo {TOKEN} > /www/index.html && exec httpd -f -p 8080 -h /www",
    )  # fmt: skip


def _keeper_log(env: RepoEnv) -> str:
    return env.runtime.network.ports_log.read_text(errors="replace")


def _host_port_free(port: int, kind: int = socket.SOCK_STREAM) -> bool:
    with socket.socket(socket.AF_INET, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind, past TIME_WAIT
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_host_port_below_1024_is_refused_and_the_repo_takes_none(e2e: E2E) -> None:
    before, logged = e2e.alpha.container_ids(), len(_keeper_log(e2e.alpha))
    refused(
        _serve(e2e.alpha, "80:8080"),
        "HostConfig.PortBindings 8080/tcp: host port 80/tcp is refused",
        "publish only on host ports 1024-65535",
        "rdc machine config m1 --set publish-ports=80-65535",
    )
    refused(
        e2e.alpha.docker("run", "-d", "-p", "53:53/udp", IMAGE, "nc", "-u", "-l", "-p", "53"),
        "host port 53/udp is refused",
        "(-p 8053:53/udp)",
    )
    assert e2e.alpha.container_ids() == before  # nothing was created
    log = _keeper_log(e2e.alpha)[logged:]
    assert "127.0.0.1:80\n" not in log and "udp 127.0.0.1:53\n" not in log
    assert TOKEN not in _host_read(80, attempts=5)
    if not _host_port_free(80):
        pytest.skip("the host has a service on port 80: the control would meet it")
    # Control: the operator widens the range as the refusal says, and port 80 answers with the page.
    widened = e2e.rdc("machine", "config", "m1", "--set", "publish-ports=80-65535")
    assert widened.returncode == 0, widened.stderr
    served = None
    try:
        served = _serve(e2e.alpha, "80:8080")
        assert served.returncode == 0, served.stderr
        assert TOKEN in _host_read(80), _keeper_log(e2e.alpha)[-2000:]
    finally:
        if served is not None and served.returncode == 0:
            e2e.alpha.docker("rm", "-f", served.stdout.strip())
        e2e.rdc("machine", "config", "m1", "--unset", "publish-ports")


def test_more_host_ports_than_the_repos_limit_are_refused_naming_it(e2e: E2E) -> None:
    base = 20000 + os.getpid() % 20000  # a block of its own: other sessions may run beside this one
    before = e2e.alpha.container_ids()
    many = f"{base}-{base + 64}:{base}-{base + 64}"  # 65 ports
    refused(
        e2e.alpha.docker("create", "-p", many, IMAGE, "true"),
        "65 more host port(s) are refused: this repo publishes 0 now and may publish at most 64",
        "(publish-limit)",
        "rdc machine config m1 --set publish-limit=65",
    )
    assert e2e.alpha.container_ids() == before
    # Control: 64 pass.
    made = e2e.alpha.docker("create", "-p", f"{base}-{base + 63}:{base}-{base + 63}", IMAGE, "true")
    assert made.returncode == 0, made.stderr
    e2e.alpha.docker("rm", "-f", made.stdout.strip())


def test_a_port_another_repo_publishes_is_refused_naming_that_repo(e2e: E2E) -> None:
    port = _free_port()
    early = e2e.alpha.docker("create", "-p", f"{port}:8080", IMAGE, "httpd", "-f", "-p", "8080")
    assert early.returncode == 0, early.stderr  # created while nobody publishes the port
    served = _serve(e2e.beta, f"{port}:8080")
    assert served.returncode == 0, served.stderr
    try:
        assert TOKEN in _host_read(port), _keeper_log(e2e.beta)[-2000:]
        says = f"host port {port}/tcp is refused: repo {e2e.beta.repo.ref} publishes it now"
        refused(_serve(e2e.alpha, f"{port}:8080"), says, f"(-p {port + 1}:8080)")
        # Bound at start: a container created before beta published it does not start either.
        refused(e2e.alpha.docker("start", early.stdout.strip()), says)
        assert TOKEN in _host_read(port)  # still beta's
    finally:
        e2e.beta.docker("rm", "-f", served.stdout.strip())
        e2e.alpha.docker("rm", "-f", early.stdout.strip())


def test_a_host_port_already_taken_is_not_published_and_ports_log_says_so(e2e: E2E) -> None:
    taken = _listen("127.0.0.1")  # a host service on the port
    try:
        served = _serve(e2e.alpha, f"{taken.port}:8080")
        assert served.returncode == 0, served.stderr
        try:
            said = f"port tcp 127.0.0.1:{taken.port} not published: "
            assert _until(lambda: said in _keeper_log(e2e.alpha)), _keeper_log(e2e.alpha)[-2000:]
            before = len(taken.seen)
            # The host's service answers (its HTTP/1.0, not the container's httpd).
            assert _host_read(taken.port).startswith("HTTP/1.0 200 OK\r\nContent-Length")
            assert len(taken.seen) > before
        finally:
            e2e.alpha.docker("rm", "-f", served.stdout.strip())
    finally:
        taken.sock.close()


def test_the_keeper_withdraws_a_port_the_range_no_longer_allows(e2e: E2E) -> None:
    port = _free_port()
    served = _serve(e2e.alpha, f"{port}:8080", "--restart", "always")
    assert served.returncode == 0, served.stderr
    container = served.stdout.strip()
    try:
        assert TOKEN in _host_read(port), _keeper_log(e2e.alpha)[-2000:]
        # Narrowed under a running container: the gate saw nothing, the keeper holds it at its next event.
        set_setting(e2e.machine, "publish-ports", "1024-1034")
        e2e.alpha.docker("run", "--rm", IMAGE, "true")  # any container event
        said = f"port tcp {port} not published: outside this machine's publish-ports 1024-1034"
        assert _until(lambda: said in _keeper_log(e2e.alpha)), _keeper_log(e2e.alpha)[-2000:]
        assert _until(lambda: _host_read(port, attempts=1) == ""), _keeper_log(e2e.alpha)[-2000:]
        # The daemon's restart policy starts it again, unseen by the gate: still not published.
        subprocess.run(["kill", "-9", _main_pid(e2e.alpha, container)], check=True)
        assert _until(lambda: _restarts(e2e.alpha, container) > 0)
        assert _until(lambda: _keeper_log(e2e.alpha).count(said) == 2), _keeper_log(e2e.alpha)[-2000:]
        assert _host_read(port, attempts=20) == ""
        # Control: widened again, the keeper publishes it at its next event.
        unset_setting(e2e.machine, "publish-ports")
        e2e.alpha.docker("run", "--rm", IMAGE, "true")
        assert TOKEN in _host_read(port), _keeper_log(e2e.alpha)[-2000:]
    finally:
        unset_setting(e2e.machine, "publish-ports")
        e2e.alpha.docker("rm", "-f", container)


def _main_pid(env: RepoEnv, container: str) -> str:
    found = env.docker("inspect", "-f", "{{.State.Pid}}", container)
    assert found.returncode == 0, found.stderr
    return found.stdout.strip()


def _restarts(env: RepoEnv, container: str) -> int:
    found = env.docker("inspect", "-f", "{{.RestartCount}} {{.State.Running}}", container)
    count, running = found.stdout.split()
    return int(count) if running == "true" else 0


# Addresses the host gains while the repos are up: a bridge of a system Docker, libvirt or a VPN
# started later. 198.18.0.0/15 and 2001:db8::/32 are for benchmarks and documentation: no real network.
LATE_V4, LATE_NET, LATE_V4_MORE = "198.18.5.1", "198.18.5.0/24", "198.18.5.2"
LATE_V6 = "2001:db8:5::1"
RULE_DEADLINE = 10.0  # seconds for the port keeper's watcher to write the rules after a change


@contextlib.contextmanager
def _late_bridge() -> Iterator[str]:
    name = f"br-late{os.getpid() % 10000}"
    try:
        subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{LATE_V4}/24", "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


def _lift_refusal(env: RepoEnv) -> None:
    """Take away what refuses the late address to `env` (a control): the uplink rules inside, the
    filter chain's and mangle's (for tap0 on the user path, kpath0 on the kernel path), and on the
    kernel path the host's refusals of it, each turned into an ACCEPT in place (as many rules as
    before: the watcher's look at the host's rules finds nothing missing, and mends them only at
    the host's next change, which writes the whole rule set again)."""
    kernel = _path(env) == "kernel"
    device = kernelpath.INSIDE_DEVICE if kernel else netns.UPLINK_DEVICE
    for cidr in (f"{LATE_V4}/32", LATE_NET):
        rule = ["-D", netns.CHAIN, "-o", device, "-d", cidr, "-j", "REJECT"]
        rule += ["--reject-with", "icmp-admin-prohibited"]
        subprocess.run(netns.enter(env.runtime.network, ["iptables", *rule]), check=True)
        guard = ["-t", "mangle", "-D", netns.GUARD, "-o", device, "-d", cidr, "-j", "DROP"]
        subprocess.run(netns.enter(env.runtime.network, ["iptables", *guard]), check=True)
    if not kernel:
        return
    short = env.runtime.network.short
    late = ("--dst-type LOCAL", f"-d {LATE_V4}/32 ", f"-d {LATE_NET} ")
    for table, chain in (("raw", kernelpath.raw_chain(short)), ("filter", kernelpath.chain_names(short)[0])):
        rules = [line for line in _host_chain(env, table, chain).splitlines() if line.startswith("-A ")]
        for number, line in enumerate(rules, start=1):
            if any(mark in line + " " for mark in late) or line.endswith("icmp-admin-prohibited"):
                match = line.split(" -j ")[0].split()[2:]
                subprocess.run(
                    ["iptables", "-t", table, "-R", chain, str(number), *match, "-j", "ACCEPT"], check=True
                )


def _uplink_rules(env: RepoEnv) -> str:
    listed = subprocess.run(
        netns.enter(env.runtime.network, ["iptables", "-S", netns.CHAIN]),
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout


def _await_refused(env: RepoEnv, *cidrs: str) -> None:
    """Until the namespace's uplink rules refuse each of `cidrs` (the watcher follows the host's
    changes a moment after the kernel announces them)."""
    deadline = time.monotonic() + RULE_DEADLINE
    while True:
        rules = _uplink_rules(env)
        if all(f"-d {cidr} " in rules for cidr in cidrs):
            return
        assert time.monotonic() < deadline, (cidrs, rules, env.runtime.network.ports_log.read_text()[-2000:])
        time.sleep(0.05)


def _host_get(address: str, port: int) -> str:
    """What the host itself reads from address:port, retried until the deadline: an IPv6 address
    is usable a moment after `ip addr add` returns (the kernel adds its local route from a work
    queue)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    deadline = time.monotonic() + RULE_DEADLINE
    while True:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as conn:
                conn.settimeout(5)
                conn.connect((address, port))
                conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
            return data.decode(errors="replace")
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _listen6(address: str) -> Listener:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.listen(16)
    listener = Listener(address, sock)
    threading.Thread(target=listener.serve, daemon=True).start()
    return listener


class BuildsRead(tuple[bool, bool]):
    """Whether the classic and the BuildKit build read the listener, with what each printed: an
    assertion on it shows the builds' own words when it fails."""

    said: str = ""

    def __repr__(self) -> str:
        return f"{tuple(self)!r} (the builds said: {self.said})"


def _builds_read(env: RepoEnv, context: Path, address: str, port: int) -> BuildsRead:
    """Whether a classic build and a BuildKit build exported with `--output type=local` got
    `ADD http://address:port/x` (the listener's TOKEN)."""
    (context / "Dockerfile").write_text(f"FROM {IMAGE}\nADD http://{address}:{port}/x /x\n")
    classic = env.docker("build", "-t", "late:1", str(context), extra_env={"DOCKER_BUILDKIT": "0"})
    env.docker("rmi", "-f", "late:1")
    exported = context.parent / f"out-{time.monotonic_ns()}"
    kit = env.docker("build", "--output", f"type=local,dest={exported}", str(context), timeout=300)
    got = exported / "x"
    read = BuildsRead((classic.returncode == 0, got.exists() and TOKEN in got.read_text()))
    read.said = f"classic: {classic.stderr[-600:]!r}; buildkit ({kit.returncode}): {kit.stderr[-1500:]!r}"
    read.said += f"; the uplink rules after: {_uplink_rules(env)!r}; the keeper's log: "
    read.said += repr(env.runtime.network.ports_log.read_text()[-1500:])
    return read


def test_an_address_the_host_gains_after_up_is_refused_to_containers_and_builds(
    e2e: E2E, tmp_short: Path
) -> None:
    context = tmp_short / "ctx"
    context.mkdir()
    with _late_bridge() as bridge:
        late = _listen(LATE_V4)
        try:
            assert TOKEN in _host_get(LATE_V4, late.port)  # control: the host itself reaches it
            late.seen.clear()
            _await_refused(e2e.alpha, f"{LATE_V4}/32", LATE_NET)
            net = _network(e2e.alpha, "probe-late")
            try:
                said = _fetch(e2e.alpha, net, LATE_V4, late.port)
                assert TOKEN not in said and "can't connect" in said, said
                assert _builds_read(e2e.alpha, context, LATE_V4, late.port) == (False, False)
                assert late.seen == []
                # Control: the rules are what stops them. Without them the container and both
                # builds read the listener; the host's next change writes the whole chain again.
                _lift_refusal(e2e.alpha)
                assert TOKEN in _fetch(e2e.alpha, net, LATE_V4, late.port)
                assert _builds_read(e2e.alpha, context, LATE_V4, late.port) == (True, True)
                subprocess.run(["ip", "addr", "add", f"{LATE_V4_MORE}/32", "dev", bridge], check=True)
                _await_refused(e2e.alpha, f"{LATE_V4}/32", LATE_NET, f"{LATE_V4_MORE}/32")
                if _path(e2e.alpha) == "kernel":  # the watcher writes the repo's host rules whole again
                    raw = kernelpath.raw_chain(e2e.alpha.runtime.network.short)
                    assert _until(
                        lambda: f"-d {LATE_V4_MORE}/32 " in _host_chain(e2e.alpha, "raw", raw), RULE_DEADLINE
                    )
                    assert "ACCEPT" not in _host_chain(e2e.alpha, "raw", raw)
                late.seen.clear()
                assert TOKEN not in _fetch(e2e.alpha, net, LATE_V4, late.port)
                assert late.seen == []
            finally:
                e2e.alpha.docker("network", "rm", net)
        finally:
            late.sock.close()


def test_an_ipv6_address_the_host_gains_is_out_of_reach_since_the_uplink_carries_no_ipv6(e2e: E2E) -> None:
    with _late_bridge() as bridge:
        subprocess.run(["ip", "addr", "add", f"{LATE_V6}/64", "dev", bridge, "nodad"], check=True)
        late = _listen6(LATE_V6)
        try:
            assert TOKEN in _host_get(LATE_V6, late.port)  # control: the host itself reaches it
            late.seen.clear()
            said = _fetch(e2e.alpha, "bridge", LATE_V6, late.port)
            assert TOKEN not in said and "unreachable" in said.lower(), said
            # Nor does the daemon: its namespace has no IPv6 route out at all.
            route = subprocess.run(
                netns.enter(e2e.alpha.runtime.network, ["ip", "-6", "route", "get", LATE_V6]),
                capture_output=True,
                text=True,
            )
            assert route.returncode != 0 and "unreachable" in route.stderr.lower(), route
            assert late.seen == []
        finally:
            late.sock.close()


def test_repo_up_starts_a_port_keeper_that_died_again_and_its_watcher_follows_the_host(
    e2e: E2E, eta: RepoEnv
) -> None:
    """While no keeper runs, the rules stay as last written; `rdc repo up` starts one again (the
    daemon still runs), and it writes the rules from the host as it is then and follows it."""
    network = eta.runtime.network
    keeper = netns.ports_pid(network)
    assert keeper is not None
    os.kill(keeper, signal.SIGKILL)
    deadline = time.monotonic() + RULE_DEADLINE
    while netns.ports_pid(network) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with _late_bridge() as bridge:
        assert f"-d {LATE_V4}/32 " not in _uplink_rules(eta)  # nobody follows the host now
        again = e2e.rdc("repo", "up", eta.repo.ref)
        assert again.returncode == 0, again.stderr
        assert netns.ports_pid(network) not in (None, keeper)
        _await_refused(eta, f"{LATE_V4}/32", LATE_NET)
        subprocess.run(["ip", "addr", "add", f"{LATE_V4_MORE}/32", "dev", bridge], check=True)
        _await_refused(eta, f"{LATE_V4_MORE}/32")
