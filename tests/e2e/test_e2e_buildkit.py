"""BuildKit through the gate (buildx over /grpc), with no environment variables: `docker build`
and `docker compose up --build` work, a `# syntax=` line does not bring in another frontend, and
every build option that reaches the host is refused, proven by what the build would have left."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, buildkit_call

from rediacc_core.gate import buildkit
from rediacc_core.gate.wire.protowire import length_field, map_entry, varint_field


def _context(base: Path, dockerfile: str, **files: str) -> Path:
    context = base / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (context / name).write_text(text)
    return context


def _built(e2e: E2E, tag: str) -> bool:
    return e2e.alpha.docker("image", "inspect", tag).returncode == 0


@pytest.mark.parametrize("syntax", ["", "# syntax=docker/dockerfile:1\n"], ids=["plain", "syntax-line"])
def test_docker_build_uses_buildkit_through_the_gate(e2e: E2E, tmp_short: Path, syntax: str) -> None:
    """No registry is reachable from here: had the daemon followed the `# syntax=` line, it would
    have had to pull docker/dockerfile:1 and failed."""
    context = _context(
        tmp_short,
        f"{syntax}FROM {IMAGE}\nCOPY greeting /greeting\nRUN --mount=type=cache,target=/c cat /greeting\n"
        'CMD ["cat", "/greeting"]\n',
        greeting="built by BuildKit through the gate\n",
    )
    tag = f"bk-{uuid.uuid4().hex[:6]}:1"
    build = e2e.alpha.docker("build", "-t", tag, str(context), timeout=300)
    assert build.returncode == 0, build.stderr
    try:
        assert e2e.alpha.docker("run", "--rm", tag).stdout == "built by BuildKit through the gate\n"
    finally:
        e2e.alpha.docker("rmi", "-f", tag)


def test_compose_up_build_builds_with_buildkit_and_runs(e2e: E2E, tmp_short: Path) -> None:
    project = tmp_short / f"bkc{uuid.uuid4().hex[:6]}"
    project.mkdir()
    (project / "Dockerfile").write_text(f'FROM {IMAGE}\nRUN echo composed > /said\nCMD ["cat", "/said"]\n')
    (project / "compose.yaml").write_text("services:\n  app:\n    build: .\n")
    try:
        up = e2e.alpha.compose(project, "up", "--build", "--abort-on-container-exit", timeout=300)
        assert up.returncode == 0, up.stderr
        assert "composed" in up.stdout
    finally:
        e2e.alpha.compose(project, "down", "--rmi", "all")


@pytest.mark.parametrize(
    ("flags", "dockerfile_run", "said"),
    [
        (["--network", "host"], "RUN cat /proc/net/dev > /seen", "network.host"),
        (
            ["--allow", "security.insecure"],
            "RUN --security=insecure cat /proc/self/status > /seen",
            "security.insecure",
        ),
        (["--build-arg", "BUILDKIT_SYNTAX=evil.example/frontend:1"], "RUN true > /seen", "BUILDKIT_SYNTAX"),
    ],
    ids=["network-host", "security-insecure", "custom-frontend"],
)
def test_build_options_reaching_the_host_are_refused(
    e2e: E2E, tmp_short: Path, flags: list[str], dockerfile_run: str, said: str
) -> None:
    context = _context(tmp_short, f"FROM {IMAGE}\n{dockerfile_run}\n")
    tag = f"evil-{uuid.uuid4().hex[:6]}:1"
    result = e2e.alpha.docker("build", *flags, "-t", tag, str(context), timeout=300)
    assert result.returncode != 0, result.stdout
    assert "rdc gate" in result.stderr and said in result.stderr, result.stderr
    assert not _built(e2e, tag)


def test_a_cgroup_parent_is_refused_and_no_cgroup_appears(e2e: E2E, tmp_short: Path) -> None:
    escaped = f"rdc-escaped-{uuid.uuid4().hex[:8]}"
    context = _context(tmp_short, f"FROM {IMAGE}\nRUN cat /proc/self/cgroup > /seen\n")
    result = e2e.alpha.docker(
        "build", "--cgroup-parent", f"/{escaped}", "-t", "cg:1", str(context), timeout=300
    )
    assert result.returncode != 0 and "cgroup-parent" in result.stderr, result.stderr
    assert not _built(e2e, "cg:1")
    cgroups = Path("/sys/fs/cgroup")
    assert not (cgroups / escaped).exists() and not list(cgroups.glob(f"*/{escaped}"))


def test_a_dockerfile_step_asking_for_a_device_gets_none(e2e: E2E, tmp_short: Path) -> None:
    """The daemon's own frontend builds the Dockerfile (a `# syntax=` labs image is not followed)
    and has no `RUN --device`: the step never runs, whatever the machine's CDI specs say."""
    context = _context(
        tmp_short,
        f"# syntax=docker/dockerfile:1-labs\nFROM {IMAGE}\n"
        "RUN --device=vendor.example/gpu=0 ls /dev > /seen\n",
    )
    result = e2e.alpha.docker("build", "-t", "dev:1", str(context), timeout=300)
    assert result.returncode != 0 and "device" in result.stderr, result.stderr
    assert not _built(e2e, "dev:1")


def _exec_definition(exec_op: bytes) -> bytes:
    """A build graph of one image source and one exec step on it, as LLB: a `pb.Definition`."""
    source = length_field(3, length_field(1, f"docker-image://docker.io/library/{IMAGE}"))
    source_digest = "sha256:" + __import__("hashlib").sha256(source).hexdigest()
    step = length_field(1, length_field(1, source_digest)) + length_field(2, exec_op)
    return length_field(1, source) + length_field(1, step)


def _run_step(*extra: bytes) -> bytes:
    meta = length_field(1, length_field(1, "/bin/sh") + length_field(1, "-c") + length_field(1, "true"))
    root = length_field(2, varint_field(4, 0) + length_field(3, "/"))
    return meta + root + b"".join(extra)


@pytest.mark.parametrize(
    ("request_", "said"),
    [
        (
            length_field(
                2, _exec_definition(_run_step(length_field(6, length_field(1, "vendor.example/gpu=0"))))
            ),
            "cdiDevices 'vendor.example/gpu=0' is refused",
        ),
        (
            length_field(6, "gateway.v0") + map_entry(7, "source", "evil.example/frontend:1"),
            "'gateway.v0' is refused",
        ),
        (length_field(2, _exec_definition(_run_step(varint_field(3, 1)))), "network=host is refused"),
    ],
    ids=["cdi-device-step", "gateway-frontend", "host-network-step"],
)
def test_crafted_solve_requests_are_refused_before_the_daemon_sees_them(
    e2e: E2E, request_: bytes, said: str
) -> None:
    status, message = buildkit_call(e2e.alpha.gate, buildkit.CONTROL + "Solve", request_)
    assert status == 7 and said in message, message


def test_a_compressed_solve_is_refused_whatever_it_holds(e2e: E2E) -> None:
    """The gate judges plain bytes; the daemon would inflate a gzipped message itself, unjudged. So
    the compressed flag alone is refused: here a step asking for a device, refused plain above."""
    cdi_step = length_field(
        2, _exec_definition(_run_step(length_field(6, length_field(1, "vendor.example/gpu=0"))))
    )
    status, message = buildkit_call(e2e.alpha.gate, buildkit.CONTROL + "Solve", cdi_step, compressed=True)
    assert status == 3 and "compressed request messages are refused (send them plain)" in message, message
