"""What a repo may publish on the host, and what each repo's port keeper publishes now.

Policy (machine settings, declared here): `publish-ports`, the host ports a repo may publish on
(default 1024-65535: the ports below 1024 are the host's services', and a tenant holding
127.0.0.1:53 or :80 would answer the host's own clients), and `publish-limit`, the most host ports
one repo publishes at once (default 64: each is a listener of the uplink, and `-p 1-65535:1-65535`
would ask for all). The gate refuses what breaks them (`gate/policy/publish.py`); the keeper
(`runtime/ports.py`) skips it, for what the gate never saw (a container created before a change, a
restart policy's start). `publish-addresses` says which host addresses the keeper listens on.

State: each keeper writes the host ports it publishes to `<machine run dir>/published/<12 of the
repo id>.json` with its pid, so a gate learns what the machine's other repos publish from one
directory of small files, and a file whose keeper is gone counts for nothing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rediacc_core.pids import pid_alive
from rediacc_core.setting import Setting
from rediacc_core.values import split_list

DEFAULT_RANGE = "1024-65535"
DEFAULT_LIMIT = 64
MAX_LIMIT = 65535
# Where dockerd picks a host port for `-p 80` (and `-P`): its network namespace's
# ip_local_port_range, which a fresh namespace (the repo's) has at the kernel's default.
EPHEMERAL = (32768, 60999)
PROTOCOLS = ("tcp", "udp")  # what the uplink forwards; anything else never leaves the namespace
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::"})  # bindings the keeper forwards (others stay inside)
STATE_DIR = "published"


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def covers(self, low: int, high: int) -> bool:
        return self.low <= low and high <= self.high


def parse_range(value: str) -> PortRange:
    """`LOW-HIGH` (or one port) as a PortRange; ValueError names what is wrong."""
    low, _, high = value.strip().partition("-")
    parts = (low, high or low)
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"{value!r} is not a port range (LOW-HIGH, such as {DEFAULT_RANGE})")
    first, last = int(parts[0]), int(parts[1])
    if not 1 <= first <= last <= 65535:
        raise ValueError(f"{value!r}: ports run from 1 to 65535, the low one first")
    return PortRange(first, last)


def check_range_setting(value: str) -> str | None:
    """Why the `publish-ports` setting `value` is wrong, or None."""
    try:
        parse_range(value)
    except ValueError as exc:
        return str(exc)
    return None


def check_limit_setting(value: str) -> str | None:
    """Why the `publish-limit` setting `value` is wrong, or None."""
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_LIMIT:
        return f"a number of host ports from 0 to {MAX_LIMIT}"
    return None


def check_addresses_setting(value: str) -> str | None:
    """Why the `publish-addresses` setting `value` is wrong, or None."""
    for item in split_list(value):
        if item == "none":
            continue
        try:
            if ipaddress.ip_address(item).version != 4:
                return f"{item!r}: published ports have no IPv6 uplink; give IPv4 addresses"
        except ValueError:
            return f"{item!r} is not an IPv4 address of this host (or 'none')"
    return None


PUBLISH_ADDRESSES = Setting(
    "publish-addresses",
    (),
    "127.0.0.1",
    "host addresses a repo container's published port (-p 8080:80) listens on, through the repo's "
    "uplink, comma-separated IPv4 (0.0.0.0 = every address; none = publish nowhere)",
    check_addresses_setting,
    form="IPv4,…|none",
)
PUBLISH_PORTS = Setting(
    "publish-ports",
    (),
    DEFAULT_RANGE,
    "the host ports a repo container may publish on (-p 8080:80), LOW-HIGH: a port outside is "
    "refused at create and never forwarded (below 1024 are the host's own services' ports)",
    check_range_setting,
    form="LOW-HIGH",
)
PUBLISH_LIMIT = Setting(
    "publish-limit",
    (),
    str(DEFAULT_LIMIT),
    f"the most host ports one repo publishes at once (0 to {MAX_LIMIT}): a create or start "
    "that would pass it is refused, and the port keeper forwards no more",
    check_limit_setting,
    form=f"0-{MAX_LIMIT}",
)


@dataclass(frozen=True)
class Policy:
    ports: PortRange
    limit: int


def policy_from(settings: Mapping[str, str]) -> Policy:
    """The machine's publishing policy; a setting that does not read gets its default (the safe one)."""
    ports, limit = str(settings.get("publish-ports", "")), str(settings.get("publish-limit", ""))
    return Policy(
        parse_range(ports if check_range_setting(ports) is None else DEFAULT_RANGE),
        int(limit) if check_limit_setting(limit) is None else DEFAULT_LIMIT,
    )


# --- what each repo's keeper publishes now ------------------------------------------------------

Port = tuple[str, int]  # (protocol, host port)


def state_file(run_dir: Path, short_id: str) -> Path:
    """The keeper state file of the repo whose id starts `short_id` (its first 12, no dashes)."""
    return run_dir / STATE_DIR / f"{short_id}.json"


def short_id(repo_id: str) -> str:
    return repo_id.replace("-", "")[:12]


def write_state(path: Path, ports: Iterable[Port], pid: int | None = None) -> None:
    """Replace `path` with `ports` and the keeper's pid, this process's unless given (atomically:
    readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"pid": pid or os.getpid(), "ports": sorted([p, n] for p, n in set(ports))}
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(document) + "\n")
    os.replace(temporary, path)


def read_state(path: Path) -> frozenset[Port]:
    """The ports in `path`; none when it is missing, unreadable or its keeper is gone."""
    try:
        document = json.loads(path.read_text())
        pid, ports = int(document["pid"]), document["ports"]
        if not pid_alive(pid):
            return frozenset()
        return frozenset((str(p), int(n)) for p, n in ports)
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()


def published_by_others(run_dir: Path, own_short_id: str) -> dict[Port, str]:
    """Each port the machine's other repos publish now -> the short id of the repo publishing it."""
    found: dict[Port, str] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(run_dir / STATE_DIR):
            short, dot, ext = entry.name.partition(".")
            if dot and ext == "json" and short and short != own_short_id:
                found.update(dict.fromkeys(read_state(Path(entry.path)), short))
    return found
