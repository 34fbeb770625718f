"""The BuildKit policy as a specification: each row is a request encoded by hand, field by field
as buildx would send it, and what the gate does with it (passes, or refuses naming the field)."""

from __future__ import annotations

import pytest

from rediacc_core.gate import buildkit
from rediacc_core.gate.buildkit.llb import BuildPolicy
from rediacc_core.gate.wire.protowire import Message, length_field, map_entry, varint_field

POLICY = BuildPolicy(hard_limits={"rtprio": 0, "nice": 0, "memlock": 65536})
SOLVE = buildkit.CONTROL + "Solve"
BRIDGE_SOLVE = buildkit.BRIDGE + "Solve"


def attrs(field: int, values: dict[str, str] | None = None, **simple: str) -> bytes:
    """Map entries of frontend attributes: `values` as named, `simple` with `_` for `-`."""
    named = {**(values or {}), **{name.replace("_", "-"): v for name, v in simple.items()}}
    return b"".join(map_entry(field, name, value) for name, value in named.items())


def dockerfile(values: dict[str, str] | None = None, **simple: str) -> bytes:
    """A Control.Solve with the built-in frontend (field 6) and frontend attributes (field 7)."""
    return length_field(6, "dockerfile.v0") + attrs(7, values, **simple)


def definition(*ops: bytes) -> bytes:
    return b"".join(length_field(1, op) for op in ops)


def exec_op(*extra: bytes, meta: bytes = b"") -> bytes:
    """An Op holding an ExecOp: `sh -c true` on the root mount, plus `extra` ExecOp fields."""
    args = b"".join(length_field(1, a) for a in ("/bin/sh", "-c", "true"))
    root = length_field(2, varint_field(4, 0) + length_field(3, "/"))
    return length_field(2, length_field(1, args + meta) + root + b"".join(extra))


def source_op(identifier: str) -> bytes:
    return length_field(3, length_field(1, identifier))


def with_definition(*ops: bytes) -> bytes:
    return length_field(2, definition(*ops))


PASSES = [
    (
        "a Dockerfile build as buildx sends it",
        dockerfile(filename="Dockerfile", target="app", platform="linux/amd64"),
    ),
    ("build args and labels", dockerfile({"build-arg:HTTP_PROXY": "http://proxy:3128", "label:team": "ml"})),
    ("--network none", dockerfile(force_network_mode="none")),
    ("a ulimit within the daemon's own", dockerfile(ulimit="nofile=1024:2048")),
    (
        "named contexts from an image, a directory, another stage",
        dockerfile(
            {
                "context:base": "docker-image://docker.io/library/alpine:3",
                "context:src": "local:src",
                "context:stage": "target:build",
            }
        ),
    ),
    (
        "a git context, cloned by the daemon without the host's keys",
        dockerfile(context="https://example.com/r.git"),
    ),
    ("the build graph of the built-in frontend's gateway call", b""),
    (
        "a plain RUN step in a graph the client sent",
        with_definition(source_op("docker-image://docker.io/library/bb"), exec_op()),
    ),
    (
        "--network none and a tmpfs mount",
        with_definition(exec_op(varint_field(3, 2), length_field(2, varint_field(6, 4)))),
    ),
    (
        "the moby exporter and an inline cache",
        length_field(13, length_field(1, "moby"))
        + length_field(8, length_field(4, length_field(1, "inline"))),
    ),
]


@pytest.mark.parametrize("request_", [p[1] for p in PASSES], ids=[p[0] for p in PASSES])
def test_control_solve_passes(request_: bytes) -> None:
    verdict = buildkit.check(SOLVE, request_, POLICY)
    assert not verdict.refused, [f.refusal.message for f in verdict.findings]


REFUSED = [
    (
        "--network host",
        length_field(9, "network.host"),
        "(docker build --network host, or --allow network.host)",
        "build-option",
    ),
    ("--allow security.insecure", length_field(9, "security.insecure"), "security.insecure", "build-option"),
    ("--allow device", length_field(9, "device"), "'device'", "build-option"),
    ("a custom frontend image", length_field(6, "gateway.v0"), "'gateway.v0' is refused", "build-option"),
    (
        "BUILDKIT_SYNTAX",
        dockerfile({"build-arg:BUILDKIT_SYNTAX": "evil/fe"}),
        "BUILDKIT_SYNTAX",
        "build-option",
    ),
    (
        "--cgroup-parent",
        dockerfile(cgroup_parent="/escaped"),
        "cgroup-parent '/escaped' is refused",
        "cgroup-parent",
    ),
    (
        "force-network-mode=host",
        dockerfile(force_network_mode="host"),
        "force-network-mode=host is refused",
        "namespace",
    ),
    (
        "an attribute the gate does not know",
        dockerfile(device="vendor.example/gpu=0"),
        "'device' is refused",
        "build-option",
    ),
    ("a ulimit above the daemon's", dockerfile(ulimit="rtprio=99"), "Ulimits rtprio", "ulimit"),
    ("a ulimit it cannot read", dockerfile(ulimit="nofile=lots"), "cannot be read", "ulimit"),
    (
        "a loopback image context",
        dockerfile({"context:base": "docker-image://127.0.0.1:5000/app"}),
        "127.0.0.1",
        "fetch-address",
    ),
    ("a loopback git context", dockerfile(context="http://127.0.0.1/r.git"), "127.0.0.1", "fetch-address"),
    (
        "an unknown named context",
        dockerfile({"context:x": "file:///etc"}),
        "not a context the gate knows",
        "build-option",
    ),
    ("a host-network step", with_definition(exec_op(varint_field(3, 1))), "exec.network=host", "namespace"),
    ("a privileged step", with_definition(exec_op(varint_field(4, 1))), "security=insecure", "privileged"),
    (
        "a step with a CDI device",
        with_definition(exec_op(length_field(6, length_field(1, "vendor.example/gpu=0")))),
        "cdiDevices 'vendor.example/gpu=0'",
        "raw-device",
    ),
    (
        "a step's cgroup parent",
        with_definition(exec_op(meta=length_field(10, "/escaped"))),
        "cgroupParent",
        "cgroup-parent",
    ),
    (
        "a step's rtprio",
        with_definition(exec_op(meta=length_field(9, length_field(1, "rtprio") + varint_field(2, 99)))),
        "rtprio",
        "ulimit",
    ),
    (
        "an ExecOp field the gate does not know",
        with_definition(exec_op(varint_field(40, 1))),
        "field 40",
        "build-option",
    ),
    (
        "a mount type the gate does not know",
        with_definition(exec_op(length_field(2, varint_field(6, 9)))),
        "mount type 9",
        "mount-type",
    ),
    ("a nested build", with_definition(length_field(5, varint_field(1, 0))), "BuildOp", "build-option"),
    (
        "a source the gate does not know",
        with_definition(source_op("hostpath:///etc")),
        "not a source",
        "build-option",
    ),
    (
        "a loopback image source",
        with_definition(source_op("docker-image://localhost:5000/x")),
        "localhost",
        "fetch-address",
    ),
    (
        "a frontend input's steps",
        map_entry(10, "ctx", definition(exec_op(varint_field(4, 1)))),
        "FrontendInputs[ctx]",
        "privileged",
    ),
    (
        "an exporter the gate does not know",
        length_field(13, length_field(1, "hostdir")),
        "exporter 'hostdir'",
        "build-option",
    ),
    (
        "a cache the gate does not know",
        length_field(8, length_field(5, length_field(1, "nfs"))),
        "'nfs'",
        "build-option",
    ),
    ("a SolveRequest field the gate does not know", length_field(40, "x"), "field 40", "build-option"),
    ("a message that cannot be read", b"\x12\x05ab", "cannot be read", "bad-request"),
]


@pytest.mark.parametrize(("request_", "said", "rule"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_control_solve_refuses(request_: bytes, said: str, rule: str) -> None:
    verdict = buildkit.check(SOLVE, request_, POLICY)
    messages = [f.refusal.message for f in verdict.findings]
    assert any(said in m for m in messages), messages
    assert rule in {f.refusal.rule for f in verdict.findings}
    assert all(f.refusal.replacement for f in verdict.findings if f.refusal.rule != "bad-request")


@pytest.mark.parametrize(
    ("path", "request_", "field"),
    [
        (SOLVE, dockerfile(filename="Dockerfile"), 7),
        (BRIDGE_SOLVE, length_field(2, "dockerfile.v0") + attrs(3, filename="Dockerfile"), 3),
    ],
    ids=["Control.Solve", "LLBBridge.Solve"],
)
def test_the_built_in_frontend_is_pinned_so_a_syntax_line_is_not_followed(
    path: str, request_: bytes, field: int
) -> None:
    verdict = buildkit.check(path, request_, POLICY)
    assert not verdict.refused and verdict.notes == (buildkit.PIN_NOTE,)
    assert Message(verdict.message).string_map(field) == {"filename": "Dockerfile", buildkit.PIN_ATTR: ""}
    again = buildkit.check(path, verdict.message, POLICY)  # already pinned: left as it is
    assert again.message == verdict.message and again.notes == ()


def test_a_graph_without_a_frontend_is_not_pinned() -> None:
    request_ = with_definition(exec_op())
    assert buildkit.check(SOLVE, request_, POLICY).message == request_


@pytest.mark.parametrize(
    ("path", "request_", "said"),
    [
        (BRIDGE_SOLVE, length_field(2, "gateway.v0"), "'gateway.v0' is refused"),
        (BRIDGE_SOLVE, length_field(1, definition(exec_op(varint_field(3, 1)))), "network=host"),
        (BRIDGE_SOLVE, length_field(2, "dockerfile.v0") + attrs(3, cgroup_parent="/x"), "cgroup-parent"),
        (buildkit.BRIDGE + "NewContainer", varint_field(3, 1), "Network=host"),
        (buildkit.BRIDGE + "NewContainer", length_field(2, varint_field(6, 7)), "mount type 7"),
        (buildkit.BRIDGE + "ExecProcess", length_field(2, varint_field(5, 1)), "Security=insecure"),
        (
            buildkit.BRIDGE + "ExecProcess",
            length_field(2, length_field(2, length_field(10, "/x"))),
            "cgroupParent",
        ),
    ],
    ids=[
        "gateway-frontend",
        "bridge-host-step",
        "bridge-cgroup-attr",
        "debug-host-network",
        "debug-mount",
        "exec-insecure",
        "exec-cgroup",
    ],
)
def test_the_frontend_bridge_calls_are_checked_alike(path: str, request_: bytes, said: str) -> None:
    verdict = buildkit.check(path, request_, POLICY)
    assert any(said in f.refusal.message for f in verdict.findings), verdict.findings


def test_stdin_and_resizes_of_a_process_pass() -> None:
    file_message = length_field(1, "p1") + length_field(3, varint_field(1, 0) + length_field(2, b"data"))
    assert not buildkit.check(buildkit.BRIDGE + "ExecProcess", file_message, POLICY).refused


def test_every_method_is_classified_and_only_those_with_steps_are_checked() -> None:
    checked = {path for path, action in buildkit.METHODS.items() if action == "check"}
    assert checked == {SOLVE, BRIDGE_SOLVE, buildkit.BRIDGE + "NewContainer", buildkit.BRIDGE + "ExecProcess"}
    assert buildkit.action("/moby.buildkit.v1.Control/Unheard") is None
