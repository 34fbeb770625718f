"""A port binding's `HostIp` is read as the daemon reads it (Go's `net.ParseIP`, then the bridge
driver's IPv4 unmapping), so the gate applies the publishing policy to the address the daemon binds.

What Go does not read binds the daemon's default: every address (the empty string here)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rediacc_core.gate.wire.goip import bound_address, parse_ip

EVERY = ""  # the daemon's default binding: all of the namespace's addresses


@pytest.mark.parametrize(
    ("host_ip", "bound"),
    [
        # Plain spellings.
        ("", EVERY),
        ("0.0.0.0", "0.0.0.0"),
        ("127.0.0.1", "127.0.0.1"),
        ("255.255.255.255", "255.255.255.255"),
        ("::", "::"),
        ("::1", "::1"),
        ("0:0:0:0:0:0:0:0", "::"),
        ("0000:0000:0000:0000:0000:0000:0000:0000", "::"),
        ("::0", "::"),
        ("0::", "::"),
        ("0::0", "::"),
        ("0:0::0:0", "::"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("FE80::1", "fe80::1"),
        ("1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:0"),
        ("::2:3:4:5:6:7:8", "0:2:3:4:5:6:7:8"),
        # IPv4-mapped IPv6 binds as its IPv4 address (net.IP.To4); IPv4-compatible (`::a.b.c.d`) does not.
        ("::ffff:0.0.0.0", "0.0.0.0"),
        ("::FFFF:0.0.0.0", "0.0.0.0"),
        ("0:0:0:0:0:ffff:0.0.0.0", "0.0.0.0"),
        ("::ffff:0:0", "0.0.0.0"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("::ffff:7f00:1", "127.0.0.1"),
        ("::0.0.0.0", "::"),
        ("::127.0.0.1", "::7f00:1"),
        ("0:0:0:0:0:0:127.0.0.1", "::7f00:1"),
        # What Go does not read binds every address.
        ("[::1]", EVERY),
        ("[::]", EVERY),
        ("[0.0.0.0]", EVERY),
        ("0.0.0.0 ", EVERY),
        (" 127.0.0.1", EVERY),
        ("127.0.0.1\n", EVERY),
        ("\t::1", EVERY),
        ("127.000.000.001", EVERY),  # leading zeros: refused by Go since 1.17
        ("127.0.0.01", EVERY),
        ("00.0.0.0", EVERY),
        ("0x7f.0.0.1", EVERY),
        ("127.1", EVERY),
        ("2130706433", EVERY),
        ("127.0.0.256", EVERY),
        ("127.0.0.1.", EVERY),
        ("1.2.3.4.5", EVERY),
        ("::1%lo", EVERY),  # a zone: netip reads it, net.ParseIP does not
        ("fe80::1%eth0", EVERY),
        ("::ffff:127.0.0.1%lo", EVERY),
        ("::1%", EVERY),
        ("%lo", EVERY),
        ("127.0.0.1%lo", EVERY),
        (":::", EVERY),
        ("1:::2", EVERY),
        ("1::2::3", EVERY),
        ("1:2:3:4:5:6:7:8:9", EVERY),
        ("1:2:3:4:5:6:7", EVERY),
        ("1:2:3:4:5:6:7:8::", EVERY),  # `::` standing for no group
        ("::1:2:3:4:5:6:7:8", EVERY),
        ("12345::", EVERY),
        ("00000::", EVERY),
        ("1:", EVERY),
        (":1", EVERY),
        ("::ffff:127.0.0.01", EVERY),
        ("1:2:3:4:5:6:1.2.3.4:5", EVERY),
        ("1:2:3:4:5:1.2.3.4", EVERY),  # an IPv4 tail must replace the last two groups
        ("1:2:3:4:5:6:7:1.2.3.4", EVERY),
        ("::g", EVERY),
        ("localhost", EVERY),
        ("０.０.０.０", EVERY),  # full-width digits
        ("٠.٠.٠.٠", EVERY),
    ],
)
def test_each_host_ip_binds_the_address_the_daemon_binds(host_ip: str, bound: str) -> None:
    assert bound_address(host_ip) == bound


@given(st.ip_addresses())
def test_every_address_python_writes_reads_back_as_itself(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    raw = parse_ip(str(address))
    assert raw is not None
    as16 = address.packed if address.version == 6 else bytes(10) + b"\xff\xff" + address.packed
    assert raw == as16


@given(st.text(alphabet="0123456789abcdefABCDEF:.%[] x", max_size=45))
def test_what_the_reader_admits_python_reads_as_the_same_address(text: str) -> None:
    """Python's `ipaddress` is at least as lenient (it takes zones, Go's reader does not), so
    anything the reader admits must mean the same address to it."""
    raw = parse_ip(text)
    if raw is None:
        return
    ours = ipaddress.IPv6Address(raw)
    theirs = ipaddress.ip_address(text)
    assert "%" not in text
    if theirs.version == 4:
        assert ours.ipv4_mapped == theirs
    else:
        assert ours == theirs
