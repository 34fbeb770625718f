"""The core's vendor-neutral rules, on canonical bodies, against a simulated machine."""

from __future__ import annotations

from typing import Any

import pytest
from rules_kit import check, rule_context

from rediacc_core.gate.policy.rules import add_cdi_devices, cdi_devices, fold_compose_devices
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
    return [f.refusal.rule for f in check(endpoint, body, rule_context(fm))]


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
            # runc by name would run the container without the runtime guard's device check.
            ({"Runtime": "runc"}, "runtime"),
            ({"Runtime": "io.containerd.runc.v2"}, "runtime"),
            ({"Binds": ["/dev/null:/dev/null"]}, "dev-mount"),
            ({"Binds": ["/:/host"]}, "bind-root"),
            ({"Mounts": [{"Type": "bind", "Source": "/sys", "Target": "/x"}]}, "dev-mount"),
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
            {"Runtime": "rediacc"},  # the repo daemon's default, named
            {"Runtime": ""},
            {"GroupAdd": ["video", "render"]},
            {"CapAdd": ["NET_BIND_SERVICE", "MKNOD"]},
            {"Binds": ["named:/v", "/anonymous"]},
            {
                "Mounts": [
                    {"Type": "volume", "Source": "named", "Target": "/v"},
                    {"Type": "tmpfs", "Target": "/t"},
                ]
            },
            {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["a.example/b=c"]}]},
            {"Annotations": {"org.opencontainers.image.source": "https://example.org/app"}},
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
        findings = check("container-create", {"HostConfig": {"DeviceCgroupRules": ["a"]}}, rule_context(fm))
        assert findings[0].refusal.replacement == (
            "a CDI grant: rdc repo gpu grant alpha@m1 --device <vendor>/<class>=<name>"
        )


class TestOtherEndpoints:
    def test_update_with_device_fields(self, fm: FakeMachine) -> None:
        assert rule_ids("container-update", {"DeviceCgroupRules": ["a"], "Memory": 5}, fm) == [
            "device-cgroup-rules"
        ]
        assert rule_ids("container-update", {"Memory": 5}, fm) == []

    def test_update_cannot_move_the_container_out_of_its_cgroup(self, fm: FakeMachine) -> None:
        assert rule_ids("container-update", {"CgroupParent": "/"}, fm) == ["cgroup-parent"]
        assert rule_ids("container-update", {"OomKillDisable": True}, fm) == ["oom"]

    def test_privileged_exec(self, fm: FakeMachine) -> None:
        assert rule_ids("exec-create", {"Privileged": True, "Cmd": ["sh"]}, fm) == ["privileged"]
        assert rule_ids("exec-create", {"Privileged": False, "Cmd": ["sh"]}, fm) == []
