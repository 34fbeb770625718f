"""`rdc repo check`: a Compose file or a docker run line decided offline by the gate's own decider,
against the repo's grants and the machine's settings; exit 4 when anything would be refused."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from check_corpus import COMMON_FILES, CORPUS, Case
from click.testing import CliRunner, Result
from grants_kit import GPU, registered_box
from run_cases import REFUSED_RUNS, case_id

from rediacc_core.cli import cli
from rediacc_core.cli.check_compose import compose_version, from_compose, model_of, parse_compose
from rediacc_core.cli.check_docker import from_docker
from rediacc_core.cli.compose_bodies import from_model
from rediacc_core.errors import EXIT_REFUSED, EXIT_VALIDATION, ValidationError
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore, files_dir
from rediacc_core.settings import set_setting
from rediacc_core.testing import FakeMachine

GPU0, GPU1 = f"{GPU}=0", f"{GPU}=1"


def _compose_missing() -> str | None:
    try:
        compose_version()
    except ValidationError as exc:
        return str(exc)
    return None


# The check reads a project through the installed Compose, as `docker compose up` would.
needs_compose = pytest.mark.skipif(_compose_missing() is not None, reason=str(_compose_missing()))


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


@needs_compose
class TestComposeFiles:
    def test_every_request_of_the_file_is_decided(self, box: Machine, tmp_path: Path) -> None:
        assert rdc("repo", "gpu", "grant", "alpha@box", "--device", GPU0).exit_code == 0
        compose = tmp_path / "compose.yaml"
        compose.write_text(
            "services:\n"
            f"  train: {{image: bb, devices: ['{GPU0}']}}\n"
            "  bad: {image: bb, privileged: true, volumes: ['devvol:/d']}\n"
            "volumes:\n"
            "  devvol: {driver_opts: {type: none, o: bind, device: /dev}}\n"
        )
        result = rdc("repo", "check", "alpha@box", str(compose))
        assert result.exit_code == EXIT_REFUSED, result.output
        lines = result.stdout.splitlines()
        assert "volume devvol: refused" in lines and "service train: admitted" in lines
        assert "service bad: refused" in lines
        assert "would refuse 2 of 4 requests" in result.stderr  # and the default network

    def test_docker_compose_lines_read_their_file(self, box: Machine, tmp_path: Path) -> None:
        compose = tmp_path / "c.yml"
        compose.write_text("services:\n  one: {image: bb}\n")
        result = rdc("repo", "check", "alpha@box", "--", "docker", "compose", "-f", str(compose), "up", "-d")
        assert result.exit_code == 0, result.output
        assert result.stdout.split() == ["network", "default:", "admitted", "service", "one:", "admitted"]

    def test_an_unknown_key_is_an_error(self, box: Machine, tmp_path: Path) -> None:
        compose = tmp_path / "compose.yaml"
        compose.write_text("services:\n  one: {image: bb, frobnicate: 1}\n")
        result = rdc("repo", "check", "alpha@box", str(compose))
        # Compose refuses the key first: its words are shown.
        assert result.exit_code == EXIT_VALIDATION and "frobnicate" in result.stderr

    def test_a_missing_file_says_so(self, box: Machine, tmp_path: Path) -> None:
        result = rdc("repo", "check", "alpha@box", str(tmp_path / "nope.yaml"))
        assert result.exit_code == EXIT_VALIDATION and "cannot read the Compose file" in result.stderr


def _bodies(line_words: list[str], version: tuple[int, int] | None = None) -> dict[str, dict[str, Any]]:
    """Each request's body by what it is, for `docker compose LINE_WORDS` run here."""
    line = parse_compose(line_words)
    if version is None:
        requests, _ = from_compose(line)
    else:
        requests, _ = from_model(model_of(line), version)
    return {r.what: r.body for r in requests}


def _host(body: dict[str, Any]) -> dict[str, Any]:
    host: dict[str, Any] = body["HostConfig"]
    return host


@needs_compose
class TestWhatComposeReads:
    """Each is read as the installed Compose reads it (`docker compose config`), not guessed."""

    def test_the_override_file_beside_a_default_file_is_merged(self, box: Machine, tmp_path: Path) -> None:
        (tmp_path / "compose.yaml").write_text("services:\n  web: {image: bb}\n")
        (tmp_path / "compose.override.yaml").write_text("services:\n  web: {privileged: true}\n")
        result = rdc("repo", "check", "alpha@box", str(tmp_path / "compose.yaml"))
        assert result.exit_code == EXIT_REFUSED, result.output
        assert "service web: refused" in result.stdout and "[privileged]" in result.stdout

    def test_a_compose_line_in_a_directory_reads_its_override(
        self, box: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "compose.yaml").write_text("services:\n  web: {image: bb}\n")
        (tmp_path / "compose.override.yaml").write_text("services:\n  web: {pid: host}\n")
        monkeypatch.chdir(tmp_path)
        result = rdc("repo", "check", "alpha@box", "--", "docker", "compose", "up", "-d")
        assert result.exit_code == EXIT_REFUSED, result.output
        assert "[namespace]" in result.stdout

    def test_include_and_extends_bring_their_services(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "compose.yaml").write_text(
            "include: [inc.yaml]\nservices:\n  web: {image: bb, extends: {file: base.yaml, service: base}}\n"
        )
        (tmp_path / "inc.yaml").write_text("services:\n  side: {image: bb, network_mode: host}\n")
        (tmp_path / "base.yaml").write_text("services:\n  base: {image: bb, ipc: host}\n")
        monkeypatch.chdir(tmp_path)
        bodies = _bodies(["up"])
        assert _host(bodies["service side"])["NetworkMode"] == "host"
        assert _host(bodies["service web"])["IpcMode"] == "host"

    @pytest.mark.parametrize("form", ["[vars.env]", "[{path: vars.env, required: true}]"])
    def test_env_files_in_both_forms_are_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
    ) -> None:
        (tmp_path / "compose.yaml").write_text(f"services:\n  web: {{image: bb, env_file: {form}}}\n")
        (tmp_path / "vars.env").write_text("NVIDIA_VISIBLE_DEVICES=all\n")
        monkeypatch.chdir(tmp_path)
        assert _bodies(["up"])["service web"]["Env"] == ["NVIDIA_VISIBLE_DEVICES=all"]

    def test_env_file_option_and_f_are_read_not_the_directorys_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "compose.yaml").write_text("services:\n  harmless: {image: bb}\n")
        (tmp_path / "evil.yaml").write_text("services:\n  evil: {image: bb, pid: '${MODE}'}\n")
        (tmp_path / "x.env").write_text("MODE=host\n")
        monkeypatch.chdir(tmp_path)
        bodies = _bodies(["--env-file", "x.env", "-f", "evil.yaml", "up"])
        assert list(bodies) == ["network default", "service evil"]
        assert _host(bodies["service evil"])["PidMode"] == "host"

    def test_nested_defaults_are_interpolated(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        (tmp_path / "compose.yaml").write_text(
            "services:\n  web: {image: bb, ports: ['${P:-${Q:-80}}:80']}\n"
        )
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("P", raising=False)
        monkeypatch.delenv("Q", raising=False)
        bindings = _host(_bodies(["up"])["service web"])["PortBindings"]
        assert bindings == {"80/tcp": [{"HostIp": "", "HostPort": "80"}]}

    def test_secret_and_config_files_are_read_only_binds_of_the_files(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "compose.yaml").write_text(
            "services:\n  web: {image: bb, secrets: [s], configs: [{source: c, target: /etc/c}]}\n"
            "secrets:\n  s: {file: /dev/null}\nconfigs:\n  c: {file: ./c.txt}\n"
        )
        (tmp_path / "c.txt").write_text("c")
        monkeypatch.chdir(tmp_path)
        mounts = _host(_bodies(["up"])["service web"])["Mounts"]
        assert {"Type": "bind", "Source": "/dev/null", "Target": "/run/secrets/s", "ReadOnly": True} in mounts
        assert {
            "Type": "bind",
            "Source": str(tmp_path / "c.txt"),
            "Target": "/etc/c",
            "ReadOnly": True,
        } in mounts

    def test_a_secret_of_a_device_is_refused(self, box: Machine, tmp_path: Path) -> None:
        (tmp_path / "compose.yaml").write_text(
            "services:\n  web: {image: bb, secrets: [s]}\nsecrets:\n  s: {file: /dev/fakegpu0}\n"
        )
        result = rdc("repo", "check", "alpha@box", str(tmp_path / "compose.yaml"))
        assert result.exit_code == EXIT_REFUSED, result.output
        assert "service web: refused" in result.stdout and "/dev/fakegpu0" in result.stdout

    def test_a_build_on_the_hosts_network_is_refused(self, box: Machine, tmp_path: Path) -> None:
        (tmp_path / "compose.yaml").write_text("services:\n  web: {build: {context: ., network: host}}\n")
        result = rdc("repo", "check", "alpha@box", str(tmp_path / "compose.yaml"))
        assert result.exit_code == EXIT_REFUSED, result.output
        assert "build web: refused" in result.stdout
        # As the gate judges buildx's solve request: its entitlement and its network attribute.
        assert "[build-option] SolveRequest.Entitlements 'network.host'" in result.stdout
        assert "[namespace] SolveRequest frontend attribute force-network-mode=host" in result.stdout
        nobuild = rdc(
            "repo",
            "check",
            "alpha@box",
            "--",
            "docker",
            "compose",
            "-f",
            str(tmp_path / "compose.yaml"),
            "up",
            "--no-build",
        )
        assert "build web" not in nobuild.stdout

    def test_a_service_of_an_inactive_profile_is_not_created(self, box: Machine, tmp_path: Path) -> None:
        (tmp_path / "compose.yaml").write_text(
            "services:\n  web: {image: bb}\n  debug: {image: bb, privileged: true, profiles: [dbg]}\n"
        )
        quiet = rdc("repo", "check", "alpha@box", str(tmp_path / "compose.yaml"))
        assert quiet.exit_code == 0, quiet.output
        assert "service debug" not in quiet.stdout
        line = ["--", "docker", "compose", "-f", str(tmp_path / "compose.yaml"), "--profile", "dbg", "up"]
        loud = rdc("repo", "check", "alpha@box", *line)
        assert loud.exit_code == EXIT_REFUSED and "service debug: refused" in loud.stdout

    def test_gpus_is_sent_by_compose_2_30_and_later_only(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "compose.yaml").write_text("services:\n  web: {image: bb, gpus: all}\n")
        monkeypatch.chdir(tmp_path)
        assert "DeviceRequests" not in _host(_bodies(["up"], (2, 26))["service web"])
        [request] = _host(_bodies(["up"], (2, 40))["service web"])["DeviceRequests"]
        assert (request["Count"], request["Capabilities"]) == (-1, [["gpu"]])

    def test_a_dropped_gpus_is_said(self, box: Machine, tmp_path: Path) -> None:
        (tmp_path / "compose.yaml").write_text("services:\n  web: {image: bb, gpus: all}\n")
        result = rdc("repo", "check", "alpha@box", str(tmp_path / "compose.yaml"))
        major, minor = compose_version()
        assert (
            f"Read by Compose {major}.{minor} as: docker compose -f {tmp_path}/compose.yaml up"
            in result.stderr
        )
        if compose_version() < (2, 30):
            assert result.exit_code == 0 and "drops service web: gpus" in result.stderr
        else:
            assert result.exit_code == EXIT_REFUSED, result.output

    def test_an_unknown_compose_option_is_an_error(self, box: Machine, tmp_path: Path) -> None:
        result = rdc("repo", "check", "alpha@box", "--", "docker", "compose", "--frob", "up")
        assert result.exit_code == EXIT_VALIDATION and "option --frob" in result.stderr
        result = rdc("repo", "check", "alpha@box", "--", "docker", "compose", "up", "--frob")
        assert result.exit_code == EXIT_VALIDATION and "up option --frob" in result.stderr
        result = rdc("repo", "check", "alpha@box", "--", "docker", "compose", "down")
        assert result.exit_code == EXIT_VALIDATION and "not docker compose down" in result.stderr


def test_without_compose_a_project_is_not_guessed(
    box: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "compose.yaml").write_text("services:\n  web: {image: bb}\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker here
    result = rdc("repo", "check", "alpha@box", str(tmp_path / "compose.yaml"))
    assert result.exit_code == EXIT_VALIDATION
    assert "no docker compose is installed here" in result.stderr
    assert "install the Docker Compose plugin" in result.stderr


class TestDockerForms:
    def test_publish_in_its_long_form(self, box: Machine) -> None:
        [request] = from_docker(["docker", "run", "--publish", "published=80,target=80", "bb"])
        assert _host(request.body)["PortBindings"] == {"80/tcp": [{"HostIp": "", "HostPort": "80"}]}
        assert check_run("--publish", "published=80,target=80").exit_code == EXIT_REFUSED
        unknown = check_run("--publish", "published=80,target=80,frob=1")
        assert unknown.exit_code == EXIT_VALIDATION and "--publish key 'frob'" in unknown.stderr

    def test_an_unknown_gpus_item_or_mount_key_is_an_error(self, box: Machine) -> None:
        for option, value, said in (
            ("--gpus", "frob", "--gpus item"),
            ("--mount", "type=bind,frob=1", "--mount key"),
        ):
            result = check_run(option, value)
            assert result.exit_code == EXIT_VALIDATION and said in result.stderr, result.output

    def test_only_docker_is_understood(self, box: Machine) -> None:
        result = rdc("repo", "check", "alpha@box", "--", "podman", "run", "bb")
        assert result.exit_code == EXIT_VALIDATION
        assert "reads docker and docker compose command lines only, not podman" in result.stderr


@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.name)
def test_every_case_of_the_live_corpus_is_read(
    box: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    # tests/e2e/test_e2e_check_corpus.py holds each answer to the live gate's; here, each is read.
    if case.words[0] == "compose" and _compose_missing():
        pytest.skip(str(_compose_missing()))
    files = files_dir(box, RepoStore(box).get_by_label("alpha").id)
    for name, text in {**COMMON_FILES, **dict(case.files)}.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    words = [w.replace("{files}", str(files)).replace("{dir}", str(tmp_path)) for w in case.words]
    result = rdc("repo", "check", "alpha@box", "-o", "json", "--", "docker", *words)
    assert result.exit_code in (0, EXIT_REFUSED), result.output
