"""An IP address read exactly as Go's `net.ParseIP` reads it, and the address the daemon binds for it.

The daemon (Engine 26.1 and 28.5 alike) turns a port binding's `HostIp` into a host address with
`net.ParseIP`, which is `netip.ParseAddr` refusing zones: dotted IPv4 with four fields, no leading
zeros and none above 255; IPv6 of at most eight groups of at most four hex digits, one `::`, an
IPv4 tail only in the last two groups' place. No brackets, no whitespace, no zone (`%eth0`). What
does not read is no address (nil), and the daemon binds nil as an empty `HostIp`: on its default
address, every address of the namespace. An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`) binds as its
IPv4 address. Python's `ipaddress` differs (it takes zones), so the gate has its own reader.
"""

from __future__ import annotations

import ipaddress

_HEX = "0123456789abcdefABCDEF"


def _ipv4_fields(text: str) -> bytes | None:
    """The four bytes of dotted-decimal `text`, or None (Go's parseIPv4Fields)."""
    parts = text.split(".")
    if len(parts) != 4:
        return None
    out = bytearray()
    for part in parts:
        if not part or not all("0" <= c <= "9" for c in part):
            return None
        if len(part) > 1 and part[0] == "0":  # a leading zero: refused since Go 1.17
            return None
        if len(part) > 3 or int(part) > 255:
            return None
        out.append(int(part))
    return bytes(out)


def _ipv6(text: str) -> bytes | None:
    """The sixteen bytes of IPv6 `text` without a zone, or None (Go's parseIPv6)."""
    ip = bytearray(16)
    ellipsis = -1
    s = text
    if s.startswith("::"):
        ellipsis, s = 0, s[2:]
        if not s:
            return bytes(ip)
    i = 0
    while i < 16:
        off = 0
        while off < len(s) and s[off] in _HEX:
            off += 1
            if off > 4:
                return None
        if off == 0:
            return None
        if off < len(s) and s[off] == ".":
            if (ellipsis < 0 and i != 12) or i + 4 > 16:
                return None
            four = _ipv4_fields(s)
            if four is None:
                return None
            ip[i : i + 4] = four
            i, s = i + 4, ""
            break
        value = int(s[:off], 16)
        ip[i], ip[i + 1] = value >> 8, value & 0xFF
        i, s = i + 2, s[off:]
        if not s:
            break
        if s[0] != ":" or len(s) == 1:
            return None
        s = s[1:]
        if s[0] == ":":
            if ellipsis >= 0:
                return None
            ellipsis, s = i, s[1:]
            if not s:
                break
    if s:
        return None
    if i < 16:
        if ellipsis < 0:
            return None
        gap = 16 - i
        ip[ellipsis + gap :] = ip[ellipsis:i]
        ip[ellipsis : ellipsis + gap] = bytes(gap)
    elif ellipsis >= 0:
        return None  # `::` must stand for at least one group
    return bytes(ip)


def parse_ip(text: str) -> bytes | None:
    """`net.ParseIP(text)`: sixteen bytes (IPv4 as IPv4-mapped IPv6), or None where Go reads nothing."""
    for char in text:
        if char == ".":
            four = _ipv4_fields(text)
            return None if four is None else bytes(10) + b"\xff\xff" + four
        if char == ":":
            address, percent, _zone = text.partition("%")
            # A zone makes netip's address valid, and net.ParseIP refuse it; an empty zone is an error.
            return None if percent else _ipv6(address)
        if char == "%":
            return None
    return None


def bound_address(host_ip: str) -> str:
    """The host address the daemon binds for a port binding's `HostIp`, written as the daemon records
    it (`0.0.0.0`, `::1`); the empty string where it binds its default, every address."""
    raw = parse_ip(host_ip)
    if raw is None:
        return ""
    if raw[:12] == bytes(10) + b"\xff\xff":  # net.IP.To4: an IPv4-mapped address binds as IPv4
        return str(ipaddress.IPv4Address(raw[12:]))
    return str(ipaddress.IPv6Address(raw))
