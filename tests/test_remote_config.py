"""SSH machines in the config file, their addresses, and which commands are forwarded to them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rediacc_core.cli import cli
from rediacc_core.commands import FORWARDED
from rediacc_core.config import Config
from rediacc_core.errors import NotFoundError, StateError, ValidationError
from rediacc_core.remote.address import SshAddress
from rediacc_core.remote.dispatch import Target, command_target, fast_target, parse_target
from rediacc_core.repos import resolve_ref


@pytest.mark.parametrize(
    ("text", "user", "host", "port"),
    [
        ("gpu1", None, "gpu1", None),
        ("root@gpu1.example.com", "root", "gpu1.example.com", None),
        ("ops@10.0.0.5:2222", "ops", "10.0.0.5", 2222),
        ("root@[::1]:22", "root", "::1", 22),
    ],
)
def test_an_address_is_user_at_host_colon_port_and_prints_back_the_same(
    text: str, user: str | None, host: str, port: int | None
) -> None:
    address = SshAddress.parse(text)
    assert (address.user, address.host, address.port) == (user, host, port)
    assert str(address) == text


@pytest.mark.parametrize("text", ["", "root@", "a b", "host:0", "host:70000", "-oProxyCommand=x", "u@h:p"])
def test_a_malformed_address_is_refused_with_the_form_to_use(text: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SshAddress.parse(text)
    assert "[USER@]HOST[:PORT]" in caught.value.todo


def test_an_ssh_machine_is_saved_with_its_address_identity_and_root(rdc_config: Path) -> None:
    config = Config.load()
    config.add_ssh("gpu1", SshAddress.parse("root@gpu1:2222", "/keys/id"), "/srv/sim")
    config.add_ssh("gpu2", SshAddress.parse("gpu2"))
    config.save()
    saved = yaml.safe_load(rdc_config.read_text())["machines"]
    assert saved == {
        "gpu1": {"ssh": "root@gpu1:2222", "identity": "/keys/id", "root": "/srv/sim"},
        "gpu2": {"ssh": "gpu2"},
    }
    gpu1, gpu2 = Config.load().machine("gpu1"), Config.load().machine("gpu2")
    assert gpu1.remote == SshAddress("gpu1", "root", 2222, "/keys/id") and gpu1.root == Path("/srv/sim")
    assert gpu2.root == Path("/")


def test_an_ssh_machine_root_must_be_absolute(rdc_config: Path) -> None:
    with pytest.raises(ValidationError):
        Config.load().add_ssh("gpu1", SshAddress.parse("gpu1"), "relative/dir")


def test_a_bad_ssh_entry_in_the_file_is_refused(rdc_config: Path) -> None:
    rdc_config.write_text("machines:\n  gpu1:\n    ssh: 'not an address'\n")
    with pytest.raises(ValidationError, match="gpu1"):
        Config.load()


def test_an_ssh_machine_has_no_paths_on_this_host(rdc_config: Path) -> None:
    config = Config.load()
    machine = config.add_ssh("gpu1", SshAddress.parse("gpu1"))
    with pytest.raises(StateError, match="reached over SSH"):
        machine.path("/etc/rediacc")


def test_a_repo_without_machine_is_looked_up_on_local_machines_only(rdc_config: Path) -> None:
    config = Config.load()
    config.add_ssh("gpu1", SshAddress.parse("gpu1"))
    config.save()
    with pytest.raises(NotFoundError) as caught:
        resolve_ref("alpha", Config.load())  # gpu1's files are never looked for here
    assert "local machine" in caught.value.what and "alpha@<machine>" in caught.value.todo


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["machine", "setup", "gpu1", "--dry-run"], "gpu1"),
        (["machine", "gpu", "list", "gpu1", "-o", "json"], "gpu1"),
        (["machine", "config", "gpu1", "--set", "a=b"], "gpu1"),
        (["repo", "list", "gpu1"], "gpu1"),
        (["repo", "gpu", "grant", "a:t@gpu1", "--device", "x=0"], "gpu1"),
        (["repo", "up", "a@gpu1"], "gpu1"),
        (["repo", "create", "a@gpu1"], "gpu1"),
        (["repo", "gpu", "list", "a"], None),  # no machine named: resolved here
        (["machine", "add", "gpu1", "--ssh", "h"], None),  # acts on this host's config
        (["machine", "remove", "gpu1"], None),
        (["machine", "trust", "gpu1"], None),
        (["machine", "gpu", "list", "gpu1", "--help"], None),
        (["nonsense", "gpu1"], None),
    ],
)
def test_the_target_machine_is_found_the_way_click_parses_the_line(
    argv: list[str], target: str | None
) -> None:
    assert command_target(argv, cli) == target


@pytest.mark.parametrize("path", sorted(FORWARDED))
def test_the_shortcut_finds_the_same_target_as_clicks_parse(path: tuple[str, ...]) -> None:
    """`fast_target` (no CLI import) and `parse_target` (click) agree on every forwarded command."""
    first = "gpu1" if FORWARDED[path] == "machine" else "alpha:v1@gpu1"
    extra = (
        ["--device", "x=0"]
        if path[-1] in ("grant", "revoke")
        else ["--tag", "t"]
        if path[-1] == "fork"
        else []
    )
    argv = [*path, first, *extra]
    assert fast_target(argv) == parse_target(argv, cli)
    assert command_target(argv, cli) == "gpu1"


def test_the_shortcut_leaves_other_shapes_to_click() -> None:
    assert fast_target(["machine", "gpu", "list", "-o", "json", "gpu1"]) is None
    assert parse_target(["machine", "gpu", "list", "-o", "json", "gpu1"], cli) == Target(
        ("machine", "gpu", "list"), "gpu1"
    )
    assert fast_target(["repo", "gpu", "grant", "alpha", "--device", "x=0"]) == Target(
        ("repo", "gpu", "grant"), None, "alpha"
    )


def test_the_protocol_compares_the_versions_of_every_plugin_group() -> None:
    from rediacc_core.demo import ENTRY_POINT_GROUP as DEMO_GROUP
    from rediacc_core.plugins import ENTRY_POINT_GROUP
    from rediacc_core.remote.protocol import PLUGIN_GROUPS

    assert PLUGIN_GROUPS == (ENTRY_POINT_GROUP, DEMO_GROUP)
