"""The host's addresses and routes as the kernel tells them over rtnetlink (NETLINK_ROUTE).

The uplink rules (`netns.blocked_destinations`) are computed from the host's addresses and routes,
and must follow them while a repo is up (`uplinkwatch`). Both come from the same messages: a dump
(RTM_GETADDR, RTM_GETROUTE) answers with the RTM_NEWADDR/RTM_NEWROUTE messages the kernel also
multicasts to a subscribed socket on every change, so one decoder serves the first read and every
change after it.

The encoding and decoding (`dump_request`, `messages`, `address`, `route`) are sans-IO, tested with
the byte layouts the kernel sends (include/uapi/linux/netlink.h, if_addr.h, rtnetlink.h); `dump`
and `subscribe` are the only functions that touch a socket.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

# struct nlmsghdr: length (header included), type, flags, sequence, port id. Host byte order.
_HEADER = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, interface index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTATTR = struct.Struct("=HH")  # length (header included), type
_ERRNO = struct.Struct("=i")

NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN = 2, 3, 4
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
CHANGES = frozenset({RTM_NEWADDR, RTM_DELADDR, RTM_NEWROUTE, RTM_DELROUTE})
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300

IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
_NLA_TYPE_MASK = 0x3FFF  # the two top bits of an attribute's type are flags (nested, byte order)

RT_TABLE_MAIN, RT_TABLE_LOCAL = 254, 255
RTN_UNICAST, RTN_LOCAL = 1, 2

# Multicast groups (the bit masks bind() takes): IPv4 and IPv6 address and route changes.
RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE = 0x10, 0x40
RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE = 0x100, 0x400

_FAMILIES: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 16}  # address length of each family


@dataclass(frozen=True)
class Message:
    kind: int  # nlmsg_type
    flags: int
    seq: int
    payload: bytes


@dataclass(frozen=True)
class Address:
    """One address of a host interface (RTM_NEWADDR / RTM_DELADDR)."""

    family: int
    index: int  # the interface's index
    prefixlen: int
    local: str  # the host's own end (IFA_LOCAL; IFA_ADDRESS is the peer's on a point-to-point link)


@dataclass(frozen=True)
class Route:
    """One route (RTM_NEWROUTE / RTM_DELROUTE)."""

    family: int
    table: int
    kind: int  # RTN_UNICAST, RTN_LOCAL, ...
    dst: str  # a network, "0.0.0.0/0" for a default route
    oif: int | None  # the interface it leaves by (None for multipath and non-unicast routes)
    gateway: str | None

    @property
    def is_default(self) -> bool:
        return ipaddress.ip_network(self.dst).prefixlen == 0


def _align(n: int) -> int:
    return (n + 3) & ~3


def messages(data: bytes) -> Iterator[Message]:
    """The messages of one datagram, in order; a truncated or malformed tail raises ValueError
    (the kernel never sends one: the datagram was cut, and what it said cannot be trusted)."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, flags, seq, _port = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise ValueError(f"netlink message of length {length} at offset {offset} of {len(data)} bytes")
        yield Message(kind, flags, seq, data[offset + _HEADER.size : offset + length])
        offset += _align(length)
    if offset < len(data):
        raise ValueError(f"{len(data) - offset} bytes after the last netlink message")


def attributes(data: bytes) -> dict[int, bytes]:
    """The route attributes of a payload's tail (the first of each type)."""
    found: dict[int, bytes] = {}
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size or offset + length > len(data):
            raise ValueError(f"route attribute of length {length} at offset {offset} of {len(data)} bytes")
        found.setdefault(kind & _NLA_TYPE_MASK, data[offset + _RTATTR.size : offset + length])
        offset += _align(length)
    return found


def error_code(message: Message) -> int:
    """An NLMSG_ERROR's errno (0 is an acknowledgement)."""
    code: int = _ERRNO.unpack_from(message.payload)[0]
    return -code


def _ip(family: int, raw: bytes) -> str:
    if len(raw) != _FAMILIES[family]:
        raise ValueError(f"an address of {len(raw)} bytes in family {family}")
    return str(ipaddress.ip_address(raw))


def address(message: Message) -> Address | None:
    """The address an RTM_NEWADDR/RTM_DELADDR names; None for other families and messages."""
    if message.kind not in (RTM_NEWADDR, RTM_DELADDR):
        return None
    family, prefixlen, _flags, _scope, index = _IFADDRMSG.unpack_from(message.payload)
    if family not in _FAMILIES:
        return None
    attrs = attributes(message.payload[_IFADDRMSG.size :])
    raw = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS))
    if raw is None:
        return None
    return Address(family, index, prefixlen, _ip(family, raw))


def route(message: Message) -> Route | None:
    """The route an RTM_NEWROUTE/RTM_DELROUTE names; None for other families and messages."""
    if message.kind not in (RTM_NEWROUTE, RTM_DELROUTE):
        return None
    family, dst_len, _src, _tos, table, _proto, _scope, kind, _flags = _RTMSG.unpack_from(message.payload)
    if family not in _FAMILIES:
        return None
    attrs = attributes(message.payload[_RTMSG.size :])
    if RTA_TABLE in attrs:  # tables above 255 are only here; rtm_table then says 252 (RT_TABLE_COMPAT)
        table = struct.unpack("=I", attrs[RTA_TABLE])[0]
    raw_dst = attrs.get(RTA_DST, bytes(_FAMILIES[family]))
    dst = ipaddress.ip_network(f"{_ip(family, raw_dst)}/{dst_len}", strict=False)
    oif = struct.unpack("=I", attrs[RTA_OIF])[0] if RTA_OIF in attrs else None
    gateway = _ip(family, attrs[RTA_GATEWAY]) if RTA_GATEWAY in attrs else None
    return Route(family, table, kind, str(dst), oif, gateway)


def dump_request(kind: int, family: int, seq: int) -> bytes:
    """A request for every address (RTM_GETADDR) or route (RTM_GETROUTE) of `family`."""
    if kind == RTM_GETADDR:
        body = _IFADDRMSG.pack(family, 0, 0, 0, 0)
    elif kind == RTM_GETROUTE:
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
    else:
        raise ValueError(f"no dump request of type {kind}")
    return _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


# --- the socket side -----------------------------------------------------------------------------

_RECV = 1 << 16


def _socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)


def dump(kind: int, family: int) -> list[Message]:
    """Every message of one dump, read from a socket of its own until NLMSG_DONE."""
    with _socket() as sock:
        sock.bind((0, 0))
        sock.sendto(dump_request(kind, family, 1), (0, 0))
        found: list[Message] = []
        while True:
            for message in messages(sock.recv(_RECV)):
                if message.kind == NLMSG_DONE:
                    return found
                if message.kind == NLMSG_ERROR and error_code(message):
                    raise OSError(error_code(message), f"rtnetlink dump of type {kind} failed")
                found.append(message)


def subscribe(groups: int) -> socket.socket:
    """A socket the kernel sends every change of `groups` to (`receive` reads it)."""
    sock = _socket()
    try:
        sock.bind((0, groups))
    except OSError:
        sock.close()
        raise
    return sock


def receive(sock: socket.socket) -> list[Message]:
    """The messages of the next datagram. OSError ENOBUFS means the kernel dropped changes the
    socket had no room for: the caller must read the whole state again."""
    return list(messages(sock.recv(_RECV)))
