"""A repo namespace's kernel path out: a veth pair routed and masqueraded by the host, where the
host already forwards IPv4 (`/proc/sys/net/ipv4/ip_forward` = 1; rdc never turns it on).

The user path (slirp4netns, `netns`) copies every byte twice through user space; this path is the
kernel's own forwarding, as Docker's and Podman's (netavark) bridges are. Each repo gets:

- a slot of RANGE (a /30: the host end's address, the namespace end's), chosen so no two repos of the
  machine share one and none overlaps a network the host reaches directly; kept in the repo's state
  directory (`net-slot.json`), so it survives restarts, and freed when the repo is deleted (the next
  allocation drops leases of repos that are gone);
- a veth pair, `rdc<12 of ID>` on the host, INSIDE_DEVICE in the namespace, IPv6 off on both ends;
- in the host's iptables, chains of its own (`RDC-<12 of ID>-RAW/-IN/-FWD/-NAT`), jumped to only
  for its veth and its address (`jumps`):
  - RAW (raw PREROUTING, before any filter rule and the host's DNAT, so the host's rules added
    first later change nothing) drops from the veth a forged source, the host's own addresses
    (`addrtype LOCAL`), RANGE (every other repo) and `netns.blocked_destinations`;
  - IN drops a forged source and rejects the rest that comes for the host itself;
  - FWD drops a forged source and rejects what RAW drops (a refusal that answers at once); into the
    veth it lets only replies (conntrack ESTABLISHED/RELATED); what is left of the veth's goes on
    to an ACCEPT appended last in FORWARD, after the host's own rules;
  - NAT masquerades the namespace end's address for what leaves to the outside;
- inside the namespace (`inside_rules`, and `netns.uplink_rules` for kpath0): all that leaves by
  INSIDE_DEVICE masqueraded to its address, INVALID dropped, nothing but replies taken in, the
  same refusals again. `uplinkwatch` writes the list again at each change of the host's addresses
  and routes, and every few seconds mends the host's chains and jumps should a reload take them
  (`intact`).

slirp4netns still runs beside it, unconfigured as a route (`netns`): it carries the published ports
(the port keeper's forwards) and the DNS forwarder only; the namespace's default route is the veth.

Pure parts (`slot`, `free_slot`, `host_rules`, `raw_rules`, `jumps`, `missing_jumps`, `intact`,
`choose`) are separate
from the commands that apply them, so the allocation and the rule set are tested without root.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rediacc_core.errors import StateError, ToolError

RANGE = ipaddress.IPv4Network("10.199.0.0/16")
SLOT_PREFIX = 30
SLOTS = 2 ** (SLOT_PREFIX - RANGE.prefixlen)
INSIDE_DEVICE = "kpath0"
LEASE = "net-slot.json"
FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")
PATHS = ("auto", "kernel", "user")
KERNEL, USER = "kernel", "user"
TABLES = ("raw", "filter", "nat")
_REJECT = ["-j", "REJECT", "--reject-with", "icmp-admin-prohibited"]


@dataclass(frozen=True)
class Slot:
    """One repo's /30 of RANGE: `host` is the host end's address, `inside` the namespace end's."""

    index: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        first = int(RANGE.network_address) + self.index * 2 ** (32 - SLOT_PREFIX)
        return ipaddress.IPv4Network((first, SLOT_PREFIX))

    @property
    def host(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def inside(self) -> str:
        return str(self.network.network_address + 2)


def slot(index: int) -> Slot:
    if not 0 <= index < SLOTS:
        raise ValueError(f"slot {index} is outside {RANGE} (0 to {SLOTS - 1})")
    return Slot(index)


def free_slot(taken: Collection[int], host_networks: Iterable[str], start: int = 0) -> Slot:
    """The first slot from `start` on (wrapping round) that no repo holds (`taken`) and that
    overlaps none of `host_networks` (the networks the host reaches directly) more specific than
    RANGE. Every one of them counts, a /30 too: a veth of a repo whose lease was lost, or anything
    else's, is in the way all the same (the caller leaves out only the repo's own veth's)."""
    foreign = []
    for cidr in host_networks:
        network = ipaddress.ip_network(cidr)
        if network.prefixlen >= RANGE.prefixlen and network.overlaps(RANGE):
            foreign.append(network)
    for step in range(SLOTS):
        index = (start + step) % SLOTS
        candidate = Slot(index)
        if index not in taken and not any(candidate.network.overlaps(n) for n in foreign):
            return candidate
    raise StateError(
        f"no free address pair left in {RANGE} for a repo's kernel path",
        "delete the repos no longer used (see rdc repo list --all), or set this machine's net-path "
        "to user (its NAME: rdc machine list): rdc machine config NAME --set net-path=user",
    )


def choose(setting: str, forwarding: bool, recorded: str | None = None) -> str:
    """The path a repo's namespace takes: the one it was brought up with while its namespace lives
    (`recorded`), else the setting's; `auto` is the kernel path where the host forwards IPv4."""
    if recorded in (KERNEL, USER):
        return recorded
    if setting == USER or (setting == "auto" and not forwarding):
        return USER
    if not forwarding:
        raise StateError(
            "net-path is kernel, but this host does not forward IPv4 (/proc/sys/net/ipv4/ip_forward "
            "is 0), and rdc does not turn forwarding on",
            "turn it on yourself (sysctl -w net.ipv4.ip_forward=1, as Docker's own daemon does), or let "
            "repos take the user path here (its NAME: rdc machine list): "
            "rdc machine config NAME --unset net-path",
        )
    return KERNEL


def veth_name(short: str) -> str:
    return f"rdc{short}"  # 15 characters, the kernel's longest interface name


def chain_names(short: str) -> tuple[str, str, str]:
    return f"RDC-{short}-IN", f"RDC-{short}-FWD", f"RDC-{short}-NAT"


def host_rules(short: str, at: Slot, blocked: Sequence[str]) -> tuple[str, str]:
    """iptables-restore input (for `--noflush`) of the filter and the nat table: each of the repo's
    chains made empty and filled in one step, so no packet meets half a rule set."""
    veth = veth_name(short)
    into, forward, nat = chain_names(short)
    filt = ["*filter", f":{into} - [0:0]", f":{forward} - [0:0]"]
    # A source other than the namespace end's is forged (a container with NET_RAW, Docker's
    # default): dropped first, silently (no ICMP to the forged source), before any rule that could
    # let it out or through another repo's masquerade.
    filt.append(f"-A {into} ! -s {at.inside}/32 -j DROP")
    filt.append(" ".join(["-A", into, *_REJECT]))
    filt.append(f"-A {forward} -i {veth} ! -s {at.inside}/32 -j DROP")
    filt.append(f"-A {forward} -o {veth} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    filt.append(" ".join(["-A", forward, "-o", veth, *_REJECT]))
    out = ["-A", forward, "-i", veth]
    filt.append(" ".join([*out, "-m", "addrtype", "--dst-type", "LOCAL", *_REJECT]))
    filt += [" ".join([*out, "-d", cidr, *_REJECT]) for cidr in [str(RANGE), *blocked]]
    filt += ["COMMIT", ""]  # what is left returns to FORWARD: its ACCEPT is a jump appended last
    nat_rules = [
        "*nat",
        f":{nat} - [0:0]",
        f"-A {nat} -s {at.inside}/32 ! -d {RANGE} -j MASQUERADE",
        "COMMIT",
        "",
    ]
    return "\n".join(filt), "\n".join(nat_rules)


def raw_chain(short: str) -> str:
    return f"RDC-{short}-RAW"


def raw_rules(short: str, at: Slot, blocked: Sequence[str]) -> str:
    """iptables-restore input of the raw table: the refusals again, where no rule of the host's
    comes before them (raw PREROUTING is the first look at a packet, before the host's DNAT and
    any ACCEPT of its filter's, however they are ordered later). Dropped, since raw cannot reject:
    the filter chains' REJECTs answer first what is not forged, on a host whose rules are as rdc
    wrote them."""
    chain = raw_chain(short)
    lines = ["*raw", f":{chain} - [0:0]", f"-A {chain} ! -s {at.inside}/32 -j DROP"]
    lines.append(f"-A {chain} -m addrtype --dst-type LOCAL -j DROP")  # DNAT'd host services too
    lines += [f"-A {chain} -d {cidr} -j DROP" for cidr in [str(RANGE), *blocked]]
    return "\n".join([*lines, "COMMIT", ""])


def inside_rules() -> str:
    """`sh` commands, run inside the namespace, that add (once) its own half of the refusal of
    forged sources: everything leaving through INSIDE_DEVICE is masqueraded to the namespace end's
    address, whatever source a container wrote, and what conntrack finds INVALID (no connection it
    could map back) is dropped there, in `mangle`, which the repo's dockerd never writes."""
    rules = [
        ("nat", "POSTROUTING", f"-o {INSIDE_DEVICE} -j MASQUERADE"),
        ("mangle", "POSTROUTING", f"-o {INSIDE_DEVICE} -m conntrack --ctstate INVALID -j DROP"),
        # Nothing from the host's side starts a connection in, whatever the host's rules are then.
        ("mangle", "PREROUTING", f"-i {INSIDE_DEVICE} -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"),
    ]
    return " && ".join(
        f"{{ iptables -t {table} -C {chain} {rule} 2>/dev/null || iptables -t {table} -I {chain} 1 {rule}; }}"
        for table, chain, rule in rules
    )


# IPv6 is off on both ends of every veth; these drop it at the host all the same, for every rdc
# veth at once (`rdc+`), should a veth's IPv6 come back on. Shared by all repos: never removed.
IPV6_GUARD = (
    ("raw", "PREROUTING", ["-i", "rdc+", "-j", "DROP"]),
    ("filter", "FORWARD", ["-o", "rdc+", "-j", "DROP"]),
)


def _guard_ipv6() -> None:
    """IPV6_GUARD in the host's ip6tables, each rule once; nothing where the host has no IPv6."""
    if shutil.which("ip6tables") is None or not Path("/proc/net/if_inet6").exists():
        return
    for table, chain, rule in IPV6_GUARD:
        if not _ok(["ip6tables", "-t", table, "-C", chain, *rule]):
            _run(["ip6tables", "-t", table, "-I", chain, "1", *rule])


def jumps(short: str, at: Slot) -> list[tuple[str, str, list[str]]]:
    """(table, built-in chain, rule) of each jump to the repo's chains: only its veth's packets and
    its address's go there, so no other traffic of the host passes through them."""
    veth = veth_name(short)
    into, forward, nat = chain_names(short)
    return [
        ("raw", "PREROUTING", ["-i", veth, "-j", raw_chain(short)]),
        ("filter", "INPUT", ["-i", veth, "-j", into]),
        ("filter", "FORWARD", ["-i", veth, "-j", forward]),
        ("filter", "FORWARD", ["-o", veth, "-j", forward]),
        ("nat", "POSTROUTING", ["-s", f"{at.inside}/32", "-j", nat]),
        ("filter", "FORWARD", ["-i", veth, "-j", "ACCEPT"]),  # appended: the host's rules come first
    ]


# --- state: the repo's lease ---------------------------------------------------------------------


def _lease_of(state_dir: Path) -> int | None:
    """The slot `state_dir` holds, when its lease is its own (a fork's copy of another repo's
    state names that repo, not itself, and holds nothing)."""
    try:
        held = json.loads((state_dir / LEASE).read_text())
        index = int(held["slot"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return index if held.get("repo") == state_dir.name and 0 <= index < SLOTS else None


def allocate(state_dir: Path, known: Collection[str], host_networks: Iterable[str]) -> Slot:
    """The repo's slot: the one its state holds, else the next free one after the slot handed out
    last, recorded there. Under a lock beside the repos' state directories, so two `rdc repo up` at
    once never take one slot; leases of repos no longer `known` (deleted) are removed, which frees
    their slots. Freed slots come round again only after every other one: the host's connection
    tracking may still hold a deleted repo's flows (an established TCP flow for days), and their
    replies must not reach a new repo given the same address soon after."""
    repos = state_dir.parent
    repos.mkdir(parents=True, exist_ok=True)
    with open(repos / ".net-slots.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = set()
        for other in sorted(repos.glob(f"*/{LEASE}")):
            if other.parent.name not in known:
                other.unlink(missing_ok=True)  # its repo was deleted: the slot is free again
                continue
            index = _lease_of(other.parent)
            if index is not None and other.parent != state_dir:
                taken.add(index)
        own = _lease_of(state_dir)
        if own is not None and own not in taken:  # a lease another repo holds too is taken anew
            return Slot(own)
        cursor = repos / ".net-slots.next"
        try:
            start = int(cursor.read_text()) % SLOTS
        except (OSError, ValueError):
            start = 0
        chosen = free_slot(taken, host_networks, start)
        cursor.write_text(f"{(chosen.index + 1) % SLOTS}\n")
        state_dir.mkdir(parents=True, exist_ok=True)
        lease = state_dir / LEASE
        lease.with_suffix(".tmp").write_text(
            json.dumps({"repo": state_dir.name, "slot": chosen.index}) + "\n"
        )
        os.replace(lease.with_suffix(".tmp"), lease)
        return chosen


def forwarding() -> bool:
    try:
        return FORWARDING.read_text().strip() == "1"
    except OSError:
        return False


# --- commands ------------------------------------------------------------------------------------


def _run(argv: Sequence[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolError(
            f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout.strip()}",
            "run rdc repo up as root with iproute2 and iptables installed, or set this machine's "
            "net-path to user (its NAME: rdc machine list): rdc machine config NAME --set net-path=user",
        )


def _ok(argv: Sequence[str]) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _has_link(name: str) -> bool:
    """Whether this network namespace has interface `name` (/proc/net/dev is the caller's own)."""
    lines = Path("/proc/net/dev").read_text().splitlines()[2:]
    return any(line.split(":", 1)[0].strip() == name for line in lines)


def set_up(
    namespace: str,
    short: str,
    at: Slot,
    mtu: int,
    enter: Sequence[str],
    inside_too: Sequence[str] = (),
) -> None:
    """The veth pair, its addresses and the namespace's default route through it; idempotent. The
    host's rules (`apply`) must be written before (`netns.bring_up` does, in `netns.apply_rules`):
    the link comes up here, so nothing passes it unruled. `enter` runs a command inside the
    namespace, where `inside_too` (`ip -batch` lines) is done in the same step. A handful of
    commands in all: each costs a repo's start some milliseconds."""
    veth = veth_name(short)
    if not _has_link(veth):
        peer = ["peer", "name", INSIDE_DEVICE, "mtu", str(mtu), "netns", namespace]  # made inside: no clash
        _run(["ip", "link", "add", veth, "mtu", str(mtu), "type", "veth", *peer])
    # No IPv6 on either end: the host would answer it on its own addresses, past the IPv4 rules.
    ipv6 = Path(f"/proc/sys/net/ipv6/conf/{veth}/disable_ipv6")
    if ipv6.exists():  # absent where the kernel runs without IPv6 at all
        ipv6.write_text("1\n")
    _guard_ipv6()
    _run(["ip", "-batch", "-"], f"addr replace {at.host}/{SLOT_PREFIX} dev {veth}\nlink set {veth} up\n")
    inside = [
        f"addr replace {at.inside}/{SLOT_PREFIX} dev {INSIDE_DEVICE}",
        f"link set {INSIDE_DEVICE} up",
        f"route replace default via {at.host} dev {INSIDE_DEVICE}",
        *inside_too,
    ]
    knob = f"/proc/sys/net/ipv6/conf/{INSIDE_DEVICE}/disable_ipv6"
    ipv6_off = f"{{ [ ! -e {knob} ] || echo 1 > {knob}; }}"
    script = f"{ipv6_off} && {inside_rules()} && exec ip -batch -"
    _run([*enter, "sh", "-c", script], "\n".join(inside) + "\n")


def apply(short: str, at: Slot, blocked: Sequence[str]) -> None:
    """Write the repo's chains and whichever of its jumps is missing, atomically per table (one
    iptables-restore; the jumps are looked up in one `iptables-save`)."""
    filt, nat = host_rules(short, at, blocked)
    raw = raw_rules(short, at, blocked)
    missing = missing_jumps(saved(), short, at)
    _run(
        ["iptables-restore", "--noflush"],
        with_lines(raw, missing["raw"])
        + with_lines(filt, missing["filter"])
        + with_lines(nat, missing["nat"]),
    )


def tables_of(saved: str) -> dict[str, str]:
    """`iptables-save` output split per table: each table's rule lines, as `iptables -S` lists them."""
    tables: dict[str, list[str]] = {}
    current: list[str] = []
    for line in saved.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], [])
        elif line.startswith(("-A ", ":")):
            current.append(line)
    return {table: "\n".join(lines) + "\n" for table, lines in tables.items()}


def intact(have: Mapping[str, str], short: str, at: Slot, blocked: Sequence[str]) -> bool:
    """Whether `have` (`tables_of` the host's `iptables-save`) holds every jump of the repo's and
    its chains with as many rules as `host_rules` and `raw_rules` write: false after a reload of the
    host's firewall (iptables-restore without --noflush, `iptables -F`), which the watcher mends."""
    if any(missing_jumps(have, short, at).values()):
        return False
    filt, nat = host_rules(short, at, blocked)
    wanted = {"filter": filt, "nat": nat, "raw": raw_rules(short, at, blocked)}
    for table, text in wanted.items():
        listed = have.get(table, "").splitlines()
        for chain in (line[1:].split()[0] for line in text.splitlines() if line.startswith(":")):
            count = sum(line.startswith(f"-A {chain} ") for line in text.splitlines())
            if sum(line.startswith(f"-A {chain} ") for line in listed) != count:
                return False
    return True


def saved() -> dict[str, str]:
    """The host's rules now, per table (one `iptables-save`). A failed save raises: read as no
    rules at all, every jump would look missing and be added again, a duplicate each time."""
    try:
        done = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ToolError(f"cannot run iptables-save: {exc.strerror}", "install iptables") from exc
    if done.returncode != 0:
        raise ToolError(
            f"iptables-save failed: {done.stderr.strip() or done.stdout.strip()}",
            "run rdc as root with iptables installed",
        )
    return tables_of(done.stdout)


def missing_jumps(have: Mapping[str, str], short: str, at: Slot) -> dict[str, list[str]]:
    """iptables-restore lines (per table) adding each jump of the repo's that `have` (each table's
    `iptables -S`) lacks, first in its chain (the FORWARD ACCEPT last): written again, a rule set
    gains no duplicate."""
    missing: dict[str, list[str]] = {table: [] for table in TABLES}
    for table, chain, rule in jumps(short, at):
        if " ".join(["-A", chain, *rule]) not in have.get(table, "").splitlines():
            where = ["-A", chain] if rule[-1] == "ACCEPT" else ["-I", chain, "1"]
            missing[table].append(" ".join([*where, *rule]))
    return missing


def with_lines(table: str, lines: Sequence[str]) -> str:
    """One table's iptables-restore input with `lines` added before its COMMIT."""
    head, _, _ = table.rpartition("COMMIT")
    return head + "".join(f"{line}\n" for line in lines) + "COMMIT\n"


def tear_down(short: str) -> list[str]:
    """Remove the repo's veth, its jumps and its chains from the host, whatever of them is there
    (after a failed `repo up` too: found by name, not by a record). Returns what it removed."""
    removed = []
    veth = veth_name(short)
    if _has_link(veth):
        _run(["ip", "link", "del", veth])
        removed.append(f"veth {veth}")
    into, forward, nat = chain_names(short)
    rules = 0
    for table, chain, target in (
        ("raw", "PREROUTING", raw_chain(short)),
        ("filter", "INPUT", into),
        ("filter", "FORWARD", forward),
        ("filter", "FORWARD", f"ACCEPT@{veth}"),
        ("nat", "POSTROUTING", nat),
    ):
        listed = subprocess.run(
            ["iptables", "-t", table, "-S", chain], capture_output=True, text=True, check=False
        )
        for line in listed.stdout.splitlines():
            accept = line == f"-A {chain} -i {veth} -j ACCEPT" and target == f"ACCEPT@{veth}"
            if accept or (line.endswith(f"-j {target}") and line.startswith(f"-A {chain} ")):
                with contextlib.suppress(ToolError):
                    _run(["iptables", "-t", table, "-D", *line.split()[1:]])
                    rules += 1
    for table, chain in (("raw", raw_chain(short)), ("filter", into), ("filter", forward), ("nat", nat)):
        if _ok(["iptables", "-t", table, "-S", chain]):
            _run(["iptables", "-t", table, "-F", chain])
            _run(["iptables", "-t", table, "-X", chain])
            rules += 1
    if rules:
        removed.append(f"host firewall chains {raw_chain(short)}, {into}, {forward}, {nat}")
    return removed
