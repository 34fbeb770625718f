"""A device is held by whoever has a descriptor or a memory map of its node, whatever the path:
processes are matched by the node's device number (type and major:minor), read from /proc.

Real processes of the test hold real descriptors of /dev/full (1:7); the memory-map case, which no
harmless host node allows, is played on a /proc tree of files laid out as the kernel's."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core.runtime.openers import Opener, container_of, holds, node_of, openers

FULL = ("c", 1, 7)
NULL = ("c", 1, 3)
CONTAINER = "ab" * 32


@pytest.fixture
def sleeper() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A child holding /dev/full, and the number of its descriptor."""
    with open("/dev/full", "rb") as handle:
        child = subprocess.Popen(["sleep", "60"], pass_fds=(handle.fileno(),))
        fd = handle.fileno()
    yield child, fd
    child.kill()
    child.wait()


def test_a_node_is_its_type_and_device_number() -> None:
    assert node_of("/dev/full") == FULL
    assert node_of("/dev/null") == NULL
    assert node_of(sys.executable) is None  # a regular file is no node
    assert node_of("/nonexistent") is None


def test_a_process_holding_the_node_is_found_by_number(sleeper: tuple[subprocess.Popen[bytes], int]) -> None:
    child, fd = sleeper
    assert holds(child.pid, {FULL}) == [(FULL, f"fd {fd} (/dev/full)")]
    # Its stdin is /dev/null's number here or not: only the nodes asked for count.
    assert holds(child.pid, {("c", 1, 8)}) == []
    assert holds(child.pid, {("b", 1, 7)}) == []  # a block device of the same numbers is another


def test_openers_names_each_process_and_what_it_holds(sleeper: tuple[subprocess.Popen[bytes], int]) -> None:
    child, fd = sleeper
    found = openers({child.pid: f"sleep (pid {child.pid})"}, [FULL], ())
    assert found == [Opener(child.pid, f"sleep (pid {child.pid})", FULL, f"fd {fd} (/dev/full)", None)]
    assert found[0].describe() == f"sleep (pid {child.pid}) holds device c 1:7 as fd {fd} (/dev/full)"
    assert openers({child.pid: "sleep"}, [], ()) == []


def test_a_process_gone_is_not_an_opener() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert openers({done.pid: "true"}, [FULL], ()) == []


def fake_proc(tmp_path: Path, pid: int, maps: str, map_files: dict[str, str], cgroup: str) -> str:
    proc = tmp_path / "proc"
    (proc / str(pid) / "fd").mkdir(parents=True)
    (proc / str(pid) / "map_files").mkdir()
    (proc / str(pid) / "maps").write_text(maps)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    for area, target in map_files.items():
        (proc / str(pid) / "map_files" / area).symlink_to(target)
    return str(proc)


def test_a_memory_map_of_the_node_counts_after_its_descriptor_is_closed(tmp_path: Path) -> None:
    # maps shows the dev and inode of the filesystem holding the node (0:5 here), never 1:7: the
    # mapped file itself is reached through map_files.
    maps = (
        "7f0000000000-7f0000001000 rw-s 00000000 00:05 42 /gpu0\n"
        "7f0000001000-7f0000002000 rw-s 00001000 00:05 42 /gpu0\n"
        "7f0000003000-7f0000004000 r--p 00000000 00:00 0 \n"
        "7f0000005000-7f0000006000 r--p 00000000 08:01 99 /usr/lib/libc.so.6\n"
    )
    files = {"7f0000000000-7f0000001000": "/dev/full", "7f0000005000-7f0000006000": sys.executable}
    proc = fake_proc(tmp_path, 77, maps, files, f"0::/system.slice/docker-{CONTAINER}.scope\n")
    assert holds(77, {FULL}, proc) == [(FULL, "a memory map of /gpu0")]  # once for the file
    (found,) = openers({77: "worker (pid 77)"}, [FULL], {CONTAINER}, proc)
    assert found.container == CONTAINER and found.how == "a memory map of /gpu0"


def test_the_container_is_the_one_its_cgroup_names(tmp_path: Path) -> None:
    other = "cd" * 32
    proc = fake_proc(tmp_path, 9, "", {}, f"0::/docker/{CONTAINER}\n")
    assert container_of(9, {CONTAINER, other}, proc) == CONTAINER
    assert container_of(9, {other}, proc) is None  # a container of another daemon is none of ours
    assert container_of(10, {CONTAINER}, proc) is None
