"""The decision for whole requests: what the gate forwards, what it refuses, and what it says."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rediacc_core import ApiRequest, GateContext, Inventory, Refusal, Rewrite, Verdict
from rediacc_core.errors import ValidationError
from rediacc_core.gate.decide.decider import MAX_INSPECTED_BODY, Decider
from rediacc_core.gate.policy.endpoints import resolve
from rediacc_core.grants.store import GrantStore
from rediacc_core.inventory import write_inventory
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.settings import set_setting, unset_setting

GPU0 = "vendor.example/gpu=0"
GPU1 = "vendor.example/gpu=1"
CDI_RUN: dict[str, Any] = {
    "Image": "bb",
    "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [GPU0]}]},
}


def with_default_pids(body: dict[str, Any]) -> dict[str, Any]:
    """`body` as the gate forwards it when it asks for no PIDs limit: with the default, 4096."""
    host = dict(body.get("HostConfig") or {})
    if not host.get("PidsLimit"):
        host["PidsLimit"] = 4096
    return {**body, "HostConfig": host}


def missing(name: str) -> str:
    return f"repo alpha has no grant for {name} (rdc repo gpu grant alpha@m1 --device {name})"


class TestWhatIsInspected:
    @pytest.mark.parametrize(
        ("method", "target"),
        [
            ("POST", "/v1.45/containers/create"),
            ("POST", "/containers%2Fcreate"),
            ("POST", "http://docker/v1.45/containers/create"),
            ("POST", "/v1.45/containers/abc/update"),
            ("POST", "/v1.45/containers/abc/exec"),
            ("POST", "/v1.45/volumes/create"),
            ("POST", "/v1.45/networks/create"),
            ("GET", "/containers//json"),  # unclean: inspected so that it is refused
        ],
    )
    def test_inspected(self, gate: Any, method: str, target: str) -> None:
        assert gate.decider.inspects(resolve(method, target))

    @pytest.mark.parametrize(
        ("method", "target", "says"),
        [
            ("POST", "/v1.45/plugins/pull?remote=x", "installing, configuring or enabling daemon plugins"),
            ("POST", "/v1.45/services/create", "swarm mode is refused"),
            ("POST", "/swarm/init", "swarm mode is refused"),
            ("post", "/containers/create", "not an endpoint the gate knows"),
            ("GET", "/v1.45/debug/pprof/heap", "not an endpoint the gate knows"),
            ("GET", "/v1.45/containers/create", "not an endpoint the gate knows"),
            ("POST", "/v1.45/containers/create/", "not an endpoint the gate knows"),
            ("POST", "/build?networkmode=host", "build networkmode=host is refused"),
            ("POST", "/build?cgroupparent=/", "build cgroupparent=/ is refused"),
            ("POST", "/build?newfangled=1", "build parameter 'newfangled' is refused"),
        ],
    )
    def test_refused_from_the_head_alone(self, gate: Any, method: str, target: str, says: str) -> None:
        head = gate.decider.head(resolve(method, target))
        assert head is not None and head.status == 403 and says in head.message
        assert not gate.decider.decide(method, target, None, b"").forward

    @pytest.mark.parametrize(
        ("method", "target"),
        [
            ("GET", "/v1.45/containers/json"),
            ("POST", "/v1.45/build?t=x"),
            ("POST", "/v1.45/images/load"),
            ("GET", "/v1.45/containers/abc/logs"),
        ],
    )
    def test_streamed(self, gate: Any, method: str, target: str) -> None:
        assert not gate.decider.inspects(resolve(method, target))
        assert gate.decider.decide(method, target, None, b"").forward

    def test_the_decision_reads_the_resolved_head_not_its_text(self, gate: Any) -> None:
        # The route is found once, at the head; nothing parses the target again.
        request = dataclasses.replace(resolve("POST", "/v1.45/swarm/init"), raw_target="/v1.45/_ping")
        decision = gate.decider.decide_resolved(request, None, b"")
        assert decision.status == 403 and "swarm mode is refused" in decision.message


class TestAdmitted:
    def test_plain_create_is_forwarded_canonical(self, gate: Any) -> None:
        raw = b'{ "image": "bb", "hostconfig": {"binds": ["named:/data"]} }'
        decision = gate.create({}, raw=raw)
        assert decision.forward
        # The machine's PIDs limit (the default, 4096) is written where the request set none.
        assert decision.body == b'{"Image":"bb","HostConfig":{"Binds":["named:/data"],"PidsLimit":4096}}'

    def test_granted_cdi_device(self, gate: Any) -> None:
        gate.grant(GPU0)
        decision = gate.create(CDI_RUN)
        assert decision.forward
        assert json.loads(decision.body) == with_default_pids(CDI_RUN)
        assert any(GPU0 in line for line in decision.log)

    def test_group_add_video_and_render(self, gate: Any) -> None:
        assert gate.create({"Image": "bb", "HostConfig": {"GroupAdd": ["video", "render"]}}).forward

    def test_content_type_parameters(self, gate: Any) -> None:
        assert gate.create({"Image": "bb"}, content_type="application/json; charset=utf-8").forward

    def test_empty_body_without_content_type_is_left_to_the_daemon(self, gate: Any) -> None:
        decision = gate.post("/v1.45/containers/abc/exec", content_type=None)
        assert decision.forward and decision.body is None

    def test_other_endpoints(self, gate: Any) -> None:
        assert gate.post("/v1.45/containers/abc/exec", {"Cmd": ["sh"], "AttachStdin": True}).forward
        assert gate.post("/v1.45/volumes/create", {"Name": "v", "Driver": "local"}).forward
        assert gate.post("/v1.45/containers/abc/update", {"Memory": 1 << 30}).forward
        assert gate.post("/v1.45/containers/abc/start", content_type=None).forward


class TestRefused:
    @pytest.mark.parametrize(
        "target",
        [
            "/v1.45/containers/create",
            "/containers/create",
            "/containers%2Fcreate",
            "/v1.045/containers/create",
            "http://docker/v1.45/containers/create",
            "/%63ontainers/create?name=x",
            "/v1.45/containers/create?x=/auth",
            "/v1.45/containers/create?/auth",
        ],
    )
    def test_privileged_however_the_target_is_written(self, gate: Any, target: str) -> None:
        decision = gate.post(target, {"Image": "bb", "HostConfig": {"Privileged": True}})
        assert (decision.forward, decision.status) == (False, 403)
        assert decision.message.startswith("privileged containers are refused; use instead: --device")

    def test_escaped_key_spellings_are_read_as_go_reads_them(self, gate: Any) -> None:
        raw = b'{"Image": "bb", "H\\u006fstConfig": {"\\u0050rivileged": true}}'
        decision = gate.create({}, raw=raw)
        assert (decision.forward, decision.status) == (False, 403)

    @pytest.mark.parametrize("spelled", ["DriverOpts", "driveropts", "DRIVEROPTS", "Driver\\u004fpts"])
    def test_endpoint_driver_options_are_read_however_they_are_spelled(self, gate: Any, spelled: str) -> None:
        # Go fills EndpointSettings.DriverOpts from any case of the key; so must the sysctl check.
        opts = '{"com.docker.network.endpoint.sysctls": "net.ipv4.conf.IFNAME.forwarding=1"}'
        endpoint = f'{{"{spelled}": {opts}}}'
        create = f'{{"Image": "bb", "NetworkingConfig": {{"EndpointsConfig": {{"n1": {endpoint}}}}}}}'
        connect = f'{{"Container": "c1", "EndpointConfig": {endpoint}}}'
        decision = gate.create({}, raw=create.encode())
        assert (decision.forward, decision.status) == (False, 403)
        assert "n1.DriverOpts com.docker.network.endpoint.sysctls" in decision.message
        decision = gate.post("/v1.45/networks/n1/connect", {}, raw=connect.encode())
        assert (decision.forward, decision.status) == (False, 403)

    def test_an_endpoint_field_nobody_classified_is_refused(self, gate: Any) -> None:
        body = {"Image": "bb", "NetworkingConfig": {"EndpointsConfig": {"n1": {"FutureKnob": "on"}}}}
        decision = gate.create(body)
        assert (decision.forward, decision.status) == (False, 400)
        assert "unknown field in EndpointSettings" in decision.message

    def test_null_bodies_pass_and_a_null_host_config_gets_the_defaults(self, gate: Any) -> None:
        assert gate.create({}, raw=b"null").body == b"null"
        decision = gate.create({"Image": "bb", "HostConfig": None})
        assert decision.body == b'{"Image":"bb","HostConfig":{"PidsLimit":4096}}'

    def test_missing_grant_message_is_exact(self, gate: Any) -> None:
        decision = gate.create(
            {
                "Image": "bb",
                "HostConfig": {
                    "DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["rediacc.io/dri=renderD128"]}]
                },
            }
        )
        assert (decision.forward, decision.status) == (False, 403)
        assert decision.message == (
            "repo alpha has no grant for rediacc.io/dri=renderD128 "
            "(rdc repo gpu grant alpha@m1 --device rediacc.io/dri=renderD128)"
        )

    def test_a_grant_names_exactly_one_device(self, gate: Any) -> None:
        gate.grant("vendor.example/gpu=all")
        body = {
            "Image": "bb",
            "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [GPU0, GPU1]}]},
        }
        decision = gate.create(body)
        assert decision.message == f"{missing(GPU0)}\n{missing(GPU1)}"

    def test_revocation_takes_effect_on_the_next_request(self, gate: Any) -> None:
        gate.grant(GPU0)
        assert gate.create(CDI_RUN).forward
        gate.grants.clear()
        assert not gate.create(CDI_RUN).forward

    def test_a_name_the_machine_lacks_is_answered_with_the_names_it_has(self, gate: Any) -> None:
        body = {
            "Image": "bb",
            "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["vendor.example/gpu=O"]}]},
        }
        decision = gate.create(body)
        assert decision.status == 403
        assert decision.message == (
            "vendor.example/gpu=O is not a device on machine fake; "
            "did you mean vendor.example/gpu=0 or vendor.example/gpu=1? "
            "(rdc repo gpu grant alpha@m1 --device vendor.example/gpu=0; "
            "every device: rdc machine gpu list fake)"
        )

    def test_every_problem_is_named_with_its_replacement(self, gate: Any) -> None:
        body = {
            "Image": "bb",
            "HostConfig": {
                "Privileged": True,
                "Runtime": "vendor",
                "DeviceRequests": [
                    {"Driver": "", "Count": -1, "Capabilities": [["gpu"]]},
                    CDI_RUN["HostConfig"]["DeviceRequests"][0],
                ],
                "Binds": ["/mnt/devlink:/d"],
            },
        }
        decision = gate.create(body)
        lines = decision.message.splitlines()
        assert decision.status == 403
        assert decision.message.startswith(missing(GPU0) + "\nprivileged containers are refused")
        assert "--gpus is refused" in decision.message
        assert "runtime 'vendor' is refused" in decision.message
        assert "bind of /mnt/devlink is refused: it is outside the allowed bind roots" in decision.message
        assert len(lines) == 5 and all("; use instead: " in line for line in lines[1:])

    @pytest.mark.parametrize(
        ("target", "body"),
        [
            ("/v1.45/containers/abc/exec", {"Cmd": ["sh"], "Privileged": True}),
            ("/v1.45/containers/abc/exec", {"Cmd": ["sh"], "privileged": True}),
            ("/v1.45/containers/abc/exec", {"Cmd": ["sh"], "PRIVILEGED": True}),
            ("/v1.45/containers/abc/update", {"DeviceCgroupRules": ["c *:* rwm"]}),
            (
                "/v1.45/volumes/create",
                {"Driver": "local", "DriverOpts": {"type": "none", "o": "bind", "device": "/dev"}},
            ),
            ("/v1.45/plugins/pull?remote=x", [{"Name": "allow-all-devices", "Value": ["true"]}]),
            ("/v1.45/plugins/x/upgrade?remote=x", [{"Name": "device", "Value": ["/dev/vendor/card0"]}]),
            ("/v1.45/plugins/x/set", ["src.source=/mnt/devlink"]),
            (
                "/v1.45/services/create",
                {"TaskTemplate": {"ContainerSpec": {"Mounts": [{"Type": "bind", "Source": "/"}]}}},
            ),
            ("/v1.45/plugins/create?name=x", None),
        ],
    )
    def test_other_endpoints(self, gate: Any, target: str, body: Any) -> None:
        decision = gate.post(target, body)
        assert (decision.forward, decision.status) == (False, 403), decision.message

    def test_compose_cdi_devices_are_folded_and_checked(self, gate: Any) -> None:
        # Compose before 2.30: `devices: [vendor.example/gpu=0]`.
        body = {
            "Image": "bb",
            "HostConfig": {
                "Devices": [{"PathOnHost": GPU0, "PathInContainer": GPU0, "CgroupPermissions": "rwm"}]
            },
        }
        assert gate.create(body).message == missing(GPU0)
        gate.grant(GPU0)
        decision = gate.create(body)
        assert decision.forward
        assert json.loads(decision.body)["HostConfig"] == {
            "Devices": [],
            "DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [GPU0]}],
            "PidsLimit": 4096,
        }


class TestBadRequests:
    @pytest.mark.parametrize(
        "raw",
        [
            b'{"Image": "bb", "HostConfig": {"Privileged": false, "privileged": true}}',
            b'{"Image": "bb", "HostConfig": {"Privileged": false, "Privileged": true}}',
            b'{"Image": "bb", "HostConfig": {}, "HostConfig": {"Privileged": true}}',
            b'{"Image": "bb", "HostConfig": {"Privilege\xc5\xbfd": true, "Privileged": false}}',
            b'{"Image": "bb"}{"HostConfig": {"Privileged": true}}',
            b'{"Image": "bb", "HostConfig": {"Privileged": false, "Vendorthing": true}}',
            b'{"Image": "\xc0\xaf"}',
        ],
    )
    def test_ambiguous_bodies(self, gate: Any, raw: bytes) -> None:
        decision = gate.create({}, raw=raw)
        assert (decision.forward, decision.status) == (False, 400), decision.message

    @pytest.mark.parametrize(
        "target",
        [
            "/v1.45//containers/create",
            "/v1.45/containers/./create",
            "/v1.4.5/containers/create",
            "/v1.23/containers/create",
        ],
    )
    def test_unclean_paths_and_old_versions(self, gate: Any, target: str) -> None:
        assert gate.post(target, {"Image": "bb"}).status == 400

    def test_a_malformed_target_is_read_then_answered_400_with_what_was_wrong(self, gate: Any) -> None:
        request = resolve("POST", "/v1.45//containers/create")
        assert request.target is None and request.route is None and "not clean" in request.bad
        assert gate.decider.inspects(request) and gate.decider.head(request) is None
        decision = gate.decider.decide_resolved(request, "application/json", b"{}")
        assert (decision.status, decision.message, decision.rules) == (400, request.bad, ("bad-request",))
        assert decision.log == (f"400 POST /v1.45//containers/create: {request.bad}",)

    def test_content_type_must_be_json(self, gate: Any) -> None:
        assert gate.create({"Image": "bb"}, content_type="text/plain").status == 400
        assert gate.create({"Image": "bb"}, content_type=None).status == 400

    def test_body_size_limit(self, gate: Any) -> None:
        big = {"Image": "bb", "Labels": {"x": "y" * MAX_INSPECTED_BODY}}
        decision = gate.create(big)
        assert decision.status == 400 and "over" in decision.message

    def test_lower_case_method(self, gate: Any) -> None:
        # The daemon's router matches methods exactly: `post` reaches no route, and neither may it here.
        decision = gate.create({"Image": "bb"}, method="post")
        assert decision.status == 403 and "not an endpoint the gate knows" in decision.message

    def test_start_with_a_body(self, gate: Any) -> None:
        decision = gate.post("/v1.45/containers/abc/start", {"Privileged": True})
        assert decision.status == 400

    @pytest.mark.parametrize(
        "query", ["checkpoint=c", "checkpoint=c&checkpoint-dir=/etc", "checkpoint-dir=/etc"]
    )
    def test_start_from_a_checkpoint(self, gate: Any, query: str) -> None:
        decision = gate.post(f"/v1.45/containers/abc/start?{query}", content_type=None)
        assert decision.status == 400 and "checkpoint" in decision.message


class TestPlugins:
    def test_plugin_sees_the_canonical_request(self, gate: Any) -> None:
        gate.grant(GPU0)
        set_setting(gate.fm.machine, "legacy-visible-devices", "translate")
        assert gate.create({}, raw=json.dumps(CDI_RUN).replace("HostConfig", "hostConfig").encode()).forward
        request, ctx = gate.plugin.seen[-1]
        assert isinstance(request, ApiRequest)
        assert request.is_container_create
        assert request.api_version == "1.45"
        assert request.cdi_devices == (GPU0,)
        assert request.body["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == [GPU0]
        assert isinstance(ctx, GateContext)
        assert (ctx.repo_name, ctx.repo_ref, ctx.grants) == ("alpha", "alpha@m1", frozenset({GPU0}))
        assert ctx.settings == {"legacy-visible-devices": "translate"}
        assert ctx.inventory is None

    def test_inventory_is_read_live(self, gate: Any) -> None:
        doc = {
            "schemaVersion": 1,
            "generatedAt": "2026-01-01T00:00:00Z",
            "machine": "fake",
            "platform": "native",
            "gpus": [],
            "devices": [],
        }
        write_inventory(gate.fm.machine, doc)
        gate.create({"Image": "bb"})
        first = gate.plugin.seen[-1][1].inventory
        assert isinstance(first, Inventory) and first.machine == "fake"
        gate.create({"Image": "bb"})
        assert gate.plugin.seen[-1][1].inventory is first  # built once per file version, not per request
        write_inventory(gate.fm.machine, {**doc, "machine": "other-name"})
        gate.create({"Image": "bb"})
        assert gate.plugin.seen[-1][1].inventory.machine == "other-name"

    def test_a_broken_inventory_is_logged_once_and_rules_see_none(self, gate: Any) -> None:
        gate.fm.machine.inventory_path.parent.mkdir(parents=True, exist_ok=True)
        gate.fm.machine.inventory_path.write_text("{not json")
        for _ in range(3):
            assert gate.create({"Image": "bb"}).forward
            assert gate.plugin.seen[-1][1].inventory is None
        assert sum("inventory unreadable" in line for line in gate.logs) == 1

    def test_settings_are_read_live_from_the_machine(self, gate: Any) -> None:
        gate.create({"Image": "bb"})
        assert gate.plugin.seen[-1][1].settings == {}  # nothing set: every setting has its default
        set_setting(gate.fm.machine, "legacy-visible-devices", "translate")
        gate.create({"Image": "bb"})
        assert gate.plugin.seen[-1][1].settings == {"legacy-visible-devices": "translate"}
        unset_setting(gate.fm.machine, "legacy-visible-devices")
        gate.create({"Image": "bb"})
        assert gate.plugin.seen[-1][1].settings == {}

    def test_unreadable_settings_mean_the_defaults_said_once_in_the_log(self, gate: Any) -> None:
        set_setting(gate.fm.machine, "legacy-visible-devices", "translate")
        gate.fm.machine.settings_path.write_text("{not json")
        for _ in range(2):
            assert gate.create({"Image": "bb"}).forward  # requests go on, decided with the safe defaults
            assert gate.plugin.seen[-1][1].settings == {}
        said = [line for line in gate.logs if "settings unreadable" in line]
        assert len(said) == 1 and str(gate.fm.machine.settings_path) in said[0]
        gate.fm.machine.settings_path.unlink()  # the operator removes the broken file and sets again
        set_setting(gate.fm.machine, "legacy-visible-devices", "translate")
        gate.create({"Image": "bb"})
        assert gate.plugin.seen[-1][1].settings == {"legacy-visible-devices": "translate"}
        assert gate.logs[-1] == "settings readable again"

    def test_vendor_refusal_supersedes_the_generic_one_about_the_same_value(self, gate: Any) -> None:
        gate.plugin.answer = lambda request, ctx: [
            Refusal(
                "raw device /dev/vendor/card0 is refused",
                "--device vendor.example/gpu=0",
                rule="raw-device",
                subject="/dev/vendor/card0",
            )
        ]
        body = {
            "Image": "bb",
            "HostConfig": {"Devices": [{"PathOnHost": "/dev/vendor/card0"}, {"PathOnHost": "/dev/other"}]},
        }
        decision = gate.create(body)
        assert decision.message == (
            "raw device /dev/other is refused; use instead: --device <vendor>/<class>=<name> "
            "(`rdc machine gpu list` shows the names)\n"
            "raw device /dev/vendor/card0 is refused; use instead: --device vendor.example/gpu=0"
        )

    def test_a_vendor_refusal_naming_nothing_replaces_its_whole_rule(self, gate: Any) -> None:
        gate.plugin.answer = lambda request, ctx: [
            Refusal("--gpus is refused", "--device vendor.example/gpu=all", rule="device-request-driver")
        ]
        body = {
            "Image": "bb",
            "HostConfig": {"DeviceRequests": [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]},
        }
        assert gate.create(body).message == "--gpus is refused; use instead: --device vendor.example/gpu=all"

    def test_a_vendor_refusal_without_a_subject_replaces_its_whole_rule(self, gate: Any) -> None:
        # A plugin written before refusals had a subject: the merge never reads its message.
        gate.plugin.answer = lambda request, ctx: [
            Refusal(
                "raw device /dev/vendor/card0 is refused", "--device vendor.example/gpu=0", rule="raw-device"
            )
        ]
        body = {
            "Image": "bb",
            "HostConfig": {"Devices": [{"PathOnHost": "/dev/vendor/card0"}, {"PathOnHost": "/dev/other"}]},
        }
        decision = gate.create(body)
        assert (decision.status, decision.rules) == (403, ("raw-device",))
        assert decision.message == (
            "raw device /dev/vendor/card0 is refused; use instead: --device vendor.example/gpu=0"
        )

    def test_a_vendor_refusal_of_another_value_stands_beside_the_cores(self, gate: Any) -> None:
        gate.plugin.answer = lambda request, ctx: [
            Refusal("runtime other is refused", "no --runtime", rule="runtime", subject="other")
        ]
        body = {"Image": "bb", "HostConfig": {"Runtime": "runc"}}
        assert [(r.rule, r.subject) for r in gate.create(body).refusals] == [
            ("runtime", "runc"),
            ("runtime", "other"),
        ]

    def test_rewrite_adds_granted_devices_and_removes_env(self, gate: Any) -> None:
        def translate(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
            return [
                Rewrite("legacy variable to CDI", add_cdi_devices=(GPU1,), remove_env=("LEGACY_DEVICES",))
            ]

        gate.plugin.answer = translate
        body = {"Image": "bb", "Env": ["LEGACY_DEVICES=1", "KEEP=1", "LEGACY_DEVICES"]}
        assert gate.create(body).message == missing(GPU1)
        gate.grant(GPU1)
        decision = gate.create(body)
        assert decision.forward
        assert json.loads(decision.body) == {
            "Image": "bb",
            "Env": ["KEEP=1"],
            "HostConfig": {"PidsLimit": 4096, "DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [GPU1]}]},
        }
        assert "rewrite: legacy variable to CDI" in decision.log

    def test_a_plugin_cannot_change_the_forwarded_body_behind_the_gate(self, gate: Any) -> None:
        def sneaky(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
            request.body["HostConfig"] = {"Privileged": True}
            request.body["Env"].append("SNEAKY=1")
            return []

        gate.plugin.answer = sneaky
        decision = gate.create({"Image": "bb", "Env": ["A=1"]})
        forwarded = b'{"Image":"bb","Env":["A=1"],"HostConfig":{"PidsLimit":4096}}'
        assert decision.forward and decision.body == forwarded

    def test_a_failing_plugin_refuses(self, gate: Any) -> None:
        def broken(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
            raise RuntimeError("boom")

        gate.plugin.answer = broken
        decision = gate.create({"Image": "bb"})
        assert (decision.forward, decision.status) == (False, 500)
        assert "boom" in decision.message


class TestGrantsUnreadable:
    @pytest.fixture
    def broken(self, gate: Any) -> Any:
        def unreadable(repo_id: str) -> frozenset[str]:
            raise ValidationError("grants.json is not valid JSON (line 1)")

        gate.rebuild(grants=unreadable)
        return gate

    def test_device_requests_are_refused_saying_why(self, broken: Any) -> None:
        decision = broken.create(CDI_RUN)
        assert (decision.forward, decision.status) == (False, 403)
        assert (
            "grants of repo alpha cannot be read (grants.json is not valid JSON (line 1))" in decision.message
        )

    def test_everything_else_keeps_working(self, broken: Any) -> None:
        assert broken.create({"Image": "bb"}).forward
        assert broken.post("/v1.45/volumes/create", {"Name": "v"}).forward


SPEC = """cdiVersion: 0.5.0
kind: vendor.example/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/vendor/card0
"""


def test_grants_are_read_live_from_the_machine(gate: Any) -> None:
    """Without an injected reader the decider reads the grants file that `rdc repo gpu grant` writes."""
    machine = gate.fm.machine
    gate.fm.write("/etc/cdi/vendor.yaml", SPEC)
    repo = RepoStore(machine).create("alpha")
    store = GrantStore(machine, gate.decider.plugins, running=Holdings(machine))
    decider = Decider(machine, repo, gate.decider.plugins, lambda image: None, gate.logs.append)
    body = json.dumps(CDI_RUN).encode()

    def decide(raw: bytes) -> Any:
        return decider.decide("POST", "/v1.45/containers/create", "application/json", raw)

    assert decide(body).message == missing(GPU0).replace("alpha@m1", repo.ref)
    store.grant(repo, [GPU0])
    assert decide(body).forward
    store.revoke(repo, [GPU0])
    assert not decide(body).forward
    machine.grants_path.write_text("{not json")
    refused = decide(body)
    assert refused.status == 403 and "cannot be read" in refused.message
    assert decide(b'{"Image": "bb"}').forward


def test_a_decision_reads_the_inventory_once_and_the_next_decision_reads_it_again(
    gate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grants' check, the rules and the spec check of one request see one inventory, at one
    `stat`; a refresh between two requests is seen by the second."""
    machine = gate.fm.machine
    gate.fm.write("/etc/cdi/vendor.yaml", SPEC)
    repo = RepoStore(machine).create("alpha")
    GrantStore(machine, gate.decider.plugins, running=Holdings(machine)).grant(repo, [GPU0])
    decider = Decider(machine, repo, gate.decider.plugins, lambda image: None, gate.logs.append)
    body = json.dumps(CDI_RUN).encode()
    stats: list[str] = []
    real_stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        stats.append(str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    for _ in range(2):
        stats.clear()
        assert decider.decide("POST", "/v1.45/containers/create", "application/json", body).forward
        assert stats.count(str(machine.inventory_path)) == 1


def test_a_lease_that_ended_is_answered_with_when_and_the_grant_to_ask_for(gate: Any) -> None:
    machine = gate.fm.machine
    gate.fm.write("/etc/cdi/vendor.yaml", SPEC)
    repo = RepoStore(machine).create("alpha")
    GrantStore(machine, gate.decider.plugins, running=Holdings(machine)).grant(
        repo, [GPU0], expires_at="2030-01-01T00:00:00Z"
    )
    decider = Decider(machine, repo, gate.decider.plugins, lambda image: None, gate.logs.append)
    body = json.dumps(CDI_RUN).encode()
    assert decider.decide("POST", "/v1.45/containers/create", "application/json", body).forward
    text = machine.grants_path.read_text().replace("2030-01-01T00:00:00Z", "2020-01-01T00:00:00Z")
    machine.grants_path.write_text(text)  # the lease's end has come
    refused = decider.decide("POST", "/v1.45/containers/create", "application/json", body)
    assert refused.status == 403
    assert refused.message == (
        f"the lease of {GPU0} to repo alpha ended at 2020-01-01T00:00:00Z "
        f"(rdc repo gpu grant {repo.ref} --device {GPU0} --for 8h)"
    )


# --- property: nothing Go would read as privileged is ever admitted --------------------------

_ORBITS = {"k": "kK\u212a", "s": "sS\u017f"}


def go_equal_fold(a: str, b: str) -> bool:
    """An independent model of Go's EqualFold for keys against ASCII field names."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        orbit = _ORBITS.get(y.lower(), y.lower() + y.upper())
        if x not in orbit:
            return False
    return True


def go_reads_privileged(raw: bytes) -> bool:
    """Whether Go's decoder would leave HostConfig.Privileged true (last wins, objects merge)."""
    try:
        doc = json.loads(raw, object_pairs_hook=list)
    except ValueError:
        return False
    if not isinstance(doc, list):
        return False
    host: dict[str, Any] | None = None
    for key, value in doc:
        if not go_equal_fold(key, "HostConfig"):
            continue
        if value is None:
            host = None
        elif isinstance(value, list):
            host = host if host is not None else {}
            for inner_key, inner in value:
                if go_equal_fold(inner_key, "Privileged") and isinstance(inner, bool):
                    host["Privileged"] = inner
    return bool(host and host.get("Privileged"))


def _spell(draw: st.DrawFn, name: str) -> str:
    choices = []
    for char in name:
        options = [char.lower(), char.upper(), *(_ORBITS.get(char.lower(), ""))]
        choices.append(draw(st.sampled_from(options)))
    return "".join(choices)


@st.composite
def sneaky_bodies(draw: st.DrawFn) -> bytes:
    members = ['"Image": "bb"']
    for _ in range(draw(st.integers(1, 3))):
        inner = []
        for _ in range(draw(st.integers(0, 3))):
            key = _spell(draw, draw(st.sampled_from(["Privileged", "Privileged", "Runtime", "Init"])))
            value = draw(st.sampled_from(["true", "false", "null", '"runc"']))
            inner.append(f'"{key}": {value}')
        obj = draw(st.sampled_from(["null", "{" + ", ".join(inner) + "}"]))
        members.append(f'"{_spell(draw, "HostConfig")}": {obj}')
    draw(st.randoms()).shuffle(members)
    tail = draw(st.sampled_from(["", " ", '{"HostConfig": {"Privileged": true}}', "\n"]))
    return ("{" + ", ".join(members) + "}" + tail).encode()


@given(sneaky_bodies())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_never_admits_what_go_reads_as_privileged(gate: Any, raw: bytes) -> None:
    decision = gate.create({}, raw=raw)
    if decision.forward:
        assert not go_reads_privileged(raw)
        assert decision.body is not None and not go_reads_privileged(decision.body)
        # and what is forwarded is what Go reads from the original
        forwarded = json.loads(decision.body).get("HostConfig")
        assert _less_defaults(forwarded) == _less_defaults(_go_host(raw))


def _less_defaults(host: Any) -> Any:
    """A HostConfig without the PIDs limit the gate writes (an empty one read as none)."""
    if not isinstance(host, dict):
        return host
    return {k: v for k, v in host.items() if (k, v) != ("PidsLimit", 4096)} or None


def _go_host(raw: bytes) -> Any:
    doc = json.loads(raw, object_pairs_hook=list)
    host: Any = None
    for key, value in doc:
        if go_equal_fold(key, "HostConfig"):
            host = None if value is None else {k2: v2 for k2, v2 in _canonical_pairs(value)}
    return host


def _canonical_pairs(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    names = ["Privileged", "Runtime", "Init"]
    return [(next(n for n in names if go_equal_fold(k, n)), v) for k, v in pairs]


# --- what the real docker CLI sends ----------------------------------------------------------

CLI_REQUESTS = Path(__file__).parent / "data" / "docker-cli-requests.jsonl"


def _cli_requests() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CLI_REQUESTS.read_text().splitlines()]


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, ""),  # --device vendor.example/gpu=0 (granted below)
        (1, "privileged containers are refused|raw device /dev/null|--gpus is refused"),
        (2, "volume v: local volume of type|CapAdd CAP_SYS_ADMIN"),
        (3, "device cgroup rules are refused|annotation cdi.k8s.io/x"),
        (4, "volume vv device /dev/x is refused: it is under /dev"),
        (5, ""),  # docker update --memory 2g
        (6, "swarm mode is refused"),
        (7, "privileged exec is refused"),  # docker exec --privileged
    ],
)
def test_docker_cli_requests(gate: Any, index: int, expected: str) -> None:
    """Requests captured from the docker CLI 28.2 (tests/gate/data): decoded unchanged, decided right."""
    gate.grant(GPU0)
    request = _cli_requests()[index]
    body = request["body"].encode()
    decision = gate.decider.decide(request["method"], request["target"], request["content_type"], body)
    if not expected:
        assert decision.forward, decision.message
        sent = json.loads(body)
        creates = request["target"].endswith("/containers/create")
        assert json.loads(decision.body) == (with_default_pids(sent) if creates else sent)
        return
    assert (decision.forward, decision.status) == (False, 403)
    for part in expected.split("|"):
        assert part in decision.message


@pytest.mark.parametrize(
    ("method", "target", "name"),
    [
        ("POST", "/v1.45/containers/abc/start", "container-start"),
        ("POST", "/v1.45/containers/create", "container-create"),
        ("GET", "/v1.45/info", "info"),
    ],
)
def test_every_decision_of_a_named_route_carries_its_name(
    gate: Any, method: str, target: str, name: str
) -> None:
    """The audit trail and the metrics label decisions by route, never by a path with an id in it."""
    decision = gate.decider.decide(
        method, target, "application/json", b'{"Image": "bb"}' if "create" in target else b""
    )
    assert decision.endpoint == name
