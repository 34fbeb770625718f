"""What a container may mount from the host: binds only under allowed roots, volumes only of safe kinds.

Allowed roots are the repo's own files directory (`/var/lib/rediacc/repos/<id>/files`, made by
`rdc repo create`) and the machine's `bind-roots` setting (`/data/sets:ro` forces read-only). Never
allowed, even when listed: `/`, `/dev`, `/sys`, `/proc`, the machine's state and runtime
(`/etc/rediacc`, `/etc/cdi`, `/run/rediacc`, `/var/lib/rediacc` outside the repo's own files), and
the daemons' sockets and state (docker, containerd). A source is judged by where it resolves on the
host, and an admitted one is pinned (`pins.py`), so what the daemon mounts is what was checked.

Local volumes may be plain (no options), `tmpfs` with size/mode/owner options, or `o=bind` of an
allowed path (pinned too); other filesystem types (`proc`, `sysfs`, `cgroup`, `overlay`, block
devices, network filesystems) are refused, and other volume drivers unless the machine allows them
(`volume-drivers`).
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.policy.pins import PinError, Pins

# Host paths no bind may reach, equal, below or above (binding /var would hand over /var/lib/docker).
_NEVER = (
    "/dev",
    "/sys",
    "/proc",
    "/boot",
    "/etc/rediacc",
    "/etc/cdi",
    "/run/rediacc",
    "/var/run/rediacc",
    "/var/lib/rediacc",
    "/run/docker",
    "/var/run/docker",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/var/lib/docker",
    "/run/containerd",
    "/var/run/containerd",
    "/var/lib/containerd",
)
_NEVER_MACHINE = ("/dev", "/sys", "/proc", "/etc/rediacc", "/etc/cdi", "/run/rediacc", "/var/lib/rediacc")
LOCAL_DRIVERS = frozenset({"", "local"})
_TMPFS_OPTIONS = frozenset(
    {"size", "mode", "uid", "gid", "nr_inodes", "nr_blocks", "noexec", "exec", "nosuid", "nodev", "ro", "rw"}
)
_BIND_OPTIONS = frozenset({"bind", "rbind", "ro", "rw"})
_BIND_MODES = frozenset(
    {"ro", "rw", "z", "Z", "nocopy", "shared", "rshared", "slave", "rslave", "private", "rprivate"}
)
ROOTS_HINT = "a path under the repo's files directory ({files}) or one of the machine's bind roots ({roots})"
# runc makes a container's other mounts (tmpfs, volumes, nested binds) inside its binds, so with a
# shared bind they propagate out to the host's copy of the source and outlive the container.
_SHARED_PROPAGATION = frozenset({"shared", "rshared"})
_SHARED_REFUSED = "shared propagation is refused (the container's mounts would appear on the host)"
_PROPAGATION_INSTEAD = "the default propagation (rprivate), or slave/rslave to see host mounts appear inside"


@dataclass(frozen=True)
class Root:
    path: str  # host path, resolved
    read_only: bool


@dataclass(frozen=True)
class BindPolicy:
    """Where this repo's binds may come from, as host paths."""

    files_dir: str  # the repo's own files directory (resolved host path)
    roots: tuple[Root, ...]  # the files directory first, then the operator's bind roots
    never: tuple[str, ...]  # resolved host paths no bind may touch
    volume_drivers: frozenset[str]
    pins: Pins | None  # None: check only (nothing is admitted without pinning)

    def hint(self) -> str:
        extra = [r.path + (":ro" if r.read_only else "") for r in self.roots[1:]]
        return ROOTS_HINT.format(files=self.files_dir, roots=", ".join(extra) or "none set")


def _under(path: str, top: str) -> bool:
    return path == top or top == "/" or path.startswith(top.rstrip("/") + "/")


def never_paths(machine_path: Any) -> tuple[str, ...]:
    """The forbidden host paths: the host's own and, on a directory-rooted machine, the machine's."""
    found = {os.path.realpath(p) for p in _NEVER} | set(_NEVER)
    found |= {os.path.realpath(machine_path(p)) for p in _NEVER_MACHINE}
    return tuple(sorted(found))


def check_root_setting(path: str) -> str | None:
    """Why `path` can never be a bind root (None when it can)."""
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or path == "/":
        return "it must be an absolute, normalised path other than /"
    for top in _NEVER:
        if _under(path, top) or _under(top, path):
            return f"it overlaps {top}, which no container may reach"
    return None


class _Refusal(Exception):
    def __init__(self, message: str, rule: str = "bind-root") -> None:
        super().__init__(message)
        self.rule = rule


CDI_INSTEAD = "a CDI grant: --device <vendor>/<class>=<name> (`rdc machine gpu list` shows the names)"
_HARDWARE = ("/dev", "/sys")


def _resolve(policy: BindPolicy, source: str, field: str) -> tuple[str, Root]:
    """The host path `source` resolves to and the root that admits it, or _Refusal with the reason."""
    if not source.startswith("/"):
        raise _Refusal(f"{field} {source!r} is not an absolute path")
    resolved = os.path.realpath(source)
    for top in policy.never:
        if _under(resolved, top) and not _under(resolved, policy.files_dir):
            shown = f"{source} (resolves to {resolved})" if resolved != source else source
            rule = "dev-mount" if top.endswith(_HARDWARE) else "bind-root"
            raise _Refusal(
                f"{field} {shown} is refused: it is under {top}, which no container may reach", rule
            )
        if _under(top, resolved):
            rule = "dev-mount" if top.endswith(_HARDWARE) else "bind-root"
            raise _Refusal(
                f"{field} {source} is refused: it contains {top}, which no container may reach", rule
            )
    with_root = next((r for r in policy.roots if _under(resolved, r.path)), None)
    if with_root is None:
        shown = f"{source} (resolves to {resolved})" if resolved != source else source
        raise _Refusal(f"{field} {shown} is refused: it is outside the allowed bind roots")
    try:
        mode = os.stat(resolved).st_mode
    except OSError:
        return resolved, with_root
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise _Refusal(f"{field} {source} is refused: it is a device node", "dev-mount")
    return resolved, with_root


def admits(policy: BindPolicy, source: str) -> bool | None:
    """Whether `source` may be bound now: None if not, else whether it must be read-only."""
    try:
        _, root = _resolve(policy, source, "bind of")
    except _Refusal:
        return None
    return root.read_only


def _pin(policy: BindPolicy, resolved: str, root: Root, *, create: bool) -> str:
    if policy.pins is None:
        return resolved
    try:
        return policy.pins.pin(resolved, read_only=root.read_only, create_dirs=create)
    except PinError as exc:
        raise _Refusal(f"bind source {resolved} cannot be used: {exc}") from None
    except OSError as exc:
        raise _Refusal(f"bind source {resolved} cannot be pinned: {exc.strerror or exc}") from None


# What to use instead, for the rules whose answer is not "a path under the allowed roots".
_INSTEAD = {"dev-mount": CDI_INSTEAD, "mount-propagation": _PROPAGATION_INSTEAD}


def _finding(rule: str, subject: str, message: str, policy: BindPolicy) -> Finding:
    return refuse(rule, subject, message, _INSTEAD.get(rule) or policy.hint())


# --- HostConfig.Binds ------------------------------------------------------------------------


def split_bind(bind: str) -> tuple[str, str, str] | None:
    """(source, target, mode) of a Linux bind spec; None for an anonymous volume (`/target`)."""
    parts = bind.split(":")
    if len(parts) == 1:
        return None
    if len(parts) > 3:
        raise _Refusal(f"bind {bind!r} has too many ':' separated parts")
    source, target = parts[0], parts[1]
    return source, target, parts[2] if len(parts) == 3 else ""


def binds(host: dict[str, Any], policy: BindPolicy) -> Iterator[Finding]:
    """Check (and, when pinning, rewrite) `HostConfig.Binds` in place."""
    values = host.get("Binds")
    if not isinstance(values, list):
        return
    rewritten: list[Any] = []
    for bind in values:
        try:
            rewritten.append(_bind(bind, policy) if isinstance(bind, str) else bind)
        except _Refusal as exc:
            yield _finding(exc.rule, bind.split(":", 1)[0], str(exc), policy)
            rewritten.append(bind)
    host["Binds"] = rewritten


def _bind(bind: str, policy: BindPolicy) -> str:
    parts = split_bind(bind)
    if parts is None:
        return bind
    source, target, mode = parts
    modes = [m for m in mode.split(",") if m]
    unknown = [m for m in modes if m not in _BIND_MODES]
    if unknown:
        raise _Refusal(f"bind {bind!r}: unknown option {', '.join(unknown)}")
    if _SHARED_PROPAGATION.intersection(modes):
        raise _Refusal(f"bind {bind!r}: {_SHARED_REFUSED}", "mount-propagation")
    if not source.startswith("/"):
        return bind  # a named volume: its driver and options were checked when it was created
    resolved, root = _resolve(policy, source, "bind of")
    staged = _pin(policy, resolved, root, create=True)
    if root.read_only:
        modes = [m for m in modes if m not in ("ro", "rw")] + ["ro"]
    return ":".join([staged, target] + ([",".join(modes)] if modes else []))


# --- HostConfig.Mounts -----------------------------------------------------------------------


def mounts(host: dict[str, Any], policy: BindPolicy) -> Iterator[Finding]:
    for index, mount in enumerate(host.get("Mounts") or []):
        if not isinstance(mount, dict):
            continue
        where = f"HostConfig.Mounts[{index}]"
        try:
            yield from _mount(mount, policy, where)
        except _Refusal as exc:
            yield _finding(exc.rule, str(mount.get("Source") or ""), str(exc), policy)


def _mount(mount: dict[str, Any], policy: BindPolicy, where: str) -> Iterator[Finding]:
    kind = mount.get("Type") or ""
    source = mount.get("Source") or ""
    if kind == "bind":
        if (mount.get("BindOptions") or {}).get("Propagation") in _SHARED_PROPAGATION:
            raise _Refusal(f"{where} bind of {source}: {_SHARED_REFUSED}", "mount-propagation")
        resolved, root = _resolve(policy, source, f"{where} bind of")
        mount["Source"] = _pin(policy, resolved, root, create=False)
        if root.read_only:
            mount["ReadOnly"] = True
    elif kind == "volume":
        options = mount.get("VolumeOptions") or {}
        driver = (options.get("DriverConfig") or {}).get("Name") or ""
        opts = (options.get("DriverConfig") or {}).get("Options") or {}
        yield from volume(driver, opts, policy, f"{where} volume {source or '(anonymous)'}")
        subpath = options.get("Subpath") or ""
        if subpath.startswith("/") or ".." in subpath.split("/"):
            yield _finding(
                "volume-subpath", subpath, f"{where} volume subpath {subpath!r} leaves the volume", policy
            )
    elif kind == "tmpfs":
        flags = [f for group in ((mount.get("TmpfsOptions") or {}).get("Options") or []) for f in group[:1]]
        yield from _tmpfs_flags(flags, f"{where} tmpfs")
    elif kind != "image":
        yield refuse(
            "mount-type",
            kind,
            f"{where} of type {kind!r} is refused",
            "a bind (under the allowed roots), volume, tmpfs or image mount",
        )


def _tmpfs_flags(flags: list[str], what: str) -> Iterator[Finding]:
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name not in _TMPFS_OPTIONS:
            yield refuse(
                "tmpfs-option",
                flag,
                f"{what} option {flag!r} is refused",
                "tmpfs options size, mode, uid, gid, nr_inodes, noexec, nosuid, nodev, ro",
            )


def tmpfs(host: Mapping[str, Any]) -> Iterator[Finding]:
    for path, options in (host.get("Tmpfs") or {}).items():
        flags = [o.strip() for o in (options or "").split(",") if o.strip()]
        yield from _tmpfs_flags(flags, f"HostConfig.Tmpfs {path}")


# --- volumes (POST /volumes/create, and volumes a mount creates) ------------------------------


def volume(driver: str, options: dict[str, Any], policy: BindPolicy, what: str) -> Iterator[Finding]:
    """Check a volume's driver and options; an `o=bind` device is rewritten to its pinned path."""
    if driver not in LOCAL_DRIVERS:
        if driver not in policy.volume_drivers:
            yield refuse(
                "volume-driver",
                driver,
                f"{what}: volume driver {driver!r} is refused",
                "the local driver, or ask the operator: rdc machine config M --set volume-drivers=" + driver,
            )
        return
    if not options:
        return
    kind = options.get("type") or ""
    mount_options = [o.strip() for o in (options.get("o") or "").split(",") if o.strip()]
    unknown_keys = sorted(set(options) - {"type", "device", "o"})
    if unknown_keys:
        yield refuse(
            "volume-type",
            ",".join(unknown_keys),
            f"{what}: local volume option {', '.join(unknown_keys)} is refused",
            "a plain local volume, type=tmpfs, or o=bind of an allowed path",
        )
        return
    names = {o.split("=", 1)[0] for o in mount_options}
    if kind == "tmpfs":
        yield from _tmpfs_flags(mount_options, f"{what} tmpfs")
        return
    if kind in ("", "none") and names & {"bind", "rbind"}:
        extra = sorted(names - _BIND_OPTIONS)
        if extra:
            yield _finding(
                "volume-type", ",".join(extra), f"{what}: bind option {', '.join(extra)} refused", policy
            )
            return
        try:
            resolved, root = _resolve(policy, options.get("device") or "", f"{what} device")
            options["device"] = _pin(policy, resolved, root, create=False)
        except _Refusal as exc:
            yield _finding(exc.rule, str(options.get("device") or ""), str(exc), policy)
            return
        if root.read_only and "ro" not in names:
            options["o"] = ",".join([o for o in mount_options if o != "rw"] + ["ro"])
        return
    shown = kind or "(none)"
    yield refuse(
        "volume-type",
        shown,
        f"{what}: local volume of type {shown} is refused (it would mount a host filesystem)",
        "a plain local volume, type=tmpfs, or o=bind of an allowed path",
    )
