"""What the daemon fetches on the tenant's behalf: git remotes, and addresses on the host itself.

The daemon runs as root in the host's network namespace, so whatever it fetches for a request
(a build context, an imported tarball, a registry's answer) comes from where the host stands: its
loopback services, the cloud metadata address, the host's root SSH keys. The gate refuses what it
can see in the request: every build remote moby clones with git (its `git submodule update` has no
protocol limits, so a `.gitmodules` can make it run the host's `ssh`), and loopback, link-local
and "this host" addresses written literally (liberal IPv4 forms such as `127.1` included, as
glibc's resolver reads them) or as `localhost` or the machine's own name, unless the machine
allows that registry (`registries`). A name that DNS resolves to such an address, or an HTTP
redirect, is not visible here: the repo's network namespace is what closes those.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.values import split_list

# moby's urlutil.IsGitURL (builder/remotecontext/urlutil), matched without regard to case, and
# ssh:// besides (the daemon refuses it today; a later one may clone it).
_GIT_PREFIXES = ("git://", "git@", "github.com/", "ssh://", "git+ssh://", "ssh+git://")
_GIT_SUFFIX = re.compile(r"\.git(?:#.+)?$", re.IGNORECASE | re.DOTALL)
_HTTP = ("http://", "https://")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_THIS_HOST_V4 = ipaddress.IPv4Network("0.0.0.0/8")
_LIBERAL_V4 = re.compile(r"[0-9a-fA-FxX.]+")
_HOST_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
Allowed = frozenset[tuple[str, int | None]]

GIT_INSTEAD = "the context sent from your machine (docker build <dir>), or an http(s) tarball URL"


def is_git_remote(remote: str) -> bool:
    """Would the daemon (or a later one) clone `remote` with git? (`IsGitURL`, and ssh://.)"""
    lower = remote.lower()
    if lower.startswith(_GIT_PREFIXES):
        return True
    return lower.startswith(_HTTP) and _GIT_SUFFIX.search(remote) is not None


def split_host_port(authority: str) -> tuple[str, int | None] | None:
    """`host`, `host:port`, `[v6]`, `[v6]:port` (or a bare IPv6 address) -> (host, port); None if
    malformed. The host comes back lower-case, without brackets or a trailing dot."""
    host, port = authority, ""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            return None
        host, rest = authority[1:end], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    elif authority.count(":") == 1:
        host, _, port = authority.partition(":")
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return None
    host = host.lower().rstrip(".")
    return (host, int(port) if port else None) if host else None


def parse_allowed(value: str) -> Allowed:
    """The `registries` setting's items as (host, port or None for every port)."""
    found = (split_host_port(item) for item in split_list(value))
    return frozenset(item for item in found if item is not None)


def check_allowed_setting(value: str) -> str | None:
    """Why the `registries` setting `value` is wrong, or None."""
    for item in split_list(value):
        parsed = split_host_port(item)
        if parsed is None or not (_HOST_NAME.fullmatch(parsed[0]) or _address(parsed[0]) is not None):
            return f"{item!r} is not host or host:port (an IPv6 address in brackets: [::1]:5000)"
    return None


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _LIBERAL_V4.fullmatch(host):
        try:  # glibc's forms too: 127.1, 0x7f.0.0.1, 2130706433
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def local_reason(host: str) -> str | None:
    """Why `host` (lower-case, no brackets) is the host itself, or None when it is not seen to be."""
    if not host.isascii():
        # The daemon maps such names (full-width digits, ideographic dots) to ASCII before it dials.
        return "a non-ASCII host name, which the daemon would map to one the gate cannot check"
    if host == "localhost" or host.endswith(".localhost"):
        return "a loopback name"
    if host == socket.gethostname().lower().rstrip("."):
        return "this machine's own name"
    address = _address(host)
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif int(address) < 1 << 32:  # ::, ::1 and the old IPv4-compatible forms
            return "the host's own loopback or unspecified address"
    if address is None:
        return None
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (the cloud metadata service lives there)"
    if address.is_unspecified or (isinstance(address, ipaddress.IPv4Address) and address in _THIS_HOST_V4):
        return "an address of this host (0.0.0.0/8)"
    return None


def _allows(allowed: Allowed, host: str, port: int | None) -> bool:
    return (host, None) in allowed or (port is not None and (host, port) in allowed)


def _address_finding(what: str, value: str, authority: str, allowed: Allowed) -> Iterator[Finding]:
    parsed = split_host_port(unquote(authority))
    if parsed is None:
        yield refuse(
            "fetch-address",
            value,
            f"{what} {value!r} is refused: its host part {authority!r} cannot be read",
            "a host name or address",
        )
        return
    host, port = parsed
    why = local_reason(host)
    if why is None or _allows(allowed, host, port):
        return
    shown = f"[{host}]" if ":" in host else host
    setting = f"{shown}:{port}" if port is not None else shown
    yield refuse(
        "fetch-address",
        value,
        f"{what} {value!r} is refused: {host} is {why}, and the daemon would fetch from it as the "
        "host's root, reaching services of the host that no container may reach",
        f"a registry or server outside this machine, or the operator's "
        f"`rdc machine config M --set registries={setting}`",
    )


def _url_authority(url: str) -> tuple[str, int | None] | None:
    """The authority of `url` with its scheme's default port made explicit; None if unreadable."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    authority = parts.netloc.rpartition("@")[2]
    parsed = split_host_port(unquote(authority))
    if parsed is None:
        return None
    host, port = parsed
    return host, port if port is not None else _DEFAULT_PORTS.get(parts.scheme.lower())


def url(what: str, value: str, allowed: Allowed) -> Iterator[Finding]:
    """The address rule for a URL the daemon GETs (a build remote, an import source)."""
    found = _url_authority(value)
    if found is None:
        yield refuse("fetch-address", value, f"{what} {value!r} is refused: its host cannot be read", None)
        return
    host, port = found
    authority = f"[{host}]" if ":" in host else host
    yield from _address_finding(what, value, authority if port is None else f"{authority}:{port}", allowed)


def registry_of(reference: str) -> str | None:
    """The registry a reference names (`127.0.0.1:5000/app` -> `127.0.0.1:5000`); None: Docker Hub.

    moby's reference parsing takes the first component as a registry when it holds `.` or `:`, is
    `localhost`, or has capitals (search terms: the same, less capitals; refusing more is safe).
    """
    first, slash, _ = reference.partition("/")
    if not slash:
        return None
    if any(c in first for c in ".:[") or first.lower() == "localhost" or first != first.lower():
        return first
    return None


def reference(what: str, value: str, allowed: Allowed) -> Iterator[Finding]:
    """The address rule for an image or plugin reference (pull, push, distribution, search)."""
    registry = registry_of(value)
    if registry is not None:
        yield from _address_finding(what, value, registry, allowed)


def server_address(value: str, allowed: Allowed) -> Iterator[Finding]:
    """`/auth`'s serveraddress: the daemon adds https:// when there is no scheme and dials its host."""
    lower = value.lower()
    rest = value[len("https://") :] if lower.startswith("https://") else value
    rest = rest[len("http://") :] if lower.startswith("http://") else rest
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    # Both sides of a userinfo `@`: what Go's URL parser dials, and what a looser reader would.
    for candidate in dict.fromkeys((authority.rpartition("@")[2], authority.partition("@")[0])):
        yield from _address_finding("login serveraddress", value, candidate, allowed)


# --- the endpoints ----------------------------------------------------------------------------


def build_remote(values: Iterable[str], allowed: Allowed) -> Iterator[Finding]:
    for value in values:
        if not value:
            continue
        if is_git_remote(value):
            # The daemon runs git as root on the host: over SSH with the host's keys, and its
            # `git submodule update` follows whatever protocol a `.gitmodules` names.
            yield refuse(
                "git-remote",
                "remote",
                f"build remote={value} is refused: the daemon would clone it with git as the host's root "
                "(with the host's SSH keys, and submodules over any protocol)",
                GIT_INSTEAD,
            )
        elif value.lower().startswith(_HTTP):
            yield from url("build remote", value, allowed)


def image_create(query: Mapping[str, tuple[str, ...]], allowed: Allowed) -> Iterator[Finding]:
    for image in query.get("fromImage", ()):
        yield from reference("pull of", image, allowed)
    for source in query.get("fromSrc", ()):
        if source in ("", "-"):
            continue  # "-": the tarball is the request's own body
        # The daemon's own reading: without "://" the whole value is an http:// host and path.
        yield from url("import fromSrc", source if "://" in source else f"http://{source}", allowed)


def image_search(query: Mapping[str, tuple[str, ...]], allowed: Allowed) -> Iterator[Finding]:
    for term in query.get("term", ()):
        yield from reference("search term", term, allowed)


def plugin_privileges(query: Mapping[str, tuple[str, ...]], allowed: Allowed) -> Iterator[Finding]:
    for remote in query.get("remote", ()):
        yield from reference("plugin", remote, allowed)


def auth(body: Mapping[str, Any], allowed: Allowed) -> Iterator[Finding]:
    address = body.get("serveraddress")
    if isinstance(address, str) and address:
        yield from server_address(address, allowed)
