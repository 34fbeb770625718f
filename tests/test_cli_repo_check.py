"""`rdc repo check`: a Compose file or a docker run line decided offline by the gate's own decider,
against the repo's grants and the machine's settings; exit 4 when anything would be refused."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from grants_kit import GPU, registered_box
from run_cases import REFUSED_RUNS, case_id

from rediacc_core.cli import cli
from rediacc_core.cli.check_compose import from_compose
from rediacc_core.cli.check_docker import from_docker
from rediacc_core.errors import EXIT_REFUSED, EXIT_VALIDATION
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore, files_dir
from rediacc_core.settings import set_setting
from rediacc_core.testing import FakeMachine

GPU0, GPU1 = f"{GPU}=0", f"{GPU}=1"


@pytest.fixture
def box(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> Iterator[Machine]:
    with registered_box(make_fake_machine("box")) as machine:
        assert rdc("repo", "create", "alpha@box").exit_code == 0
        yield machine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def check_run(*options: str, fmt: str = "table") -> Result:
    return rdc("repo", "check", "alpha@box", "-o", fmt, "--", "docker", "run", "--rm", *options, "bb", "true")


class TestDockerRunLines:
    def test_a_granted_device_is_admitted_and_nothing_is_mounted(self, box: Machine) -> None:
        assert rdc("repo", "gpu", "grant", "alpha@box", "--device", GPU0).exit_code == 0
        files = files_dir(box, RepoStore(box).get_by_label("alpha").id)
        files.mkdir(parents=True, exist_ok=True)
        result = check_run("--device", GPU0, "-v", f"{files}:/data")
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == "docker run: admitted"
        assert "would admit all 1 requests" in result.stderr
        assert not (box.run_dir / "pins").exists()  # an offline decision pins no bind source

    def test_an_ungranted_device_is_refused_with_the_grant_to_ask_for(self, box: Machine) -> None:
        result = check_run("--device", GPU1)
        assert result.exit_code == EXIT_REFUSED, result.output
        assert f"[grant] repo alpha has no grant for {GPU1}" in result.stdout
        assert f"rdc repo gpu grant alpha@box --device {GPU1}" in result.stdout
        assert "would refuse 1 of 1 requests" in result.stderr

    @pytest.mark.parametrize(("args", "needle"), REFUSED_RUNS, ids=case_id)
    def test_the_e2e_suites_refused_runs_are_refused_offline_too(
        self, box: Machine, args: list[str], needle: str
    ) -> None:
        # The same cases tests/e2e/test_e2e_devices.py sends through the live gate.
        assert rdc("repo", "gpu", "grant", "alpha@box", "--device", GPU0).exit_code == 0
        result = check_run(*args, fmt="json")
        assert result.exit_code == EXIT_REFUSED, result.output
        [row] = json.loads(result.stdout)
        assert not row["admitted"] and row["status"] in (400, 403)
        assert any(needle in f"{r['message']} {r['instead']}" for r in row["refusals"]), row

    def test_a_device_another_repo_holds_exclusively_names_it_and_the_handover(self, box: Machine) -> None:
        assert rdc("repo", "create", "beta@box").exit_code == 0
        granted = rdc("repo", "gpu", "grant", "beta@box", "--device", GPU0, "--exclusive")
        assert granted.exit_code == 0, granted.output
        for asked, why in (
            (GPU0, f"holds {GPU0} exclusively"),
            (f"{GPU}=all", f"holds {GPU0} exclusively, which reaches the same hardware as {GPU}=all"),
        ):
            result = check_run("--device", asked)
            assert result.exit_code == EXIT_REFUSED
            assert f"repo alpha has no grant for {asked}, and cannot have one now: repo beta@box {why}" in (
                result.stdout
            )
            assert f"`rdc repo gpu grant alpha@box --device {asked} --exclusive --take-over`" in result.stdout
            assert f"({GPU.split('/')[0]}" not in result.stdout  # no plain grant advised

    def test_each_refusal_has_its_rule_and_replacement(self, box: Machine) -> None:
        result = check_run("--privileged", "--cap-add", "SYS_ADMIN", "-p", "80:80")
        assert result.exit_code == EXIT_REFUSED
        rules = [line.split("]")[0].strip(" [") for line in result.stdout.splitlines() if "] " in line]
        assert {"privileged", "capability"} <= set(rules), result.stdout
        assert "    instead: " in result.stdout

    def test_the_machines_settings_are_read(self, box: Machine) -> None:
        assert check_run("--cap-add", "NET_ADMIN").exit_code == EXIT_REFUSED
        set_setting(box, "extra-capabilities", "NET_ADMIN")
        assert check_run("--cap-add", "NET_ADMIN").exit_code == 0

    def test_an_unknown_option_is_an_error_never_skipped(self, box: Machine) -> None:
        result = check_run("--frobnicate", "x")
        assert result.exit_code == EXIT_VALIDATION
        assert "does not know the docker run option --frobnicate" in result.stderr

    def test_only_run_and_create_lines_are_read(self, box: Machine) -> None:
        result = rdc("repo", "check", "alpha@box", "--", "docker", "exec", "x", "sh")
        assert result.exit_code == EXIT_VALIDATION and "not docker exec" in result.stderr


class TestTranslation:
    def test_the_cli_forms_of_devices_binds_and_ports(self, tmp_path: Path) -> None:
        [request] = from_docker(
            ["docker", "create", "--name", "x", "-it", "--device", GPU0, "--device", "/dev/a:/dev/b:r",
             "--gpus", "all", "-v", "/srv:/srv:ro", "-v", "/anon", "-p", "127.0.0.1:8080:80/udp",
             "--network=host", "-e", "A=1", "bb", "sh", "-c", "true"]
        )  # fmt: skip
        assert request.target == "/v1.45/containers/create?name=x"
        host = request.body["HostConfig"]
        assert host["DeviceRequests"] == [
            {"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]},
            {"Driver": "cdi", "DeviceIDs": [GPU0]},
        ]
        assert host["Devices"] == [
            {"PathOnHost": "/dev/a", "PathInContainer": "/dev/b", "CgroupPermissions": "r"}
        ]
        assert host["Binds"] == ["/srv:/srv:ro"] and request.body["Volumes"] == {"/anon": {}}
        assert host["PortBindings"] == {"80/udp": [{"HostIp": "127.0.0.1", "HostPort": "8080"}]}
        assert host["NetworkMode"] == "host"
        assert (request.body["Env"], request.body["Cmd"]) == (["A=1"], ["sh", "-c", "true"])

    def test_a_compose_file_as_compose_sends_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("TAG", "1.2")
        (tmp_path / "compose.yaml").write_text(
            "services:\n"
            "  web:\n"
            "    image: bb:${TAG}\n"
            f"    devices: [{GPU0}, /dev/null]\n"
            "    volumes: [./data:/data, cache:/cache]\n"
            "    ports: ['8080:80']\n"
            "    deploy:\n"
            "      resources:\n"
            "        reservations:\n"
            "          devices: [{driver: nvidia, count: all, capabilities: [gpu]}]\n"
            "volumes:\n"
            "  cache:\n"
            "    driver_opts: {type: none, o: bind, device: /dev}\n"
        )
        volume, web = from_compose(tmp_path / "compose.yaml")
        assert volume.target == "/v1.45/volumes/create"
        assert volume.body["Name"] == f"{tmp_path.name.lower()}_cache"
        assert volume.body["DriverOpts"] == {"type": "none", "o": "bind", "device": "/dev"}
        host = web.body["HostConfig"]
        assert web.body["Image"] == "bb:1.2"
        assert host["Devices"] == [
            {"PathOnHost": "/dev/null", "PathInContainer": "/dev/null", "CgroupPermissions": "rwm"}
        ]
        assert host["DeviceRequests"][-1] == {"Driver": "cdi", "DeviceIDs": [GPU0]}
        assert host["DeviceRequests"][0]["Driver"] == "nvidia"
        assert host["Binds"] == [f"{tmp_path}/data:/data"]
        assert host["Mounts"][0]["Source"] == f"{tmp_path.name.lower()}_cache"
        assert host["NetworkMode"] == f"{tmp_path.name.lower()}_default"


class TestComposeFiles:
    def test_every_request_of_the_file_is_decided(self, box: Machine, tmp_path: Path) -> None:
        assert rdc("repo", "gpu", "grant", "alpha@box", "--device", GPU0).exit_code == 0
        compose = tmp_path / "compose.yaml"
        compose.write_text(
            "services:\n"
            f"  train: {{image: bb, devices: ['{GPU0}']}}\n"
            "  bad: {image: bb, privileged: true}\n"
            "volumes:\n"
            "  devvol: {driver_opts: {type: none, o: bind, device: /dev}}\n"
        )
        result = rdc("repo", "check", "alpha@box", str(compose))
        assert result.exit_code == EXIT_REFUSED, result.output
        lines = result.stdout.splitlines()
        assert "volume devvol: refused" in lines and "service train: admitted" in lines
        assert "service bad: refused" in lines
        assert "would refuse 2 of 3 requests" in result.stderr

    def test_docker_compose_lines_read_their_file(self, box: Machine, tmp_path: Path) -> None:
        compose = tmp_path / "c.yml"
        compose.write_text("services:\n  one: {image: bb}\n")
        result = rdc("repo", "check", "alpha@box", "--", "docker", "compose", "-f", str(compose), "up", "-d")
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == "service one: admitted"

    def test_an_unknown_key_is_an_error(self, box: Machine, tmp_path: Path) -> None:
        compose = tmp_path / "compose.yaml"
        compose.write_text("services:\n  one: {image: bb, frobnicate: 1}\n")
        result = rdc("repo", "check", "alpha@box", str(compose))
        assert result.exit_code == EXIT_VALIDATION and "'frobnicate' (service one)" in result.stderr

    def test_a_missing_file_says_so(self, box: Machine, tmp_path: Path) -> None:
        result = rdc("repo", "check", "alpha@box", str(tmp_path / "nope.yaml"))
        assert result.exit_code == EXIT_VALIDATION and "cannot read the Compose file" in result.stderr
