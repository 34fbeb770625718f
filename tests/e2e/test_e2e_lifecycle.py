"""`rdc repo up / down / docker-host` on a real daemon, and what the repo's daemon is configured with."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator

import pytest
from e2e_kit import E2E, IMAGE, post, raw_exchange

from rediacc_core import pids
from rediacc_core.cdi.spec import BUILDKIT_AUTOALLOW
from rediacc_core.errors import EXIT_STATE
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import daemon, layout
from rediacc_core.runtime.process import read_pid


def test_the_repo_daemon_reads_cdi_specs_only_from_the_machine(e2e: E2E) -> None:
    info = e2e.alpha.docker("info", "--format", "{{json .CDISpecDirs}}")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout) == [str(e2e.root / "etc" / "cdi")]
    config = json.loads(e2e.alpha.runtime.daemon_paths.config.read_text())
    assert config["features"] == {"cdi": True}
    # Bridges and iptables are the repo's own network namespace's (test_e2e_network).
    assert ("bridge" not in config, config["iptables"]) == (True, True)


def test_containers_of_a_repo_daemon_get_its_narrowing_defaults(e2e: E2E) -> None:
    run = e2e.alpha.docker(
        "run", "--rm", "--name", "defaults-probe", IMAGE, "sh", "-c",
        "grep NoNewPrivs /proc/self/status; cat /proc/self/cgroup; readlink /proc/self/ns/ipc",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["NoNewPrivs:", "1"]  # no-new-privileges
    cgroups = lines[1:-1]  # one line on cgroup v2, one per hierarchy on v1
    assert cgroups and all(line.endswith(":/") for line in cgroups)  # a private cgroup namespace
    assert lines[-1] != readlink_ipc_of_this_process()  # a private IPC namespace
    info = e2e.alpha.docker("info", "--format", "{{json .SecurityOptions}}")
    assert "name=cgroupns" in json.loads(info.stdout)


def readlink_ipc_of_this_process() -> str:
    return os.readlink("/proc/self/ns/ipc")


def test_only_the_gate_socket_is_open_to_users(e2e: E2E) -> None:
    runtime = e2e.alpha.runtime
    assert stat.S_IMODE(runtime.daemon_paths.workdir.stat().st_mode) == 0o700
    assert stat.S_IMODE(runtime.gate_socket.stat().st_mode) == 0o660


def test_docker_host_prints_the_gate_socket(e2e: E2E) -> None:
    result = e2e.rdc("repo", "docker-host", e2e.alpha.repo.ref)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"unix://{e2e.alpha.gate}"


def test_up_is_idempotent(e2e: E2E) -> None:
    result = e2e.rdc("repo", "up", e2e.alpha.repo.ref)
    assert result.returncode == 0, result.stderr
    assert daemon.ping(e2e.alpha.gate)


def test_up_prints_the_docker_host_as_json_and_the_listing_says_up(e2e: E2E) -> None:
    result = e2e.rdc("repo", "up", e2e.alpha.repo.ref, "-o", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "repo": e2e.alpha.repo.ref,
        "repoId": e2e.alpha.repo.id,
        "dockerHost": f"unix://{e2e.alpha.gate}",
    }
    listed = e2e.rdc("repo", "list", "m1", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    statuses = {row["ref"]: row["status"] for row in json.loads(listed.stdout)}
    assert statuses[e2e.alpha.repo.ref] == "up"


@pytest.fixture
def attached(e2e: E2E) -> Iterator[Repo]:
    """A repo that uses alpha's daemon (created with --docker-host) instead of its own."""
    created = e2e.rdc("repo", "create", "gamma@m1", "--docker-host", f"unix://{e2e.alpha.daemon}")
    assert created.returncode == 0, created.stderr
    repo = RepoStore(e2e.machine).get_by_label("gamma")
    yield repo
    e2e.rdc("repo", "down", repo.ref)
    e2e.rdc("repo", "delete", repo.ref, "--yes")


def test_a_repo_on_an_existing_daemon_gets_a_gate_and_no_daemon(e2e: E2E, attached: Repo) -> None:
    up = e2e.rdc("repo", "up", attached.ref)
    assert up.returncode == 0, up.stderr
    runtime = layout.runtime_for(e2e.machine, attached)
    assert not runtime.daemon_paths.pidfile.exists()
    privileged = json.dumps({"Image": IMAGE, "HostConfig": {"Privileged": True}}).encode()
    status, answer = raw_exchange(runtime.gate_socket, post("/v1.45/containers/create", privileged))
    assert status in (400, 403), answer
    down = e2e.rdc("repo", "down", attached.ref)
    assert down.returncode == 0, down.stderr
    assert "dockerd" not in down.stderr  # the daemon is not the repo's to stop
    assert daemon.ping(e2e.alpha.daemon) and not daemon.ping(runtime.gate_socket)


def test_down_stops_gate_and_daemon_and_up_brings_them_back(e2e: E2E) -> None:
    created = e2e.rdc("repo", "create", "delta@m1")
    assert created.returncode == 0, created.stderr
    repo = RepoStore(e2e.machine).get_by_label("delta")
    runtime = layout.runtime_for(e2e.machine, repo)
    try:
        up = e2e.rdc("repo", "up", repo.ref)
        assert up.returncode == 0, up.stderr
        assert daemon.ping(runtime.gate_socket) and daemon.ping(runtime.upstream_socket)
        down = e2e.rdc("repo", "down", repo.ref)
        assert down.returncode == 0, down.stderr
        assert "gate" in down.stderr and "dockerd" in down.stderr
        assert not daemon.ping(runtime.gate_socket) and not daemon.ping(runtime.upstream_socket)
        assert not runtime.gate_socket.exists()
        # Nothing kept a connection to dockerd open while it shut down (it would wait 5 s for it).
        assert "Error shutting down http server" not in runtime.daemon_paths.log.read_text()
    finally:
        e2e.rdc("repo", "down", repo.ref)
        e2e.rdc("repo", "delete", repo.ref, "--yes")


def test_a_stopped_daemon_behind_a_live_gate_is_a_clear_502(e2e: E2E) -> None:
    created = e2e.rdc("repo", "create", "epsilon@m1")
    assert created.returncode == 0, created.stderr
    repo = RepoStore(e2e.machine).get_by_label("epsilon")
    runtime = layout.runtime_for(e2e.machine, repo)
    try:
        assert e2e.rdc("repo", "up", repo.ref).returncode == 0
        pid = read_pid(runtime.daemon_paths.pidfile)
        assert pid is not None
        pids.stop_pid(pid, daemon.STOP_TIMEOUT)
        status, answer = raw_exchange(runtime.gate_socket, b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
        assert status == 502
        assert f"rdc repo up {repo.ref}" in json.loads(answer)["message"]
    finally:
        e2e.rdc("repo", "down", repo.ref)
        e2e.rdc("repo", "delete", repo.ref, "--yes")


def test_up_refuses_while_a_cdi_spec_hands_its_device_to_every_build_step(e2e: E2E) -> None:
    """A repo daemon's BuildKit reads the machine's CDI specs itself and gives a device whose spec
    carries its auto-allow annotation to every build step, granted or not: while such a spec is in
    the machine's CDI directory, no repo daemon starts."""
    spec = e2e.machine.cdi_dir / "autoallow-probe.json"
    document = {
        "cdiVersion": "0.5.0",
        "kind": "autoallow.example/dev",
        "annotations": {BUILDKIT_AUTOALLOW: "true"},
        "devices": [{"name": "0", "containerEdits": {"env": ["AUTOALLOWED=1"]}}],
    }
    created = e2e.rdc("repo", "create", "zeta@m1")
    assert created.returncode == 0, created.stderr
    repo = RepoStore(e2e.machine).get_by_label("zeta")
    runtime = layout.runtime_for(e2e.machine, repo)
    try:
        spec.write_text(json.dumps(document))
        up = e2e.rdc("repo", "up", repo.ref)
        assert up.returncode == EXIT_STATE, up.stderr
        assert "a CDI spec on this machine lets any build step have its device" in up.stderr
        assert f"{spec}: at $.annotations: {BUILDKIT_AUTOALLOW} is refused" in up.stderr
        advice = f"remove the {BUILDKIT_AUTOALLOW} annotation (or the spec), then run: rdc repo up {repo.ref}"
        assert f"What to do: {advice}\n" in up.stderr
        assert not daemon.ping(runtime.upstream_socket) and not daemon.ping(runtime.gate_socket)
        spec.unlink()
        again = e2e.rdc("repo", "up", repo.ref)  # the command the refusal printed
        assert again.returncode == 0, again.stderr
        assert daemon.ping(runtime.gate_socket)
    finally:
        spec.unlink(missing_ok=True)
        e2e.rdc("repo", "down", repo.ref)
        e2e.rdc("repo", "delete", repo.ref, "--yes")
