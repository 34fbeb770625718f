"""`rdc repo check` agrees with the live gate: each docker run line and Compose file the suite sends
through the real docker CLI is checked offline first, and both say the same thing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from e2e_kit import E2E, GPU0, GPU1, IMAGE, refused
from run_cases import REFUSED_RUNS, case_id


def _checked(e2e: E2E, *words: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
    result = e2e.rdc("repo", "check", e2e.alpha.repo.ref, "-o", "json", *words)
    assert result.returncode in (0, 4), result.stderr
    return result, json.loads(result.stdout)


def _agree(checked: list[dict[str, object]], live: subprocess.CompletedProcess[str]) -> None:
    """The check's verdict is the gate's, and each refusal it names is one the gate sent."""
    admitted = all(row["admitted"] for row in checked)
    assert admitted == (live.returncode == 0), (checked, live.stderr)
    for row in checked:
        for refusal in row["refusals"]:  # type: ignore[attr-defined]
            said = refusal["message"] + (f"; use instead: {refusal['instead']}" if refusal["instead"] else "")
            assert said in live.stderr, (said, live.stderr)


@pytest.mark.parametrize(
    ("args", "needle"),
    [*REFUSED_RUNS, (["--device", GPU1], "no grant"), (["--device", GPU0], "")],
    ids=case_id,
)
def test_a_docker_run_line_is_checked_as_the_gate_decides_it(e2e: E2E, args: list[str], needle: str) -> None:
    line = ["run", "--rm", *args, IMAGE, "true"]
    e2e.grant(e2e.alpha, GPU0)
    try:
        result, checked = _checked(e2e, "--", "docker", *line)
        live = e2e.alpha.docker(*line)
    finally:
        e2e.revoke(e2e.alpha, GPU0)
    assert result.returncode == (0 if not needle else 4), result.stdout
    assert needle in result.stdout
    _agree(checked, live)


def test_a_compose_file_is_checked_as_the_gate_decides_it(e2e: E2E, tmp_path: Path) -> None:
    project = tmp_path / "checked"
    project.mkdir()
    (project / "compose.yaml").write_text(
        f"services:\n  train:\n    image: {IMAGE}\n    command: ['true']\n    devices: ['{GPU1}']\n"
    )
    result, checked = _checked(e2e, str(project / "compose.yaml"))
    assert result.returncode == 4 and f"no grant for {GPU1}" in result.stdout
    live = e2e.alpha.compose(project, "up")
    try:
        _agree(checked, live)
    finally:
        e2e.alpha.compose(project, "down")


def test_a_device_held_exclusively_elsewhere_names_its_holder_live_and_offline(e2e: E2E) -> None:
    # A grant of it would be refused, so both say who holds it and the handover, not that grant.
    granted = e2e.rdc("repo", "gpu", "grant", e2e.beta.repo.ref, "--device", GPU1, "--exclusive")
    assert granted.returncode == 0, granted.stderr
    line = ["run", "--rm", "--device", GPU1, IMAGE, "true"]
    try:
        result, checked = _checked(e2e, "--", "docker", *line)
        live = e2e.alpha.docker(*line)
    finally:
        e2e.revoke(e2e.beta, GPU1)
    handover = f"rdc repo gpu grant {e2e.alpha.repo.ref} --device {GPU1} --exclusive --take-over"
    refused(live, f"repo {e2e.beta.repo.ref} holds {GPU1} exclusively", handover)
    assert result.returncode == 4 and handover in result.stdout
    _agree(checked, live)
