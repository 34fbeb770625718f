"""The docker CLI through the gate: a granted CDI device reaches the container; every other route
to host hardware is refused with a message that says what to use instead."""

from __future__ import annotations

import pytest
from e2e_kit import E2E, GPU0, GPU1, HAS_RENDER_PLUGIN, IMAGE, RENDER, refused
from run_cases import REFUSED_RUNS, case_id


def test_a_granted_cdi_device_appears_in_the_container(e2e: E2E) -> None:
    e2e.grant(e2e.alpha, GPU0)
    try:
        result = e2e.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "ls", "-l", "/dev/fakegpu0")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("c") and "1,   7" in result.stdout  # FAKEGPU0
    finally:
        e2e.revoke(e2e.alpha, GPU0)


def test_an_ungranted_device_is_refused_naming_the_missing_grant(e2e: E2E) -> None:
    result = e2e.alpha.docker("run", "--rm", "--device", GPU1, IMAGE, "true")
    refused(result, f"no grant for {GPU1}", f"rdc repo gpu grant alpha@m1 --device {GPU1}")


def test_revocation_takes_effect_on_the_next_request(e2e: E2E) -> None:
    e2e.grant(e2e.alpha, GPU0)
    admitted = e2e.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true")
    assert admitted.returncode == 0, admitted.stderr
    e2e.revoke(e2e.alpha, GPU0)
    refused(e2e.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), f"no grant for {GPU0}")


def test_a_grant_belongs_to_one_repo(e2e: E2E) -> None:
    e2e.grant(e2e.alpha, GPU0)
    try:
        refused(e2e.beta.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), "repo beta has no grant")
    finally:
        e2e.revoke(e2e.alpha, GPU0)


def test_repos_have_separate_daemons(e2e: E2E) -> None:
    created = e2e.alpha.docker("create", "--name", "only-in-alpha", IMAGE, "true")
    assert created.returncode == 0, created.stderr
    try:
        assert "only-in-alpha" in e2e.alpha.docker("ps", "-a", "--format", "{{.Names}}").stdout
        assert "only-in-alpha" not in e2e.beta.docker("ps", "-a", "--format", "{{.Names}}").stdout
    finally:
        e2e.alpha.docker("rm", "-f", "only-in-alpha")


@pytest.mark.parametrize(("args", "needle"), REFUSED_RUNS, ids=case_id)
def test_hardware_outside_a_cdi_grant_is_refused(e2e: E2E, args: list[str], needle: str) -> None:
    e2e.grant(e2e.alpha, GPU0)  # a grant must not open any other route
    try:
        refused(e2e.alpha.docker("run", "--rm", *args, IMAGE, "true"), needle)
    finally:
        e2e.revoke(e2e.alpha, GPU0)
    assert e2e.alpha.hardware_containers() == []


def test_a_volume_binding_dev_is_refused(e2e: E2E) -> None:
    result = e2e.alpha.docker(
        "volume",
        "create",
        "--driver",
        "local",
        "--opt",
        "type=none",
        "--opt",
        "o=bind",
        "--opt",
        "device=/dev",
        "devvol",
    )
    refused(result, "/dev")
    listed = e2e.alpha.docker("volume", "ls", "-q")
    assert "devvol" not in listed.stdout.split()


@pytest.mark.skipif(not HAS_RENDER_PLUGIN, reason="the render-node plugin is not installed")
def test_raw_render_nodes_are_refused_with_the_cdi_name_to_use(e2e: E2E) -> None:
    refused(e2e.alpha.docker("run", "--rm", "--device", "/dev/dri/renderD128", IMAGE, "true"), RENDER)


@pytest.mark.skipif(not HAS_RENDER_PLUGIN, reason="the render-node plugin is not installed")
def test_a_granted_render_node_appears_in_the_container(e2e: E2E) -> None:
    e2e.grant(e2e.alpha, RENDER)
    try:
        result = e2e.alpha.docker("run", "--rm", "--device", RENDER, IMAGE, "ls", "-l", "/dev/dri/renderD128")
        assert result.returncode == 0, result.stderr
        assert "226, 128" in result.stdout
    finally:
        e2e.revoke(e2e.alpha, RENDER)


def test_adding_the_video_group_is_accepted_and_grants_nothing(e2e: E2E) -> None:
    result = e2e.alpha.docker("run", "--rm", "--group-add", "video", IMAGE, "id")
    assert result.returncode == 0, result.stderr
    assert "video" in result.stdout
    assert (
        e2e.alpha.docker("run", "--rm", "--group-add", "video", IMAGE, "ls", "/dev/fakegpu0").returncode != 0
    )
