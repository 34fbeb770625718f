"""A repo's files give host users nothing: what a container leaves there (a set-user-ID-root program, a
0666 device node) is out of their reach (0700 state directory) and, where they reach it anyway, inert
(the files directory is mounted nosuid,nodev); `rdc repo down` leaves no mount of it behind.

Container root is host root, so each case is made by a container of the repo, through an ordinary
bind of its files directory, and tried as the host user `nobody`. Each has its control: the same
file made by host root in a directory of the host's own works for `nobody`, so what stops it under
the files directory is the mount.
"""

from __future__ import annotations

import os
import platform
import shutil
import stat
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv

from rediacc_core.repos import files_dir, repo_state_dir
from rediacc_core.runtime import filesmount

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]

# The machine code of `exit(geteuid())`: the program's exit status is the low byte of its euid.
_EXIT_EUID = {
    # mov eax, 107 (geteuid); syscall; mov edi, eax; mov eax, 60 (exit); syscall
    "x86_64": (0x3E, bytes.fromhex("b86b0000000f0589c7b83c0000000f05")),
    # mov x8, #175 (geteuid); svc #0; mov x8, #93 (exit); svc #0 (the result stays in x0)
    "aarch64": (0xB7, bytes.fromhex("e81580d2010000d4a80b80d2010000d4")),
}


def exit_euid_program() -> bytes:
    """A static ELF executable that exits with its effective uid (a smallest, shell-free setuid test)."""
    if platform.machine() not in _EXIT_EUID:
        pytest.skip(f"no exit-with-euid program for {platform.machine()}")
    machine, code = _EXIT_EUID[platform.machine()]
    base, headers = 0x400000, 64 + 56
    size = headers + len(code)
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)  # 64-bit, little-endian, version 1
    elf = struct.pack("<16sHHIQQQIHHHHHH", ident, 2, machine, 1, base + headers, 64, 0, 0, 64, 56, 1, 0, 0, 0)
    load = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # one PT_LOAD, r-x
    return elf + load + code


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AS_NOBODY, *argv], capture_output=True, text=True, timeout=30, cwd="/")


def modes(*paths: Path) -> list[str]:
    return [oct(p.stat().st_mode & 0o777) for p in paths]


def files_mounts(files: Path) -> list[str]:
    """The lines of /proc/self/mountinfo for mounts on the files directory itself."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if line.split(" ")[4] == str(files)]


@pytest.fixture
def reachable(e2e: E2E) -> Iterator[Path]:
    """Alpha's files directory with every directory above it traversable by others, as on a host where
    the modes were loosened by hand (or set by an rdc before this one); `rdc repo up` fixes them."""
    files = files_dir(e2e.machine, e2e.alpha.repo.id)
    above = [p for p in files.parents if p != Path("/")][::-1]
    before = {p: p.stat().st_mode & 0o777 for p in above}
    for directory in above:
        directory.chmod(before[directory] | 0o711)
    try:
        yield files
    finally:
        for directory, mode in before.items():
            directory.chmod(mode)


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A directory of the host's own that `nobody` can reach (the control)."""
    path = Path(tempfile.mkdtemp(prefix="rdch", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plant(env: RepoEnv, files: Path, where: str) -> Path:
    """A container of the repo writes, through a bind of its files directory, a set-user-ID-root
    program, a 0666 char device (1,3) and a set-user-ID busybox; returns the host directory."""
    target = files / where
    run = env.docker(
        "run", "--rm", "-i", "--network", "none", "-v", f"{target}:/f", IMAGE, "sh", "-c",
        "cat > /f/euid && chown 0:0 /f/euid && chmod 4755 /f/euid"
        " && mknod -m 666 /f/null c 1 3 && cp /bin/busybox /f/busybox && chmod 4755 /f/busybox"
        " && echo written > /f/note && grep ' /f ' /proc/mounts",
        input=exit_euid_program(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # The container's bind is taken from the gate's pin, itself from the files directory's mount:
    # it inherits nosuid,nodev, and the container still writes there.
    assert {"nosuid", "nodev"} <= set(run.stdout.split()[3].split(",")), run.stdout
    made = os.stat(target / "euid")
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (0, 0o4755)
    assert stat.S_ISCHR(os.stat(target / "null").st_mode) and (target / "note").read_text() == "written\n"
    return target


def test_a_setuid_program_and_a_device_node_made_in_a_container_give_a_host_user_nothing(
    e2e: E2E, reachable: Path, host_dir: Path
) -> None:
    planted = plant(e2e.alpha, reachable, "iso")
    # Control: the same program, set-user-ID root in the host's own directory, runs as root for
    # nobody, and the same node opens.
    control = host_dir / "euid"
    shutil.copy(planted / "euid", control)
    control.chmod(0o4755)
    os.mknod(host_dir / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert as_nobody(str(control)).returncode == 0  # euid 0
    assert as_nobody("head", "-c", "0", str(host_dir / "null")).returncode == 0

    # Under the files directory: the set-user-ID bit does nothing, the node does not open.
    assert as_nobody(str(planted / "euid")).returncode == NOBODY & 0xFF
    assert as_nobody("stat", str(planted / "null")).returncode == 0  # nobody reaches it...
    opened = as_nobody("head", "-c", "0", str(planted / "null"))
    assert opened.returncode != 0 and "Permission denied" in opened.stderr  # ...nodev refuses to open it
    # A set-user-ID busybox as a tenant would copy it: `su` needs euid 0 and says it has not got it.
    su = subprocess.run(
        [*AS_NOBODY, str(planted / "busybox"), "su", "-c", "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "must be suid" in su.stderr, su.stderr
    assert as_nobody(str(planted / "busybox"), "id", "-u").stdout.strip() == str(NOBODY)
    # A read-only bind of it inside a container is nosuid,nodev too (runc's read-only remount keeps them).
    ro = e2e.alpha.docker(
        "run", "--rm", "--network", "none", "-v", f"{planted}:/f:ro", IMAGE, "grep", " /f ", "/proc/mounts"
    )  # fmt: skip
    assert ro.returncode == 0, ro.stderr
    assert {"ro", "nosuid", "nodev"} <= set(ro.stdout.split()[3].split(",")), ro.stdout


def test_rdc_repo_up_makes_the_state_directory_root_only_and_nobody_cannot_enter_it(
    e2e: E2E, reachable: Path
) -> None:
    planted = plant(e2e.alpha, reachable, "private")
    state = repo_state_dir(e2e.machine, e2e.alpha.repo.id)
    assert modes(state.parent, state) == ["0o711", "0o711"]  # loosened, as an older rdc left them
    up = e2e.rdc("repo", "up", e2e.alpha.repo.ref)  # alpha is up: this only fixes what it must
    assert up.returncode == 0, up.stderr
    assert modes(state.parent, state) == ["0o700", "0o700"]
    assert len(files_mounts(reachable)) == 1  # its files directory's mount, not a second one
    for path in (state, planted / "euid", planted / "null"):
        tried = as_nobody("stat", str(path))
        assert tried.returncode != 0 and "Permission denied" in tried.stderr, (path, tried.stderr)


@pytest.fixture
def eta(e2e: E2E) -> Iterator[RepoEnv]:
    with e2e.extra_repo("eta", image=False) as env:
        yield env


def test_the_files_directory_is_one_nosuid_nodev_mount_while_up_and_none_after_down(
    e2e: E2E, eta: RepoEnv
) -> None:
    files = files_dir(e2e.machine, eta.repo.id)
    mounted = files_mounts(files)
    assert len(mounted) == 1 and {"nosuid", "nodev"} <= set(mounted[0].split(" ")[5].split(","))
    again = e2e.rdc("repo", "up", eta.repo.ref)
    assert again.returncode == 0, again.stderr
    assert files_mounts(files) == mounted  # up again adds none

    down = e2e.rdc("repo", "down", eta.repo.ref)
    assert down.returncode == 0, down.stderr
    assert files_mounts(files) == [] and not filesmount.marker_path(files).exists()
    assert e2e.rdc("repo", "down", eta.repo.ref).returncode == 0  # down again: nothing to undo

    up = e2e.rdc("repo", "up", eta.repo.ref)  # and up after down mounts it again
    assert up.returncode == 0, up.stderr
    assert len(files_mounts(files)) == 1
