"""Pinned bind sources: what the daemon mounts is exactly what the gate checked.

A bind source is checked when the container is created and mounted when it starts, by path. Between
the two a tenant can swap a directory it controls (inside an admitted bind) for a symlink to `/dev`,
and the daemon would follow it. So the gate never hands the daemon the tenant's path: it opens the
checked path one component at a time with `O_NOFOLLOW` (a symlink anywhere refuses the request),
bind-mounts the opened object onto a staging path in a root-only directory, and rewrites the request
to that staging path. The staging mount holds the checked inode whatever happens to the path later.

Every pin is mounted nosuid,nodev (`harden`): a set-user-ID program or a device node a container
makes in a bind gives nobody anything through it, nor through the container's bind, which copies
the flags of the pin it is taken from.

Pins are keyed by the object they hold (device, inode, read-only), so binding the same directory
again reuses its pin; `release_all` unmounts a repo's pins when the repo goes down. The worker
processes of one gate pin into the same directory, so pinning holds a lock on `<directory>.lock`:
one process at a time checks, mounts and records. Each pin is also
recorded (staging name -> source) in an index kept with the repo's state, so that a gate starting
after `rdc repo down` or a reboot can pin the same sources again (`restore`), each re-checked first:
a stopped container and a bind-backed volume keep working, and one whose source is no longer allowed
finds nothing to mount.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

MAX_PINS = 512  # distinct bind sources per repo while it runs; a bound on mounts one tenant can add

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOSYMFOLLOW = 256
_MS_BIND = 4096
_MS_REC = 16384
_MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def directory_for(run_dir: Path, repo_id: str) -> Path:
    """Where one repo's pins live: under the machine's runtime directory, which no bind may reach."""
    return run_dir / "pins" / repo_id


class PinError(Exception):
    """The source cannot be pinned; the message says why (the request is refused with it)."""


def _mount(source: str, target: str, flags: int) -> None:
    if _libc.mount(os.fsencode(source), os.fsencode(target), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def bind(source: str, target: str, *, recursive: bool = False) -> None:
    """Bind-mount `source` on `target` (with the mounts below it when `recursive`)."""
    _mount(source, target, _MS_BIND | (_MS_REC if recursive else 0))


_ST_NOSYMFOLLOW = 0x2000  # statvfs's flag, which Python's os module does not name
# statvfs flags of a mount that a bind remount would otherwise clear, and their mount(2) flags. The
# atime flags are not listed: a remount that names none keeps them.
_KEPT_FLAGS = ((os.ST_RDONLY, _MS_RDONLY), (os.ST_NOEXEC, _MS_NOEXEC), (_ST_NOSYMFOLLOW, _MS_NOSYMFOLLOW))


def hardened(target: str) -> bool:
    """Whether the mount `target` lies on ignores set-user-ID bits and refuses device nodes."""
    flags = os.statvfs(target).f_flag
    return flags & os.ST_NOSUID != 0 and flags & os.ST_NODEV != 0


def harden(target: str, *, read_only: bool = False) -> None:
    """Remount the bind mounted on `target` nosuid,nodev (and read-only when asked), keeping its
    other flags (a bind remount sets them all at once)."""
    current = os.statvfs(target).f_flag
    kept = sum(flag for statvfs_flag, flag in _KEPT_FLAGS if current & statvfs_flag)
    extra = _MS_RDONLY if read_only else 0
    _mount("none", target, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | kept | extra)


def _umount(target: str) -> None:
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def open_no_symlinks(path: str, *, create_dirs: bool = False) -> int:
    """An O_PATH descriptor of `path` (absolute, normalised) reached without following any symlink.

    With `create_dirs`, missing directories are created (0755), as the daemon does for a missing
    bind source; a symlink or a non-directory on the way is a PinError.
    """
    parts = [p for p in path.split("/") if p]
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                child = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create_dirs:
                    raise PinError(f"{path} does not exist") from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, flags, dir_fd=fd)
            mode = os.fstat(child).st_mode
            if stat.S_ISLNK(mode):
                os.close(child)
                shown = "/" + "/".join(parts[: index + 1])
                raise PinError(f"{shown} became a symlink while it was checked")
            if not last and not stat.S_ISDIR(mode):
                os.close(child)
                raise PinError(f"{'/' + '/'.join(parts[: index + 1])} is not a directory")
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


class Pins:
    """The staging mounts of one repo, under `directory` (root-only, never bindable by a tenant)."""

    def __init__(self, directory: Path, index: Path | None = None) -> None:
        self.directory = directory
        self.index = index  # where pins are recorded for `restore`; None: not recorded
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's threads, then every process pinning for this repo, one at a time."""
        with self._lock:
            lock = lock_path(self.directory)
            lock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the lock

    def pin(self, path: str, *, read_only: bool, create_dirs: bool = False) -> str:
        """Pin `path` (already checked by its resolved form) and return the staging path to hand out."""
        with self._locked():
            fd = open_no_symlinks(path, create_dirs=create_dirs)
            try:
                info = os.fstat(fd)
                name = pin_name(info, read_only=read_only)
                target = self.directory / name
                if self._holds(target, info):
                    if not hardened(str(target)):  # pinned by a gate from before pins were hardened
                        harden(str(target), read_only=read_only)
                    return str(target)
                self._prepare(target, is_dir=stat.S_ISDIR(info.st_mode))
                bind(f"/proc/self/fd/{fd}", str(target))
                try:
                    harden(str(target), read_only=read_only)
                except OSError:
                    _umount(str(target))
                    raise
                self._record(name, path, read_only)
                return str(target)
            finally:
                os.close(fd)

    def _recorded(self) -> dict[str, dict[str, object]]:
        if self.index is None:
            return {}
        try:
            found = json.loads(self.index.read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _record(self, name: str, source: str, read_only: bool) -> None:
        if self.index is None:
            return
        from rediacc_core.files import atomic_write_json

        recorded = self._recorded()
        if recorded.get(name) == {"source": source, "readOnly": read_only}:
            return
        recorded[name] = {"source": source, "readOnly": read_only}
        atomic_write_json(self.index, recorded)

    def restore(self, allowed: Callable[[str], bool | None]) -> list[str]:
        """Pin again every recorded source that `allowed` still admits (it returns whether the source
        must be read-only, or None to refuse it). Returns the staging paths pinned."""
        restored: list[str] = []
        for name, entry in sorted(self._recorded().items()):
            source = entry.get("source")
            if not isinstance(source, str):
                continue
            read_only = allowed(source)
            if read_only is None:
                continue
            with contextlib.suppress(PinError, OSError):
                staged = self.pin(source, read_only=read_only)
                if Path(staged).name == name:
                    restored.append(staged)
        return restored

    def _holds(self, target: Path, info: os.stat_result) -> bool:
        try:
            held = os.stat(target, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (held.st_dev, held.st_ino) == (info.st_dev, info.st_ino)

    def _prepare(self, target: Path, *, is_dir: bool) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)
        if target.exists() or target.is_symlink():
            _umount(str(target))  # a stale pin of an object since replaced
            if target.is_dir():
                target.rmdir()
            else:
                target.unlink()
        if len(os.listdir(self.directory)) >= MAX_PINS:
            raise PinError(
                f"this repo already binds {MAX_PINS} distinct host paths; restart it (rdc repo down/up) "
                "or bind fewer, larger directories"
            )
        if is_dir:
            target.mkdir(mode=0o700)
        else:
            target.touch(mode=0o600)


def pin_name(info: os.stat_result, *, read_only: bool) -> str:
    """A pin's staging name: the object it holds (a fork re-keys its copies by it, `runtime.fork`)."""
    return f"{info.st_dev:x}-{info.st_ino:x}" + ("-ro" if read_only else "")


def lock_path(directory: Path) -> Path:
    """The lock the processes pinning into `directory` take (beside it: `release_all` removes it)."""
    return directory.with_name(directory.name + ".lock")


def release_all(directory: Path) -> list[str]:
    """Unmount and remove every pin under `directory`; returns the staging paths released."""
    released: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        lock_path(directory).unlink()  # the gate is down: nobody pins
    if not directory.is_dir():
        return released
    for entry in sorted(directory.iterdir()):
        _umount(str(entry))
        with contextlib.suppress(OSError):
            if entry.is_dir():
                entry.rmdir()
            else:
                entry.unlink()
        released.append(str(entry))
    with contextlib.suppress(OSError):
        directory.rmdir()
    return released
