"""The defaults the gate writes into what it forwards, and the limits it refuses past: a private cgroup
namespace for old API versions, the machine's PIDs limit, rlimits no higher than the daemon's own,
and only annotations no runtime acts on."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from rules_kit import check, rule_context

from rediacc_core.gate.policy import rules
from rediacc_core.gate.policy.limits import DEFAULT_PIDS_LIMIT, UNLIMITED, own_hard_limits
from rediacc_core.settings import set_setting
from rediacc_core.testing.fakemachine import FakeMachine

# The hard limits of a plain Linux session: no realtime priority, no nice below 0, 8 MiB mlock.
HARD = {"rtprio": 0, "nice": 0, "memlock": 8 * 1024 * 1024}


def context(fm: FakeMachine, **kwargs: Any) -> rules.RuleContext:
    extra = kwargs.pop("extra_capabilities", frozenset())
    ctx = rule_context(fm, extra_capabilities=extra)
    return dataclasses.replace(ctx, hard_limits=kwargs.pop("hard_limits", HARD), **kwargs)


def create(fm: FakeMachine, host: dict[str, Any] | None, **kwargs: Any) -> tuple[list[str], dict[str, Any]]:
    """The rule ids refusing a create with `host`, and the HostConfig as it would be forwarded."""
    body: dict[str, Any] = {"Image": "bb"} if host is None else {"Image": "bb", "HostConfig": host}
    findings = check("container-create", body, context(fm, **kwargs))
    return [f.refusal.rule for f in findings], body["HostConfig"]


def update(fm: FakeMachine, body: dict[str, Any], **kwargs: Any) -> list[str]:
    return [f.refusal.rule for f in check("container-update", body, context(fm, **kwargs))]


def messages(fm: FakeMachine, endpoint: str, body: Any, **kwargs: Any) -> list[str]:
    return [
        f"{f.refusal.message}; use instead: {f.refusal.replacement}"
        for f in check(endpoint, body, context(fm, **kwargs))
    ]


class TestCgroupNamespace:
    @pytest.mark.parametrize(
        ("version", "asked", "forwarded"),
        [
            # Before 1.41 dockerd on cgroup v1 puts an empty mode in the host's cgroup namespace.
            ((1, 40), None, "private"),
            ((1, 24), "", "private"),
            ((1, 40), "private", "private"),
            # From 1.41 the repo daemon's own default (private) holds: nothing is written.
            ((1, 41), None, None),
            ((1, 45), None, None),
            (None, None, None),  # no version in the path: the daemon's newest
        ],
    )
    def test_old_api_versions_get_a_private_cgroup_namespace(
        self,
        fake_machine: FakeMachine,
        version: tuple[int, int] | None,
        asked: str | None,
        forwarded: str | None,
    ) -> None:
        host = {} if asked is None else {"CgroupnsMode": asked}
        refused, sent = create(fake_machine, host, api_version=version)
        assert refused == [] and sent.get("CgroupnsMode") == forwarded

    def test_host_is_still_refused_at_old_versions(self, fake_machine: FakeMachine) -> None:
        refused, _ = create(fake_machine, {"CgroupnsMode": "host"}, api_version=(1, 40))
        assert refused == ["namespace"]

    def test_a_create_without_host_config_gets_one_with_the_defaults(self, fake_machine: FakeMachine) -> None:
        refused, sent = create(fake_machine, None, api_version=(1, 40))
        assert refused == [] and sent == {"CgroupnsMode": "private", "PidsLimit": DEFAULT_PIDS_LIMIT}


class TestPidsLimit:
    @pytest.mark.parametrize(
        ("asked", "forwarded"),
        [
            (None, 4096),  # none asked: the machine's limit
            (0, 4096),  # the daemon reads 0 and every negative value as unlimited
            (-1, 4096),
            (-7, 4096),
            (1, 1),
            (100, 100),
            (4096, 4096),
        ],
    )
    def test_create_gets_the_machines_limit_where_it_asks_for_none(
        self, fake_machine: FakeMachine, asked: int | None, forwarded: int
    ) -> None:
        refused, sent = create(fake_machine, {"PidsLimit": asked})
        assert refused == [] and sent["PidsLimit"] == forwarded

    def test_above_the_limit_is_refused_naming_the_field_and_the_ceiling(
        self, fake_machine: FakeMachine
    ) -> None:
        body = {"Image": "bb", "HostConfig": {"PidsLimit": 4097}}
        assert messages(fake_machine, "container-create", body) == [
            "HostConfig.PidsLimit 4097 is refused: this machine lets a container have at most 4096 processes "
            "(one without bound could use up the host's process ids); use instead: --pids-limit 4096 or "
            "less, or none (4096 is the default); the operator sets the ceiling with rdc machine config M "
            "--set pids-limit=N"
        ]

    def test_the_machines_setting_is_the_ceiling(self, fake_machine: FakeMachine) -> None:
        assert create(fake_machine, {}, pids_limit=100) == ([], {"PidsLimit": 100})
        assert create(fake_machine, {"PidsLimit": 101}, pids_limit=100)[0] == ["pids-limit"]

    @pytest.mark.parametrize(
        ("body", "refused", "forwarded"),
        [
            ({"Memory": 1 << 30}, [], None),  # no PidsLimit in an update: unchanged, nothing written
            ({"PidsLimit": None}, [], None),
            ({"PidsLimit": 0}, [], 4096),  # unlimited asked: the ceiling
            ({"PidsLimit": -1}, [], 4096),
            ({"PidsLimit": 200}, [], 200),
            ({"PidsLimit": 5000}, ["pids-limit"], 5000),
        ],
    )
    def test_update(
        self, fake_machine: FakeMachine, body: dict[str, Any], refused: list[str], forwarded: int | None
    ) -> None:
        assert update(fake_machine, body) == refused
        assert body.get("PidsLimit") == forwarded


class TestUlimits:
    @pytest.mark.parametrize(
        ("ulimit", "refused"),
        [
            ({"Name": "nofile", "Soft": 1024, "Hard": 1 << 20}, []),  # not gated: the container's own
            ({"Name": "nproc", "Soft": -1, "Hard": -1}, []),
            ({"Name": "rtprio", "Soft": 0, "Hard": 0}, []),
            ({"Name": "rtprio", "Soft": 0, "Hard": 99}, ["ulimit"]),  # SCHED_FIFO without SYS_NICE
            ({"Name": "RTPRIO", "Soft": 99, "Hard": 99}, ["ulimit"]),  # the daemon upper-cases names
            ({"Name": "nice", "Soft": 40, "Hard": 40}, ["ulimit"]),  # nice -20
            ({"Name": "nice", "Soft": 0, "Hard": 0}, []),
            ({"Name": "memlock", "Soft": 65536, "Hard": 8 * 1024 * 1024}, []),
            ({"Name": "memlock", "Soft": -1, "Hard": -1}, ["ulimit"]),  # unlimited mlock
            ({"Name": "memlock", "Soft": 1, "Hard": -2}, ["ulimit"]),  # negative: a huge unsigned one
            ({"Name": "memlock", "Hard": 8 * 1024 * 1024 + 1}, ["ulimit"]),
            ({"Name": "as", "Soft": 1, "Hard": 1}, ["ulimit"]),  # not one go-units knows
            ({"Name": "", "Soft": 1, "Hard": 1}, ["ulimit"]),
        ],
    )
    def test_create_and_update(
        self, fake_machine: FakeMachine, ulimit: dict[str, Any], refused: list[str]
    ) -> None:
        assert create(fake_machine, {"Ulimits": [ulimit]})[0] == refused
        assert update(fake_machine, {"Ulimits": [ulimit]}) == refused

    @pytest.mark.parametrize(
        ("ulimit", "capability"),
        [
            ({"Name": "rtprio", "Soft": 99, "Hard": 99}, "SYS_NICE"),
            ({"Name": "nice", "Soft": 40, "Hard": 40}, "SYS_NICE"),
            ({"Name": "memlock", "Soft": -1, "Hard": -1}, "IPC_LOCK"),
        ],
    )
    def test_the_machines_capability_lifts_the_bound(
        self, fake_machine: FakeMachine, ulimit: dict[str, Any], capability: str
    ) -> None:
        granted = frozenset({capability})
        assert create(fake_machine, {"Ulimits": [ulimit]}, extra_capabilities=granted)[0] == []
        other = "IPC_LOCK" if capability == "SYS_NICE" else "SYS_NICE"
        allowed = frozenset({other})
        assert create(fake_machine, {"Ulimits": [ulimit]}, extra_capabilities=allowed)[0] == ["ulimit"]

    def test_an_unlimited_daemon_bounds_nothing(self, fake_machine: FakeMachine) -> None:
        unbounded = dict.fromkeys(HARD, UNLIMITED)
        ulimit = {"Name": "memlock", "Soft": -1, "Hard": -1}
        assert create(fake_machine, {"Ulimits": [ulimit]}, hard_limits=unbounded)[0] == []

    def test_the_message_names_the_limit_the_ceiling_and_the_capability(
        self, fake_machine: FakeMachine
    ) -> None:
        body = {"Image": "bb", "HostConfig": {"Ulimits": [{"Name": "rtprio", "Soft": 10, "Hard": 99}]}}
        assert messages(fake_machine, "container-create", body) == [
            "HostConfig.Ulimits rtprio (soft 10, hard 99) is refused: above the daemon's own hard limit "
            "of 0, it gives what only CAP_SYS_NICE should, which this machine does not allow; use instead: "
            "rtprio=0 or less, or the operator's rdc machine config M --set extra-capabilities=SYS_NICE"
        ]

    @pytest.mark.parametrize(
        ("ulimits", "refused"),
        [
            ('[{"Name":"nofile","Soft":1024,"Hard":2048}]', []),
            ('[{"Name":"rtprio","Soft":99,"Hard":99}]', ["ulimit"]),
            ('[{"name":"rtprio","soft":99,"hard":99}]', ["ulimit"]),  # Go matches fields by fold
            ('[{"Name":"rtprio","name":"nofile"}]', ["ulimit"]),  # ambiguous: refused as unreadable
            ("not json", ["ulimit"]),
            ("", []),
        ],
    )
    def test_build_steps(self, fake_machine: FakeMachine, ulimits: str, refused: list[str]) -> None:
        ctx = context(fake_machine, query={"ulimits": (ulimits,)})
        assert [f.refusal.rule for f in check("build", None, ctx)] == refused

    def test_the_gate_reads_its_own_hard_limits(self) -> None:
        limits = own_hard_limits()
        assert set(limits) == {"rtprio", "nice", "memlock"}
        assert all(isinstance(v, int) and v >= UNLIMITED for v in limits.values())


class TestAnnotations:
    @pytest.mark.parametrize(
        ("key", "rule"),
        [
            ("org.opencontainers.image.source", None),  # metadata no runtime acts on
            ("org.opencontainers.image.revision", None),
            ("org.systemd.property.DevicePolicy", "annotation"),  # runc, systemd cgroup driver
            ("org.systemd.property.Slice", "annotation"),
            ("org.criu.config", "annotation"),
            ("run.oci.keep_original_groups", "annotation"),  # crun
            ("io.katacontainers.config.hypervisor.kernel", "annotation"),
            ("nvidia.cdi.k8s.io/x", "annotation"),
            ("example.org/anything", "annotation"),  # unknown: not known to be safe
            ("ORG.OPENCONTAINERS.IMAGE.source", "annotation"),
            ("cdi.k8s.io/x", "cdi-annotation"),
            ("CDI.K8S.IO/x", "cdi-annotation"),
        ],
    )
    def test_only_known_safe_keys_pass(self, fake_machine: FakeMachine, key: str, rule: str | None) -> None:
        refused, _ = create(fake_machine, {"Annotations": {key: "v"}})
        assert refused == ([] if rule is None else [rule])

    def test_the_message_names_the_key(self, fake_machine: FakeMachine) -> None:
        body = {"Image": "bb", "HostConfig": {"Annotations": {"org.systemd.property.Slice": "system.slice"}}}
        assert messages(fake_machine, "container-create", body) == [
            "annotation org.systemd.property.Slice is refused: annotations reach the container runtime, "
            "which acts on some (org.systemd.property.*, org.criu.*, run.oci.*); only "
            "org.opencontainers.image.* metadata passes; use instead: a label (--label) for metadata"
        ]


class TestThroughTheDecider:
    """The whole request: the defaults land in the forwarded body, the machine's setting is read live."""

    def test_v1_40_create_is_forwarded_with_a_private_cgroup_namespace(self, gate: Any) -> None:
        decision = gate.post("/v1.40/containers/create", {"Image": "bb"})
        assert decision.forward
        assert json.loads(decision.body)["HostConfig"] == {"CgroupnsMode": "private", "PidsLimit": 4096}

    def test_the_pids_limit_setting_is_read_live(self, gate: Any) -> None:
        set_setting(gate.fm.machine, "pids-limit", "64")
        decision = gate.create({"Image": "bb", "HostConfig": {"PidsLimit": -1}})
        assert json.loads(decision.body)["HostConfig"]["PidsLimit"] == 64
        refused = gate.create({"Image": "bb", "HostConfig": {"PidsLimit": 65}})
        assert refused.status == 403 and "at most 64 processes" in refused.message

    def test_an_update_asking_for_unlimited_is_forwarded_with_the_limit(self, gate: Any) -> None:
        decision = gate.post("/v1.45/containers/abc/update", {"PidsLimit": -1})
        assert decision.forward and json.loads(decision.body) == {"PidsLimit": 4096}

    def test_ulimits_with_unknown_fields_are_refused_as_unreadable(self, gate: Any) -> None:
        body = {"Image": "bb", "HostConfig": {"Ulimits": [{"Name": "nofile", "Soft": 1, "Hard": 1, "X": 1}]}}
        decision = gate.create(body)
        assert decision.status == 400 and "unknown field in Ulimit" in decision.message
