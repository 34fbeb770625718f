"""Where the e2e and SSH suites must run (tox's envs, so CI), a machine that cannot run them is an
error: skipped, every test would skip and tox would still say OK."""

from __future__ import annotations

from pathlib import Path

import e2e_kit
import pytest
import ssh_kit


def test_the_e2e_suite_errors_where_it_is_required_and_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDC_E2E", "1")
    monkeypatch.setattr(e2e_kit, "docker_unavailable", lambda: "a static busybox is not installed")
    monkeypatch.setenv(e2e_kit.REQUIRED, "1")
    assert e2e_kit.unmet_requirement() == (
        "RDC_E2E_REQUIRED=1, but the end-to-end tests cannot run here: a static busybox is not installed"
    )
    monkeypatch.delenv(e2e_kit.REQUIRED)
    assert e2e_kit.unmet_requirement() is None  # a developer's run: skipped, saying why
    assert e2e_kit.skip_reason() == "a static busybox is not installed"


def test_the_e2e_suite_that_can_run_is_no_error_where_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RDC_E2E", "1")
    monkeypatch.setenv(e2e_kit.REQUIRED, "1")
    monkeypatch.setattr(e2e_kit, "docker_unavailable", lambda: None)
    assert e2e_kit.unmet_requirement() is None


def test_the_ssh_suite_and_its_docker_test_error_where_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ssh_kit.REQUIRED, "1")
    assert ssh_kit.unmet_requirement("OpenSSH is not installed") == (
        "RDC_SSH_REQUIRED=1, but the SSH tests cannot run here: OpenSSH is not installed"
    )
    assert ssh_kit.unmet_requirement(None) is None
    monkeypatch.delenv(ssh_kit.REQUIRED)
    assert ssh_kit.unmet_requirement("OpenSSH is not installed") is None


def test_toxs_e2e_and_ssh_envs_require_their_suites() -> None:
    tox = (Path(__file__).parent.parent / "tox.ini").read_text()
    assert f"{e2e_kit.REQUIRED} = 1" in tox and f"{ssh_kit.REQUIRED} = 1" in tox
