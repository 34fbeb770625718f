"""The core's vendor-neutral rules, on canonical bodies, against a simulated machine."""

from __future__ import annotations

from typing import Any

import pytest

from rediacc_core.gate import rules
from rediacc_core.gate.rules import MachinePaths, add_cdi_devices, cdi_devices, fold_compose_devices
from rediacc_core.testing.fakemachine import FakeMachine


@pytest.fixture
def fm(fake_machine: FakeMachine) -> FakeMachine:
    fake_machine.char_device("/dev/vendor/card0", 226, 0)
    fake_machine.char_device("/srv/stray-node", 226, 1)
    fake_machine.mkdir("/mnt/data")
    fake_machine.symlink("/mnt/devlink", "/dev")
    fake_machine.symlink("/mnt/cardlink", "/dev/vendor/card0")
    fake_machine.symlink("/mnt/rootlink", "/")
    fake_machine.symlink("/mnt/loop", "/mnt/loop")
    fake_machine.symlink("/mnt/rel", "../dev/vendor")
    return fake_machine


def rule_ids(endpoint: str, body: Any, fm: FakeMachine) -> list[str]:
    return [f.refusal.rule for f in rules.check(endpoint, body, fm.machine, "alpha@m1")]


class TestMachinePaths:
    def test_symlinks_resolve_inside_the_machine_root(self, fm: FakeMachine) -> None:
        paths = MachinePaths(fm.machine)
        assert paths.resolve("/mnt/devlink/vendor") == "/dev/vendor"
        assert paths.resolve("/mnt/rel/card0") == "/dev/vendor/card0"
        assert paths.resolve("/mnt/rootlink/dev") == "/dev"
        assert paths.resolve("/mnt/data/new/dir") == "/mnt/data/new/dir"
        assert paths.resolve("/mnt/loop") is None

    def test_dotdot_after_a_symlink_leaves_its_target(self, fm: FakeMachine) -> None:
        # /mnt/devlink/vendor/.. is /dev for the kernel, though it reads as /mnt/devlink.
        assert MachinePaths(fm.machine).resolve("/mnt/devlink/vendor/..") == "/dev"

    @pytest.mark.parametrize(
        "source",
        [
            "/dev",
            "/dev/",
            "/dev/vendor/card0",
            "/mnt/devlink",
            "/mnt/devlink/vendor",
            "/mnt/cardlink",
            "/mnt/rootlink",
            "/",
            "//",
            "/mnt/../dev",
            "/mnt/loop",
            "/mnt/rel",
        ],
    )
    def test_sources_that_reach_devices(self, fm: FakeMachine, source: str) -> None:
        assert MachinePaths(fm.machine).reaches_devices(source)

    @pytest.mark.parametrize("source", ["/sys", "/sys/bus/pci/devices/0000:01:00.0", "/sys/class/drm"])
    def test_sysfs_reaches_the_cards_registers(self, fm: FakeMachine, source: str) -> None:
        assert "under /sys" in (MachinePaths(fm.machine).reaches_devices(source) or "")

    @pytest.mark.parametrize(
        "source", ["/mnt/data", "/mnt/data/dev", "/devices", "/srv", "/home/dev", "/system"]
    )
    def test_sources_that_do_not(self, fm: FakeMachine, source: str) -> None:
        assert MachinePaths(fm.machine).reaches_devices(source) is None

    def test_a_device_node_outside_dev_reaches_a_device(self, fm: FakeMachine, tmp_path: Any) -> None:
        node = fm.path("/srv/stray-node")
        if not node.is_char_device():
            pytest.skip("device nodes need root here")
        assert (
            MachinePaths(fm.machine).reaches_devices("/srv/stray-node") == "/srv/stray-node is a device node"
        )


class TestComposeFold:
    def test_cdi_names_in_devices_move_to_the_cdi_request(self) -> None:
        body: dict[str, Any] = {
            "HostConfig": {
                "Devices": [
                    {"PathOnHost": "vendor.example/gpu=0", "PathInContainer": "vendor.example/gpu=0"},
                    {"PathOnHost": "/dev/raw", "PathInContainer": "/dev/raw"},
                ]
            }
        }
        assert fold_compose_devices(body) == ["vendor.example/gpu=0"]
        assert body["HostConfig"] == {
            "Devices": [{"PathOnHost": "/dev/raw", "PathInContainer": "/dev/raw"}],
            "DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["vendor.example/gpu=0"]}],
        }

    def test_fold_joins_an_existing_cdi_request_without_repeats(self) -> None:
        host: dict[str, Any] = {
            "Devices": [{"PathOnHost": "v.example/c=1"}, {"PathOnHost": "v.example/c=0"}],
            "DeviceRequests": [{"Driver": "other"}, {"Driver": "cdi", "DeviceIDs": ["v.example/c=0"]}],
        }
        fold_compose_devices({"HostConfig": host})
        assert host["DeviceRequests"][1]["DeviceIDs"] == ["v.example/c=0", "v.example/c=1"]
        assert host["Devices"] == []
        assert cdi_devices(host) == ("v.example/c=0", "v.example/c=1")

    def test_a_name_compose_split_at_a_colon_is_not_folded(self, fm: FakeMachine) -> None:
        # `devices: [vendor.example/gpu=0:1]` in Compose's short syntax: host part, container part.
        body: dict[str, Any] = {
            "HostConfig": {"Devices": [{"PathOnHost": "vendor.example/gpu=0", "PathInContainer": "1"}]}
        }
        assert fold_compose_devices(body) == []
        assert rule_ids("container-create", body, fm) == ["cdi-name-split"]

    def test_add_to_null_lists(self) -> None:
        host: dict[str, Any] = {"DeviceRequests": None}
        add_cdi_devices(host, ["a.example/b=c", "a.example/b=c"])
        assert host == {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["a.example/b=c"]}]}


class TestContainerCreate:
    @pytest.mark.parametrize(
        ("host", "rule"),
        [
            ({"Privileged": True}, "privileged"),
            ({"DeviceCgroupRules": ["c 226:* rwm"]}, "device-cgroup-rules"),
            ({"Devices": [{"PathOnHost": "/dev/vendor/card0"}]}, "raw-device"),
            (
                {"DeviceRequests": [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]},
                "device-request-driver",
            ),
            (
                {"DeviceRequests": [{"Driver": "CDI", "DeviceIDs": ["a.example/b=c"]}]},
                "device-request-driver",
            ),
            ({"Runtime": "vendor-runtime"}, "runtime"),
            ({"Binds": ["/dev/vendor:/dev/vendor"]}, "dev-mount"),
            ({"Binds": ["/mnt/devlink:/host-dev:ro"]}, "dev-mount"),
            ({"Binds": ["/:/host"]}, "dev-mount"),
            ({"Mounts": [{"Type": "bind", "Source": "/mnt/cardlink", "Target": "/x"}]}, "dev-mount"),
            (
                {
                    "Mounts": [
                        {
                            "Type": "volume",
                            "Source": "v",
                            "Target": "/x",
                            "VolumeOptions": {
                                "DriverConfig": {
                                    "Name": "local",
                                    "Options": {"type": "none", "o": "bind", "device": "/mnt/devlink/vendor"},
                                }
                            },
                        }
                    ]
                },
                "volume-device",
            ),
            ({"Annotations": {"cdi.k8s.io/x": "a.example/b=c"}}, "cdi-annotation"),
            ({"Annotations": {"CDI.K8S.IO/x": "a.example/b=c"}}, "cdi-annotation"),
            ({"CapAdd": ["SYS_ADMIN"]}, "capability"),
            ({"CapAdd": ["cap_sys_rawio"]}, "capability"),
            ({"CapAdd": ["ALL"]}, "capability"),
        ],
    )
    def test_refused_forms(self, fm: FakeMachine, host: dict[str, Any], rule: str) -> None:
        assert rule_ids("container-create", {"Image": "bb", "HostConfig": host}, fm) == [rule]

    @pytest.mark.parametrize(
        "host",
        [
            {},
            {"Privileged": False},
            {"Runtime": "runc"},
            {"Runtime": ""},
            {"GroupAdd": ["video", "render"]},
            {"CapAdd": ["NET_ADMIN", "MKNOD"]},
            {"Binds": ["/mnt/data:/data", "named:/v", "/anonymous"]},
            {
                "Mounts": [
                    {"Type": "volume", "Source": "named", "Target": "/v"},
                    {"Type": "tmpfs", "Target": "/t"},
                ]
            },
            {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["a.example/b=c"]}]},
            {"Annotations": {"example.org/x": "y"}},
            {"Devices": None, "DeviceCgroupRules": [], "DeviceRequests": None},
        ],
    )
    def test_admitted_forms(self, fm: FakeMachine, host: dict[str, Any]) -> None:
        assert rule_ids("container-create", {"Image": "bb", "HostConfig": host}, fm) == []

    def test_every_problem_is_listed(self, fm: FakeMachine) -> None:
        host = {
            "Privileged": True,
            "Runtime": "x",
            "Devices": [{"PathOnHost": "/dev/a"}, {"PathOnHost": "/dev/b"}],
        }
        assert rule_ids("container-create", {"HostConfig": host}, fm) == [
            "privileged",
            "raw-device",
            "raw-device",
            "runtime",
        ]

    def test_replacements_are_vendor_neutral_cdi_forms(self, fm: FakeMachine) -> None:
        findings = rules.check(
            "container-create", {"HostConfig": {"DeviceCgroupRules": ["a"]}}, fm.machine, "alpha@m1"
        )
        assert findings[0].refusal.replacement == (
            "a CDI grant: rdc repo gpu grant alpha@m1 --device <vendor>/<class>=<name>"
        )


class TestOtherEndpoints:
    def test_update_with_device_fields(self, fm: FakeMachine) -> None:
        assert rule_ids("container-update", {"DeviceCgroupRules": ["a"], "Memory": 5}, fm) == [
            "device-cgroup-rules"
        ]
        assert rule_ids("container-update", {"Memory": 5}, fm) == []

    def test_privileged_exec(self, fm: FakeMachine) -> None:
        assert rule_ids("exec-create", {"Privileged": True, "Cmd": ["sh"]}, fm) == ["privileged"]
        assert rule_ids("exec-create", {"Privileged": False, "Cmd": ["sh"]}, fm) == []

    @pytest.mark.parametrize(
        ("opts", "refused"),
        [
            ({"type": "none", "o": "bind", "device": "/dev/vendor"}, True),
            ({"type": "ext4", "device": "/dev/sda1"}, True),
            ({"type": "none", "o": "bind", "device": "/mnt/devlink"}, True),
            ({"type": "none", "o": "bind", "device": "/mnt/data"}, False),
            ({"type": "nfs", "o": "addr=10.0.0.1", "device": ":/export"}, False),
            ({}, False),
        ],
    )
    def test_volume_create(self, fm: FakeMachine, opts: dict[str, str], refused: bool) -> None:
        body = {"Name": "v", "Driver": "local", "DriverOpts": opts}
        assert rule_ids("volume-create", body, fm) == (["volume-device"] if refused else [])

    @pytest.mark.parametrize(
        ("privileges", "refused"),
        [
            ([{"Name": "device", "Value": ["/dev/vendor/card0"]}], True),
            ([{"Name": "allow-all-devices", "Value": ["true"]}], True),
            ([{"Name": "mount", "Value": ["/dev"]}], True),
            ([{"Name": "mount", "Value": ["/"]}], True),
            ([{"Name": "network", "Value": ["host"]}, {"Name": "mount", "Value": ["/mnt/data"]}], False),
            ([], False),
        ],
    )
    def test_plugin_privileges(
        self, fm: FakeMachine, privileges: list[dict[str, Any]], refused: bool
    ) -> None:
        for endpoint in ("plugin-pull", "plugin-upgrade"):
            assert rule_ids(endpoint, privileges, fm) == (["plugin-privilege"] if refused else [])

    def test_plugin_settings_and_create(self, fm: FakeMachine) -> None:
        assert rule_ids("plugin-set", ["data.source=/mnt/devlink", "DEBUG=1"], fm) == ["plugin-privilege"]
        assert rule_ids("plugin-set", ["data.source=/mnt/data"], fm) == []
        assert rule_ids("plugin-create", None, fm) == ["plugin-create"]

    def test_swarm_services(self, fm: FakeMachine) -> None:
        spec = {
            "Name": "web",
            "TaskTemplate": {
                "ContainerSpec": {
                    "Image": "bb",
                    "Mounts": [{"Type": "bind", "Source": "/dev", "Target": "/dev"}],
                    "CapabilityAdd": ["CAP_SYS_ADMIN"],
                },
                "Resources": {
                    "Reservations": {"GenericResources": [{"DiscreteResourceSpec": {"Kind": "gpu"}}]}
                },
                "PluginSpec": {"Privileges": [{"Name": "allow-all-devices", "Value": ["true"]}]},
            },
        }
        for endpoint in ("service-create", "service-update"):
            assert rule_ids(endpoint, spec, fm) == [
                "dev-mount",
                "capability",
                "swarm-generic-resources",
                "plugin-privilege",
            ]
        assert (
            rule_ids(
                "service-create", {"Name": "web", "TaskTemplate": {"ContainerSpec": {"Image": "bb"}}}, fm
            )
            == []
        )
