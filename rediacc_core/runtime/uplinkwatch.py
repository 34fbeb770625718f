"""The uplink rules follow the host: addresses and networks it gains while a repo is up (a VPN, a
VM's bridge, a system Docker started later) are refused as soon as the kernel announces them.

`netns.bring_up` writes the namespace's RDC-UPLINK chain from the host as it is at `rdc repo up`.
This watcher, a thread of the repo's port keeper (`ports`, started by `bring_up` from `rdc repo
up` and from the dockerd unit alike), subscribes to the kernel's IPv4 address and route changes
(rtnetlink), and at each one reads the host's addresses and routes whole and writes the chain
again (one `iptables-restore`, atomic) when its destinations changed. It also writes it once at its
start, for what changed between `bring_up` and the subscription. A destination the host no longer
has is no longer refused: it is then like any address outside the host.

On the kernel path it also looks every CHECK seconds that the host still holds the repo's chains
and jumps (`netns.host_rules_intact`): a reload of the host's firewall that took them is mended
within that time, and meanwhile the namespace's own rules refuse the same destinations.

IPv6 changes are not followed: the uplink carries no IPv6 (`netns.blocked_destinations`).

Nothing stops the thread: any failure (the socket, a dump, iptables) is logged and it starts
again from a fresh subscription and a whole read. Should the keeper process itself die, the chain
stays as last written until `rdc repo up` (or the dockerd unit's next start) starts a keeper again.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Sequence

from rediacc_core.runtime import netns, rtnetlink
from rediacc_core.runtime.layout import RepoNetwork

GROUPS = rtnetlink.RTMGRP_IPV4_IFADDR | rtnetlink.RTMGRP_IPV4_ROUTE
SETTLE = 0.05  # one change comes as several messages (an address, then its routes): applied once
RETRY = 1.0  # seconds before starting again after a failure
CHECK = 2.0  # seconds between looks at the host's rules, on the kernel path, when nothing changes

Log = Callable[[str], None]


def changes(before: Sequence[str] | None, after: Sequence[str]) -> str:
    """The log line for writing `after` over `before` (None: nothing written yet)."""
    if before is None:
        return "uplink rules: refusing " + ", ".join(after)
    added = [d for d in after if d not in before]
    gone = [d for d in before if d not in after]
    said = []
    if added:
        said.append("now refusing " + ", ".join(added))
    if gone:
        said.append("no longer refusing " + ", ".join(gone) + " (gone from the host)")
    return "uplink rules: " + "; ".join(said)


def _wait_for_change(events: socket.socket) -> None:
    """Until the kernel announces an address or route change (or says it dropped some), then
    until it has said all of it."""
    events.settimeout(CHECK)
    while True:
        try:
            if any(m.kind in rtnetlink.CHANGES for m in rtnetlink.receive(events)):
                break
        except TimeoutError:
            return  # no change: time to see that the host still has the repo's rules
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # changes were dropped: read the whole state again
                break
            raise
    events.settimeout(SETTLE)
    while True:
        try:
            rtnetlink.receive(events)
        except TimeoutError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                raise


def follow(net: RepoNetwork, log: Log) -> None:
    """Keep `net`'s uplink rules equal to the host's destinations, for as long as the process lives."""
    applied: list[str] | None = None
    said = ""  # the last failure: said once, not every second while it lasts
    while True:
        try:
            with rtnetlink.subscribe(GROUPS) as events:  # subscribed before the read: no change lost
                while True:
                    blocked = netns.host_destinations()
                    if blocked != applied:
                        netns.apply_rules(net, blocked)
                        log(changes(applied, blocked))
                        applied, said = blocked, ""
                    elif not netns.host_rules_intact(net, blocked):
                        netns.apply_rules(net, blocked)
                        log("host rules: the repo's chains or jumps were gone (a reload?); written again")
                    _wait_for_change(events)
        except Exception as exc:  # never stops: a new subscription and a whole read, written whole
            failure = f"uplink rules: following the host failed: {type(exc).__name__}: {exc}; trying again"
            if failure != said:
                log(failure)
                said = failure
            applied = None
            time.sleep(RETRY)


def start(net: RepoNetwork, log: Log) -> threading.Thread:
    thread = threading.Thread(target=follow, args=(net, log), name="uplink-watch", daemon=True)
    thread.start()
    return thread
