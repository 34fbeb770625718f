"""rtnetlink messages decoded from the bytes the kernel sends: the layouts of include/uapi/linux
(netlink.h, if_addr.h, rtnetlink.h), built here field by field as the kernel lays them out."""

from __future__ import annotations

import socket
import struct

import pytest

from rediacc_core.runtime import rtnetlink


def _attr(kind: int, payload: bytes) -> bytes:
    """One rtattr, padded to 4 bytes as the kernel pads it (the padding is not in its length)."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + bytes(-length % 4)


def _message(kind: int, body: bytes, *, flags: int = 0, seq: int = 0) -> bytes:
    length = 16 + len(body)
    return struct.pack("=IHHII", length, kind, flags, seq, 0) + body + bytes(-length % 4)


def _newaddr(address: str, prefixlen: int, index: int, *, peer: str | None = None, label: str = "") -> bytes:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    packed = socket.inet_pton(family, address)
    body = struct.pack("=BBBBI", family, prefixlen, 0x80, 0, index)  # IFA_F_PERMANENT, scope global
    body += _attr(1, socket.inet_pton(family, peer) if peer else packed)  # IFA_ADDRESS
    if family == socket.AF_INET:
        body += _attr(2, packed)  # IFA_LOCAL
    if label:
        body += _attr(3, label.encode() + b"\0")  # IFA_LABEL: 3 bytes + NUL, padded
    body += _attr(8, struct.pack("=I", 0x80))  # IFA_FLAGS
    return _message(rtnetlink.RTM_NEWADDR, body)


def _newroute(
    dst: str | None,
    dst_len: int,
    *,
    oif: int | None,
    gateway: str | None = None,
    table: int = 254,
    kind: int = 1,
    family: int = socket.AF_INET,
    message: int = rtnetlink.RTM_NEWROUTE,
) -> bytes:
    body = struct.pack("=BBBBBBBBI", family, dst_len, 0, 0, table if table <= 255 else 252, 4, 0, kind, 0)
    body += _attr(15, struct.pack("=I", table))  # RTA_TABLE
    if dst is not None:
        body += _attr(1, socket.inet_pton(family, dst))  # RTA_DST
    if gateway is not None:
        body += _attr(5, socket.inet_pton(family, gateway))  # RTA_GATEWAY
    if oif is not None:
        body += _attr(4, struct.pack("=I", oif))  # RTA_OIF
    return _message(message, body)


def _decoded(data: bytes) -> list[rtnetlink.Address | rtnetlink.Route | None]:
    found: list[rtnetlink.Address | rtnetlink.Route | None] = []
    for message in rtnetlink.messages(data):
        found.append(rtnetlink.address(message) or rtnetlink.route(message))
    return found


def test_an_address_the_host_gains_is_read_from_its_local_attribute() -> None:
    (found,) = _decoded(_newaddr("198.18.5.1", 24, 7, label="br-late"))
    assert found == rtnetlink.Address(socket.AF_INET, 7, 24, "198.18.5.1")


def test_a_point_to_point_address_is_the_hosts_own_end_not_the_peer() -> None:
    (found,) = _decoded(_newaddr("198.18.9.2", 32, 9, peer="198.18.9.1"))
    assert isinstance(found, rtnetlink.Address) and found.local == "198.18.9.2"


def test_an_ipv6_address_has_only_ifa_address_and_is_read_from_it() -> None:
    (found,) = _decoded(_newaddr("2001:db8:5::1", 64, 7))
    assert found == rtnetlink.Address(socket.AF_INET6, 7, 64, "2001:db8:5::1")


def test_routes_give_their_network_interface_gateway_table_and_type() -> None:
    data = (
        _newroute(None, 0, oif=2, gateway="192.0.2.1")  # default via 192.0.2.1 dev eth0: no RTA_DST
        + _newroute("198.18.5.0", 24, oif=7)  # 198.18.5.0/24 dev br-late scope link
        + _newroute("198.18.5.1", 32, oif=7, table=255, kind=2)  # local 198.18.5.1 (table local)
        + _newroute("10.8.0.0", 16, oif=3, table=51820)  # a VPN's own table, only in RTA_TABLE
    )
    default, bridge, local, vpn = _decoded(data)
    assert default == rtnetlink.Route(socket.AF_INET, 254, 1, "0.0.0.0/0", 2, "192.0.2.1")
    assert isinstance(default, rtnetlink.Route) and default.is_default
    assert bridge == rtnetlink.Route(socket.AF_INET, 254, 1, "198.18.5.0/24", 7, None)
    assert local == rtnetlink.Route(socket.AF_INET, 255, rtnetlink.RTN_LOCAL, "198.18.5.1/32", 7, None)
    assert isinstance(vpn, rtnetlink.Route) and vpn.table == 51820


def test_a_removed_route_and_address_decode_like_added_ones() -> None:
    data = _newroute("198.18.5.0", 24, oif=7, message=rtnetlink.RTM_DELROUTE)
    (message,) = rtnetlink.messages(data)
    assert message.kind in rtnetlink.CHANGES
    assert rtnetlink.route(message) == rtnetlink.Route(socket.AF_INET, 254, 1, "198.18.5.0/24", 7, None)


def test_other_messages_and_families_are_not_addresses_or_routes() -> None:
    done = _message(rtnetlink.NLMSG_DONE, struct.pack("=i", 0), flags=2)
    link = _message(16, struct.pack("=BBHiII", 0, 0, 1, 7, 0, 0))  # RTM_NEWLINK
    mpls = _newroute(None, 0, oif=2, family=28)  # AF_MPLS
    assert _decoded(done + link + mpls) == [None, None, None]


def test_several_messages_of_one_datagram_come_in_order_and_padding_is_skipped() -> None:
    data = _newaddr("198.18.5.1", 24, 7, label="br") + _newaddr("198.18.6.1", 24, 8, label="br-longer")
    assert [a.local for a in _decoded(data) if isinstance(a, rtnetlink.Address)] == [
        "198.18.5.1",
        "198.18.6.1",
    ]


def test_an_error_message_carries_the_negative_errno() -> None:
    request = rtnetlink.dump_request(rtnetlink.RTM_GETROUTE, socket.AF_INET, 1)
    (message,) = rtnetlink.messages(_message(rtnetlink.NLMSG_ERROR, struct.pack("=i", -1) + request[:16]))
    assert rtnetlink.error_code(message) == 1  # EPERM


@pytest.mark.parametrize(
    "data",
    [
        _newaddr("198.18.5.1", 24, 7)[:-3],  # cut inside the message
        struct.pack("=IHHII", 8, 20, 0, 0, 0),  # a length shorter than its own header
        _newaddr("198.18.5.1", 24, 7) + b"\0\0\0",  # a tail too short for a header
    ],
    ids=["cut", "short-length", "tail"],
)
def test_a_cut_datagram_is_an_error_not_fewer_messages(data: bytes) -> None:
    with pytest.raises(ValueError):
        list(rtnetlink.messages(data))


def test_an_attribute_running_past_its_message_is_an_error() -> None:
    body = struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, 7) + struct.pack("=HH", 40, 2) + bytes(4)
    (message,) = rtnetlink.messages(_message(rtnetlink.RTM_NEWADDR, body))
    with pytest.raises(ValueError):
        rtnetlink.address(message)


def test_a_dump_request_is_a_request_for_every_entry_of_one_family() -> None:
    request = rtnetlink.dump_request(rtnetlink.RTM_GETADDR, socket.AF_INET, 7)
    length, kind, flags, seq, port = struct.unpack_from("=IHHII", request)
    assert (length, kind, seq, port) == (len(request), rtnetlink.RTM_GETADDR, 7, 0)
    assert flags == rtnetlink.NLM_F_REQUEST | rtnetlink.NLM_F_DUMP
    assert request[16] == socket.AF_INET  # ifaddrmsg's family
    route = rtnetlink.dump_request(rtnetlink.RTM_GETROUTE, socket.AF_INET6, 8)
    assert len(route) == 16 + 12 and route[16] == socket.AF_INET6  # a whole rtmsg


def test_the_hosts_own_dump_decodes() -> None:
    """The kernel's answer on this host: every address and route decodes, loopback among them."""
    found = rtnetlink.dump(rtnetlink.RTM_GETADDR, socket.AF_INET)
    found += rtnetlink.dump(rtnetlink.RTM_GETROUTE, socket.AF_INET)
    addresses = [a for a in map(rtnetlink.address, found) if a is not None]
    routes = [r for r in map(rtnetlink.route, found) if r is not None]
    assert rtnetlink.Address(socket.AF_INET, 1, 8, "127.0.0.1") in addresses
    assert any(r.table == rtnetlink.RT_TABLE_LOCAL and r.dst == "127.0.0.0/8" for r in routes)
