"""Where the e2e and SSH suites must run (tox's envs, so CI), a machine that cannot run them is an
error: skipped, every test would skip and tox would still say OK."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from pathlib import Path

import e2e_kit
import pytest
import ssh_kit
from suite_guard import read_allowed


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


# --- the real suites' conftests, run as CI runs them --------------------------------------------

ROOT = Path(__file__).parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def _pytest(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RDC_E2E", "RDC_SSH"))}
    return subprocess.run(
        [*PYTEST, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("suite", "env", "says"),
    [
        ("tests/e2e/test_e2e_host_ip.py", {e2e_kit.REQUIRED: "1"},
         "RDC_E2E_REQUIRED=1, but the end-to-end tests cannot run here: end-to-end tests run with RDC_E2E=1"),
        ("tests/ssh/test_fleet_docker.py", {ssh_kit.REQUIRED: "1"},
         "RDC_SSH_REQUIRED=1, but the SSH tests cannot run here: SSH tests run with RDC_SSH=1"),
    ],
)  # fmt: skip
def test_a_required_suite_that_cannot_run_is_a_usage_error(
    suite: str, env: dict[str, str], says: str
) -> None:
    run = _pytest([suite], ROOT, **env)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert says in run.stderr
    skipped = _pytest([suite], ROOT)  # a developer's run: skipped, saying why
    assert skipped.returncode == pytest.ExitCode.OK, skipped.stdout + skipped.stderr
    assert "skipped" in skipped.stdout


@pytest.mark.parametrize("suite", ["e2e", "ssh"])
def test_each_required_suite_registers_its_guard_and_its_allowed_skips_name_real_tests(suite: str) -> None:
    conftest = (ROOT / "tests" / suite / "conftest.py").read_text()
    assert "GUARD = RequiredSuite(" in conftest and "config.pluginmanager.register(GUARD" in conftest
    for allowed in read_allowed(ROOT / "tests" / suite / "allowed_skips.txt"):
        file, _, test = allowed.test.partition("::")
        assert test.split("[")[0] and f"def {test.split('[')[0]}(" in (ROOT / file).read_text(), allowed


# --- the guard itself, on a suite of its own -----------------------------------------------------

_CONFTEST = """
from pathlib import Path
import configparser
import os
import re
from suite_guard import RequiredSuite

GUARD = RequiredSuite(
    "sample", Path(__file__).parent, "SAMPLE_REQUIRED", lambda: os.environ.get("SAMPLE_UNMET")
)


def pytest_configure(config):
    config.pluginmanager.register(GUARD)
"""
_TESTS = """
import pytest

def test_runs():
    pass

def test_port_80_taken():
    pytest.skip("the host has a service on port 80")

@pytest.mark.skipif(True, reason="an old Engine")
def test_new_engine_only():
    pass

@pytest.mark.xfail(reason="expected")
def test_known_bug():
    assert False
"""


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "suite" / "test_sample.py").write_text(_TESTS)
    (tmp_path / "suite" / "test_vendor.py").write_text(
        'import pytest\n\npytest.importorskip("rdc_no_such_vendor_kit")\n\ndef test_card():\n    pass\n'
    )
    (tmp_path / "suite" / "allowed_skips.txt").write_text(
        "# comment\n\nsuite/test_sample.py::test_new_* | an old Engine | the new Engine's env runs it\n"
    )
    return tmp_path


def _sample(sample: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return _pytest(["-rs", "suite"], sample, PYTHONPATH=str(ROOT / "tests"), **env)


def test_a_skip_not_on_the_allowed_list_fails_a_required_run_naming_it(sample: Path) -> None:
    run = _sample(sample, SAMPLE_REQUIRED="1")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "SAMPLE_REQUIRED=1: 2 sample test(s) skipped that must run here" in run.stdout
    assert "suite/test_sample.py::test_port_80_taken: the host has a service on port 80" in run.stdout
    assert "suite/test_vendor.py: could not import 'rdc_no_such_vendor_kit'" in run.stdout  # skipped whole
    assert "test_new_engine_only:" not in run.stdout.split("must run here")[1]  # allowed, with its reason


def test_allowed_skips_and_unrequired_runs_pass(sample: Path) -> None:
    (sample / "suite" / "allowed_skips.txt").write_text(
        "suite/test_sample.py::test_new_* | an old Engine | the new Engine's env runs it\n"
        "suite/test_sample.py::test_port_80_taken | port 80 | a host service, in this sample\n"
        "suite/test_vendor.py | rdc_no_such_vendor_kit | no such kit, in this sample\n"
    )
    assert _sample(sample, SAMPLE_REQUIRED="1").returncode == pytest.ExitCode.OK
    (sample / "suite" / "allowed_skips.txt").write_text("")
    assert _sample(sample).returncode == pytest.ExitCode.OK  # a developer's run: skips are skips


def test_an_allowed_skip_must_give_the_reason_listed(sample: Path) -> None:
    (sample / "suite" / "allowed_skips.txt").write_text(
        "suite/test_sample.py::* | an old Engine | the new Engine's env runs it\n"
    )
    run = _sample(sample, SAMPLE_REQUIRED="1")
    assert run.returncode == pytest.ExitCode.TESTS_FAILED
    assert "test_port_80_taken: the host has a service on port 80" in run.stdout


def test_an_unmet_requirement_is_a_usage_error(sample: Path) -> None:
    run = _sample(sample, SAMPLE_REQUIRED="1", SAMPLE_UNMET="no daemon here")
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert "no daemon here" in run.stderr


def test_a_line_of_the_allowed_list_that_does_not_read_is_named(tmp_path: Path) -> None:
    listed = tmp_path / "allowed_skips.txt"
    listed.write_text("tests/e2e/test_x.py::test_y | a reason\n")
    with pytest.raises(ValueError) as raised:
        read_allowed(listed)
    assert "allowed_skips.txt:1: not `test | what its skip says | why it is allowed`" in str(raised.value)


def test_toxs_all_env_fails_under_its_coverage_floor() -> None:
    """The floor (80%) is a command-line option of the `all` env: dropped, nothing else would notice."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    commands = tox["testenv:all"]["commands"]
    floors = re.findall(r"--cov-fail-under=(\d+)", commands)
    assert floors == ["80"], commands
    assert "--cov=rediacc_core" in commands
    assert "it fails under 80%" in tox["testenv:all"]["description"]  # what the env says of itself
