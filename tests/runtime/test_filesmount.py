"""A repo's files directory is a nosuid,nodev mount while the repo is up, made once and taken off once.

Reading /proc/self/mountinfo and the marker needs nothing; mounting (real mounts, under /tmp) needs root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core.errors import StateError
from rediacc_core.repos import RepoStore, files_dir
from rediacc_core.runtime import filesmount
from rediacc_core.runtime.filesmount import Mount
from rediacc_core.testing import FakeMachine

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts)")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def files() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="rdfm", dir="/tmp"))
    files = base / "state" / "files"
    files.mkdir(parents=True)
    yield files
    for _ in range(4):  # whatever a failing test left stacked
        if filesmount.top_at(str(files), filesmount.read_mountinfo()) is None:
            break
        subprocess.run(["umount", "-l", str(files)], check=False)
    shutil.rmtree(base, ignore_errors=True)


def mounts_at(path: Path) -> list[Mount]:
    return [m for m in filesmount.read_mountinfo() if m.point == str(path)]


def nosuid_nodev(path: Path) -> bool:
    flags = os.statvfs(path).f_flag
    return bool(flags & os.ST_NOSUID and flags & os.ST_NODEV)


# --- reading mountinfo and the marker ----------------------------------------------------------


def test_mountinfo_lines_give_ids_parents_and_unescaped_points() -> None:
    text = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "46 27 254:0 /srv/a\\040b /srv/a\\040b\\011c rw,nosuid,nodev - ext4 /dev/vda rw\n"
        "garbage\n"
    )
    assert filesmount.parse_mountinfo(text) == [Mount(27, 1, "/"), Mount(46, 27, "/srv/a b\tc")]


def test_the_top_of_a_stack_is_the_mount_nothing_is_stacked_on() -> None:
    mounts = [Mount(27, 1, "/"), Mount(50, 27, "/f"), Mount(51, 50, "/f"), Mount(52, 51, "/f/sub")]
    assert filesmount.top_at("/f", mounts) == Mount(51, 50, "/f")
    assert filesmount.top_at("/f/sub", mounts) == Mount(52, 51, "/f/sub")
    assert filesmount.top_at("/elsewhere", mounts) is None


def test_the_marker_counts_only_in_its_boot_and_only_for_a_mount_still_on_the_directory(
    tmp_path: Path,
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    marker = filesmount.marker_path(files)
    assert marker == tmp_path / "files.mount"
    here = [Mount(27, 1, "/"), Mount(60, 27, str(files))]
    assert filesmount.recorded(files, here) is None  # no marker

    marker.write_text(json.dumps({"bootId": BOOT_ID, "mountId": 60}))
    assert filesmount.recorded(files, here) == Mount(60, 27, str(files))
    assert filesmount.recorded(files, [Mount(60, 27, "/somewhere/else")]) is None  # id reused elsewhere
    assert filesmount.recorded(files, here[:1]) is None  # unmounted since

    marker.write_text(json.dumps({"bootId": "another-boot", "mountId": 60}))
    assert filesmount.recorded(files, here) is None
    marker.write_text("{half a fil")
    assert filesmount.recorded(files, here) is None


# --- who mounts ---------------------------------------------------------------------------------


def test_a_gate_that_is_not_root_mounts_nothing(
    fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = RepoStore(fake_machine.machine).create("alpha")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    filesmount.secure_repo(fake_machine.machine, repo.id)
    files = files_dir(fake_machine.machine, repo.id)
    assert mounts_at(files) == [] and not filesmount.marker_path(files).exists()


# --- mounting ----------------------------------------------------------------------------------


@as_root
def test_secure_mounts_the_directory_nosuid_nodev_once_and_release_takes_it_off(files: Path) -> None:
    assert not nosuid_nodev(files)
    assert filesmount.secure(files) is True
    assert nosuid_nodev(files) and len(mounts_at(files)) == 1
    recorded = json.loads(filesmount.marker_path(files).read_text())
    assert recorded == {"bootId": BOOT_ID, "mountId": mounts_at(files)[0].mount_id}

    assert filesmount.secure(files) is False  # a second `rdc repo up`, or a gate restarted
    assert len(mounts_at(files)) == 1

    assert filesmount.release(files, "alpha@m1") is True
    assert mounts_at(files) == [] and not filesmount.marker_path(files).exists()
    assert filesmount.release(files, "alpha@m1") is False  # `rdc repo down` again


@as_root
def test_a_mount_remounted_without_the_flags_is_hardened_again_not_stacked(files: Path) -> None:
    filesmount.secure(files)
    subprocess.run(["mount", "-o", "remount,bind,suid,dev", str(files)], check=True)
    assert not nosuid_nodev(files)
    assert filesmount.secure(files) is True
    assert nosuid_nodev(files) and len(mounts_at(files)) == 1
    filesmount.release(files, "alpha@m1")


@as_root
def test_a_marker_from_before_a_crash_and_reboot_is_replaced(files: Path) -> None:
    filesmount.marker_path(files).write_text(json.dumps({"bootId": "before-reboot", "mountId": 1}))
    assert filesmount.release(files, "alpha@m1") is False  # nothing of this boot to take off
    assert not filesmount.marker_path(files).exists()
    filesmount.marker_path(files).write_text(json.dumps({"bootId": "before-reboot", "mountId": 1}))
    assert filesmount.secure(files) is True
    assert json.loads(filesmount.marker_path(files).read_text())["bootId"] == BOOT_ID
    assert filesmount.release(files, "alpha@m1") is True and mounts_at(files) == []


@as_root
def test_a_directory_the_host_already_mounts_nosuid_nodev_needs_no_mount(files: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nosuid,nodev", "tmpfs", str(files)], check=True)
    try:
        assert filesmount.secure(files) is False
        assert len(mounts_at(files)) == 1 and not filesmount.marker_path(files).exists()
        assert filesmount.release(files, "alpha@m1") is False
        assert len(mounts_at(files)) == 1  # the host's own mount stays
    finally:
        subprocess.run(["umount", str(files)], check=True)


@as_root
def test_what_the_operator_mounted_below_stays_visible_and_keeps_its_flags(files: Path) -> None:
    below = files / "datasets"
    below.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec", "tmpfs", str(below)], check=True)
    (below / "set.csv").write_text("a,b\n")
    try:
        filesmount.secure(files)
        assert (below / "set.csv").read_text() == "a,b\n"
        assert os.statvfs(below).f_flag & os.ST_NOEXEC
        filesmount.release(files, "alpha@m1")
        assert (below / "set.csv").exists()
    finally:
        subprocess.run(["umount", str(below)], check=True)


@as_root
def test_a_read_only_or_noexec_host_mount_stays_so_under_the_bind(files: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,ro", "tmpfs", str(files)], check=True)
    try:
        assert filesmount.secure(files) is True
        flags = os.statvfs(files).f_flag
        assert flags & os.ST_NOEXEC and flags & os.ST_RDONLY and nosuid_nodev(files)
        filesmount.release(files, "alpha@m1")
    finally:
        subprocess.run(["umount", str(files)], check=True)


@as_root
def test_release_refuses_to_unmount_a_mount_stacked_on_its_own(files: Path) -> None:
    filesmount.secure(files)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(files)], check=True)
    with pytest.raises(StateError, match="another mount is stacked on it") as caught:
        filesmount.release(files, "alpha@m1")
    assert "umount" in caught.value.todo
    subprocess.run(["umount", str(files)], check=True)
    assert filesmount.release(files, "alpha@m1") is True and mounts_at(files) == []
