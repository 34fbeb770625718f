"""Binds only under allowed roots, pinned; volumes only plain, tmpfs or binds of allowed paths."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rules_kit import check, files, pin, rule_context

from rediacc_core.gate.policy import mounts
from rediacc_core.gate.policy.pins import Pins, open_no_symlinks, release_all
from rediacc_core.testing.fakemachine import FakeMachine

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pinning mounts need root")


@pytest.fixture
def pins(tmp_path: Path) -> Iterator[Pins]:
    found = Pins(tmp_path / "pins")
    yield found
    release_all(found.directory)


def mounted(path: str) -> bool:
    """A bind of a directory on the same filesystem is a mount `os.path.ismount` cannot see."""
    with open("/proc/self/mountinfo") as info:
        return any(line.split()[4] == path for line in info)


def create(fm: FakeMachine, host: dict[str, Any], **kwargs: Any) -> tuple[list[str], dict[str, Any]]:
    body: dict[str, Any] = {"Image": "bb", "HostConfig": host}
    findings = check("container-create", body, rule_context(fm, **kwargs))
    return [f.refusal.rule for f in findings], body["HostConfig"]


class TestBindSources:
    @pytest.mark.parametrize(
        ("source", "rule"),
        [
            ("/", "bind-root"),
            ("/etc", "bind-root"),
            ("/dev", "dev-mount"),
            ("/dev/null", "dev-mount"),
            ("/sys/class", "dev-mount"),
            ("/proc", "bind-root"),
            ("/proc/self/root", "bind-root"),
            ("/run/docker.sock", "bind-root"),
            ("/var/run/docker.sock", "bind-root"),
            ("/var/lib/docker", "bind-root"),
            ("/run/containerd", "bind-root"),
            ("/srv/elsewhere", "bind-root"),
        ],
    )
    def test_host_paths_outside_the_roots(self, fake_machine: FakeMachine, source: str, rule: str) -> None:
        assert create(fake_machine, {"Binds": [f"{source}:/x"]})[0] == [rule]

    def test_the_machines_own_state_is_never_reachable(self, fake_machine: FakeMachine) -> None:
        for place in ("/etc/rediacc", "/etc/cdi", "/run/rediacc", "/var/lib/rediacc/repos"):
            source = str(fake_machine.path(place))
            assert create(fake_machine, {"Binds": [f"{source}:/x"]})[0] == ["bind-root"], place

    def test_another_repos_files_are_not_this_repos(self, fake_machine: FakeMachine) -> None:
        other = fake_machine.path("/var/lib/rediacc/repos/0000/files")
        other.mkdir(parents=True)
        assert create(fake_machine, {"Binds": [f"{other}:/x"]})[0] == ["bind-root"]

    def test_a_symlink_out_of_the_files_directory_is_judged_by_its_target(
        self, fake_machine: FakeMachine
    ) -> None:
        link = Path(files(fake_machine)) / "escape"
        link.symlink_to(fake_machine.path("/etc/rediacc"))
        rules_found, _ = create(fake_machine, {"Binds": [f"{link}:/x"]})
        assert rules_found == ["bind-root"]

    def test_an_operator_root_cannot_open_the_state_below_it(self, fake_machine: FakeMachine) -> None:
        var = str(fake_machine.path("/var"))
        assert create(fake_machine, {"Binds": [f"{var}:/x"]}, roots=((var, False),))[0] == ["bind-root"]

    def test_files_and_operator_roots_are_admitted(self, fake_machine: FakeMachine) -> None:
        data = fake_machine.mkdir("/data/sets")
        host = {
            "Binds": [f"{files(fake_machine)}/app:/app:rw", f"{data}:/sets", "named:/n", "/anon"],
            "Mounts": [{"Type": "bind", "Source": str(data), "Target": "/m"}],
        }
        found, after = create(fake_machine, host, roots=((str(data), True),))
        assert found == []
        # A read-only root forces read-only, whatever the request said.
        assert after["Binds"][1] == f"{data}:/sets:ro"
        assert after["Mounts"][0]["ReadOnly"] is True

    def test_bad_bind_options_are_refused(self, fake_machine: FakeMachine) -> None:
        assert create(fake_machine, {"Binds": [f"{files(fake_machine)}:/x:rw,exec"]})[0] == ["bind-root"]

    @pytest.mark.parametrize("mode", ["rshared", "shared", "ro,rshared"])
    def test_shared_propagation_is_refused(self, fake_machine: FakeMachine, mode: str) -> None:
        """runc mounts a container's tmpfs and volumes inside its binds: through a shared bind they
        would appear on the host's copy of the source, and stay there after the container."""
        source = files(fake_machine)
        assert create(fake_machine, {"Binds": [f"{source}:/x:{mode}"]})[0] == ["mount-propagation"]
        assert create(fake_machine, {"Binds": [f"named:/x:{mode}"]})[0] == ["mount-propagation"]
        bind = {
            "Type": "bind",
            "Source": source,
            "Target": "/x",
            "BindOptions": {"Propagation": mode.split(",")[-1]},
        }
        assert create(fake_machine, {"Mounts": [bind]})[0] == ["mount-propagation"]

    @pytest.mark.parametrize("mode", ["rslave", "slave", "private", "rprivate"])
    def test_other_propagation_modes_pass(self, fake_machine: FakeMachine, mode: str) -> None:
        assert create(fake_machine, {"Binds": [f"named:/x:{mode}"]})[0] == []

    @pytest.mark.parametrize(
        ("mount", "rule"),
        [
            ({"Type": "npipe", "Source": "x", "Target": "/x"}, "mount-type"),
            ({"Type": "cluster", "Source": "x", "Target": "/x"}, "mount-type"),
            ({"Type": "tmpfs", "Target": "/t", "TmpfsOptions": {"Options": [["dev"]]}}, "tmpfs-option"),
            (
                {"Type": "volume", "Source": "v", "Target": "/x", "VolumeOptions": {"Subpath": "../../"}},
                "volume-subpath",
            ),
        ],
    )
    def test_mount_kinds(self, fake_machine: FakeMachine, mount: dict[str, Any], rule: str) -> None:
        assert create(fake_machine, {"Mounts": [mount]})[0] == [rule]

    def test_a_bind_mount_source_must_be_an_absolute_path(self, fake_machine: FakeMachine) -> None:
        mount = {"Type": "bind", "Source": "relative/dir", "Target": "/x"}
        assert create(fake_machine, {"Mounts": [mount]})[0] == ["bind-root"]

    def test_a_source_is_admitted_again_as_read_only_as_its_root_says(
        self, fake_machine: FakeMachine
    ) -> None:
        data = str(fake_machine.mkdir("/data/sets"))
        policy = rule_context(fake_machine, roots=((data, True),)).binds
        assert mounts.admits(policy, files(fake_machine)) is False
        assert mounts.admits(policy, data) is True
        assert mounts.admits(policy, "/etc") is None

    def test_a_bind_with_too_many_parts_is_refused(self, fake_machine: FakeMachine) -> None:
        assert create(fake_machine, {"Binds": [f"{files(fake_machine)}:/x:ro:extra"]})[0] == ["bind-root"]

    def test_mounts_that_are_not_objects_are_left_to_the_daemon(self, fake_machine: FakeMachine) -> None:
        assert create(fake_machine, {"Mounts": ["/src:/dst"]})[0] == []


class TestVolumes:
    @pytest.mark.parametrize(
        ("driver", "opts", "rule"),
        [
            ("local", {"type": "proc", "device": "proc"}, "volume-type"),
            ("local", {"type": "sysfs", "device": "sysfs"}, "volume-type"),
            ("local", {"type": "devtmpfs", "device": "devtmpfs"}, "volume-type"),
            ("local", {"type": "cgroup", "o": "devices", "device": "cgroup"}, "volume-type"),
            ("local", {"type": "overlay", "o": "lowerdir=/etc", "device": "overlay"}, "volume-type"),
            ("local", {"type": "tracefs", "device": "tracefs"}, "volume-type"),
            ("local", {"type": "binfmt_misc", "device": "binfmt_misc"}, "volume-type"),
            ("local", {"type": "ext4", "device": "/dev/sda1"}, "volume-type"),
            ("local", {"type": "nfs", "o": "addr=10.0.0.1", "device": ":/export"}, "volume-type"),
            ("local", {"type": "none", "o": "bind", "device": "/etc/rediacc"}, "bind-root"),
            ("local", {"type": "none", "o": "bind", "device": "/dev"}, "dev-mount"),
            ("local", {"type": "tmpfs", "o": "size=1m,dev", "device": "tmpfs"}, "tmpfs-option"),
            ("local", {"size": "1G"}, "volume-type"),
            ("vendor-driver", {}, "volume-driver"),
        ],
    )
    def test_refused(self, fake_machine: FakeMachine, driver: str, opts: dict[str, str], rule: str) -> None:
        body = {"Name": "v", "Driver": driver, "DriverOpts": opts}
        assert [f.refusal.rule for f in check("volume-create", body, rule_context(fake_machine))] == [rule]

    def test_a_bind_volume_with_options_beyond_binding_is_refused(self, fake_machine: FakeMachine) -> None:
        opts = {"type": "none", "o": "bind,exec", "device": "/x"}
        body = {"Name": "v", "Driver": "local", "DriverOpts": opts}
        assert [f.refusal.rule for f in check("volume-create", body, rule_context(fake_machine))] == [
            "volume-type"
        ]

    def test_a_bind_volume_of_a_read_only_root_is_made_read_only(self, fake_machine: FakeMachine) -> None:
        data = str(fake_machine.mkdir("/data/sets"))
        opts = {"type": "none", "o": "bind,rw", "device": data}
        body = {"Name": "v", "Driver": "local", "DriverOpts": opts}
        assert check("volume-create", body, rule_context(fake_machine, roots=((data, True),))) == []
        assert opts["o"] == "bind,ro"

    def test_admitted(self, fake_machine: FakeMachine) -> None:
        ctx = rule_context(fake_machine, volume_drivers=frozenset({"vendor-driver"}))
        for driver, opts in [
            ("local", {}),
            ("", {"type": "tmpfs", "device": "tmpfs", "o": "size=64m,uid=1000,mode=0700"}),
            ("local", {"type": "none", "o": "bind", "device": files(fake_machine)}),
            ("vendor-driver", {"any": "thing"}),
        ]:
            body = {"Name": "v", "Driver": driver, "DriverOpts": opts}
            assert check("volume-create", body, ctx) == [], (driver, opts)


@needs_root
class TestPinning:
    def test_a_pinned_bind_holds_the_checked_directory_after_a_swap(
        self, fake_machine: FakeMachine, pins: Pins
    ) -> None:
        work = Path(files(fake_machine)) / "work"
        work.mkdir()
        (work / "mine").write_text("tenant data")
        body = {"HostConfig": {"Binds": [f"{work}:/w"]}}
        assert pin("container-create", body, rule_context(fake_machine, pins=pins)) == []
        staged = body["HostConfig"]["Binds"][0].split(":")[0]
        assert staged.startswith(str(pins.directory))
        # The tenant swaps the checked directory for a symlink to the machine's state...
        work.rename(work.with_name("old"))
        work.symlink_to(fake_machine.path("/etc"))
        # ...and what the daemon will mount is still the directory that was checked.
        assert (Path(staged) / "mine").read_text() == "tenant data"
        assert oct(os.stat(pins.directory).st_mode & 0o777) == "0o700"

    def test_the_same_directory_is_pinned_once(self, fake_machine: FakeMachine, pins: Pins) -> None:
        source = files(fake_machine)
        first = pins.pin(source, read_only=False)
        assert pins.pin(source, read_only=False) == first
        assert pins.pin(source, read_only=True) != first  # a read-only pin is its own mount

    def test_a_read_only_pin_is_read_only(self, fake_machine: FakeMachine, pins: Pins) -> None:
        staged = Path(pins.pin(files(fake_machine), read_only=True))
        with pytest.raises(OSError):
            (staged / "x").write_text("no")

    def test_a_symlink_on_the_way_refuses(self, fake_machine: FakeMachine, tmp_path: Path) -> None:
        (tmp_path / "real").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "real")
        with pytest.raises(Exception, match="became a symlink"):
            os.close(open_no_symlinks(str(tmp_path / "link")))

    def test_missing_bind_sources_are_made_as_the_daemon_would(
        self, fake_machine: FakeMachine, pins: Pins
    ) -> None:
        body = {"HostConfig": {"Binds": [f"{files(fake_machine)}/new/dir:/d"]}}
        assert pin("container-create", body, rule_context(fake_machine, pins=pins)) == []
        assert (Path(files(fake_machine)) / "new" / "dir").is_dir()

    def test_release_unmounts_everything(self, fake_machine: FakeMachine, pins: Pins) -> None:
        staged = pins.pin(files(fake_machine), read_only=False)
        assert mounted(staged)
        assert release_all(pins.directory) == [staged]
        assert not mounted(staged) and not Path(staged).exists()


@needs_root
class TestRestore:
    def test_a_gate_starting_again_pins_the_recorded_sources_that_are_still_allowed(
        self, fake_machine: FakeMachine, tmp_path: Path
    ) -> None:
        index = tmp_path / "state" / "pins.json"
        pins = Pins(tmp_path / "pins", index)
        kept = Path(files(fake_machine)) / "kept"
        gone = Path(files(fake_machine)) / "gone"
        kept.mkdir()
        gone.mkdir()
        (kept / "data").write_text("still here")
        staged_kept = pins.pin(str(kept), read_only=False)
        pins.pin(str(gone), read_only=False)
        release_all(pins.directory)  # repo down, or a reboot clearing /run
        gone.rmdir()
        try:
            restored = Pins(tmp_path / "pins", index).restore(lambda source: False)
            assert restored == [staged_kept]
            assert (Path(staged_kept) / "data").read_text() == "still here"
        finally:
            release_all(pins.directory)

    def test_a_source_no_longer_allowed_is_not_pinned_again(
        self, fake_machine: FakeMachine, tmp_path: Path
    ) -> None:
        index = tmp_path / "pins.json"
        pins = Pins(tmp_path / "pins", index)
        pins.pin(files(fake_machine), read_only=False)
        release_all(pins.directory)
        assert Pins(tmp_path / "pins", index).restore(lambda source: None) == []
        assert not (tmp_path / "pins").exists()
