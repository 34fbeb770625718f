"""Pins at their edges: stale staging entries, the per-repo bound, records that no longer make sense.

`test_mounts.py` covers pinning as the rules use it; these are real bind mounts too (root only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core.gate.policy import pins as pins_module
from rediacc_core.gate.policy.pins import PinError, Pins, open_no_symlinks, release_all

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pinning mounts need root")


@pytest.fixture
def pins(tmp_path: Path) -> Iterator[Pins]:
    found = Pins(tmp_path / "pins")
    yield found
    release_all(found.directory)


def staging_name(source: Path, read_only: bool = False) -> str:
    info = os.stat(source)
    return f"{info.st_dev:x}-{info.st_ino:x}" + ("-ro" if read_only else "")


def test_a_file_on_the_way_to_a_source_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    with pytest.raises(PinError, match="is not a directory"):
        open_no_symlinks(str(tmp_path / "plain" / "below"))


def test_a_missing_source_is_refused_unless_it_may_be_made(tmp_path: Path) -> None:
    with pytest.raises(PinError, match="does not exist"):
        open_no_symlinks(str(tmp_path / "missing"))


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_stale_staging_entry_left_by_an_earlier_gate_is_replaced(
    pins: Pins, tmp_path: Path, kind: str
) -> None:
    source = tmp_path / "source"
    if kind == "directory":
        source.mkdir()
        (source / "inside").write_text("the real content")
    else:
        source.write_text("the real content")
    pins.directory.mkdir(mode=0o700)
    stale = pins.directory / staging_name(source)
    if kind == "directory":
        stale.mkdir()  # same name, a different object: not a pin of the source
    else:
        stale.write_text("stale")
    staged = Path(pins.pin(str(source), read_only=False))
    assert staged == stale
    shown = (staged / "inside") if kind == "directory" else staged
    assert shown.read_text() == "the real content"
    assert sorted(release_all(pins.directory)) == [str(staged)]
    assert not pins.directory.exists()


def test_a_repo_binds_at_most_max_pins_distinct_sources(
    pins: Pins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pins_module, "MAX_PINS", 2)
    for n in range(2):
        (tmp_path / f"d{n}").mkdir()
        pins.pin(str(tmp_path / f"d{n}"), read_only=False)
    (tmp_path / "one-more").mkdir()
    with pytest.raises(PinError, match="already binds 2 distinct host paths"):
        pins.pin(str(tmp_path / "one-more"), read_only=False)


def test_releasing_a_directory_never_made_releases_nothing(tmp_path: Path) -> None:
    assert release_all(tmp_path / "never") == []


def test_nothing_is_restored_without_a_record_or_from_a_record_that_makes_no_sense(tmp_path: Path) -> None:
    assert Pins(tmp_path / "pins").restore(lambda source: False) == []  # pins not recorded
    index = tmp_path / "pins.json"
    for text in ("not json", json.dumps(["a", "list"]), json.dumps({"x": {"source": 5}})):
        index.write_text(text)
        assert Pins(tmp_path / "pins", index).restore(lambda source: False) == []


_PINNER = """
import sys
from pathlib import Path
from rediacc_core.gate.policy.pins import Pins
pins = Pins(Path(sys.argv[1]), Path(sys.argv[2]))
for source in sys.argv[3:]:
    pins.pin(source, read_only=False)
"""


def test_worker_processes_pinning_at_once_record_every_pin_and_share_each_one(tmp_path: Path) -> None:
    directory, index = tmp_path / "pins", tmp_path / "pins.json"
    sources = []
    for n in range(40):
        (tmp_path / f"src{n}").mkdir()
        sources.append(str(tmp_path / f"src{n}"))
    try:
        # Two processes pin the same sources in opposite orders, as two gate workers may.
        runs = [
            subprocess.Popen([sys.executable, "-c", _PINNER, str(directory), str(index), *order])
            for order in (sources, sources[::-1])
        ]
        assert [run.wait(60) for run in runs] == [0, 0]
        recorded = json.loads(index.read_text())
        assert sorted(entry["source"] for entry in recorded.values()) == sorted(sources)
        assert sorted(os.listdir(directory)) == sorted(recorded)  # one staging mount per source
    finally:
        release_all(directory)
    assert not pins_module.lock_path(directory).exists()  # released with the pins


def nosuid_nodev(path: str) -> bool:
    flags = os.statvfs(path).f_flag
    return bool(flags & os.ST_NOSUID and flags & os.ST_NODEV)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_pin_is_nosuid_nodev_and_read_only_when_asked(pins: Pins, tmp_path: Path, read_only: bool) -> None:
    # What a container leaves in a bind (a set-user-ID program, a device node) works through no pin.
    staged = pins.pin(str(tmp_path), read_only=read_only)
    assert nosuid_nodev(staged)
    assert bool(os.statvfs(staged).f_flag & os.ST_RDONLY) is read_only


def test_a_pin_keeps_the_noexec_of_the_mount_it_is_taken_from(pins: Pins, tmp_path: Path) -> None:
    source = tmp_path / "noexec"
    source.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec", "tmpfs", str(source)], check=True)
    try:
        staged = pins.pin(str(source), read_only=False)
        assert os.statvfs(staged).f_flag & os.ST_NOEXEC and nosuid_nodev(staged)
    finally:
        release_all(pins.directory)
        subprocess.run(["umount", str(source)], check=True)


def test_a_pin_made_before_pins_were_hardened_is_hardened_when_reused(pins: Pins, tmp_path: Path) -> None:
    first = pins.pin(str(tmp_path), read_only=False)
    subprocess.run(["mount", "-o", "remount,bind,suid,dev", first], check=True)  # as an older gate left it
    assert not nosuid_nodev(first)
    assert pins.pin(str(tmp_path), read_only=False) == first
    assert nosuid_nodev(first)
