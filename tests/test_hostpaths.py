"""Host paths are judged where they land: cleaned as the daemon cleans them, links followed in the root."""

from __future__ import annotations

from rediacc_core.cdi.devnodes import device_node_edit, host_node, sysfs_dev_numbers
from rediacc_core.hostpaths import clean, is_at_or_under, landing_paths, resolve
from rediacc_core.testing import FakeMachine


def test_clean_matches_go_filepath_clean_made_absolute() -> None:
    assert clean("//dev/./x/../y") == "/dev/y"
    assert clean("dev/x") == "/dev/x"
    assert clean("/") == "/"


def test_links_resolve_inside_the_machine_root(fake_machine: FakeMachine) -> None:
    fake_machine.mkdir("/dev/cards")
    fake_machine.symlink("/mnt/cards", "/dev/cards")
    fake_machine.symlink("/mnt/loop", "/mnt/loop")
    assert resolve(fake_machine.machine, "/mnt/cards/x") == "/dev/cards/x"
    assert resolve(fake_machine.machine, "/mnt/cards/..") == "/dev"  # '..' leaves the link's target
    assert resolve(fake_machine.machine, "/mnt/loop") is None
    assert landing_paths(fake_machine.machine, "/mnt/cards/..") == ("/mnt", "/dev")
    assert is_at_or_under("/dev/cards/x", "/dev") and not is_at_or_under("/devices", "/dev")


def test_device_nodes_prefer_the_node_then_the_sysfs_record(fake_machine: FakeMachine) -> None:
    node = fake_machine.char_device("/dev/card7", 226, 7)
    dev_file = fake_machine.write("/sys/class/x/card7/dev", "226:7\n")
    found = host_node(node, sysfs_dev_numbers(dev_file))
    assert found is not None and (found.type, found.major, found.minor) == ("c", 226, 7)
    assert device_node_edit("/dev/card7", found)["hostPath"] == str(node)
    assert host_node(fake_machine.path("/dev/missing")) is None
