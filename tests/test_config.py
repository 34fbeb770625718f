"""The config file: machines and their roots; `localhost` always exists. Settings live on the machine."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from rediacc_core.config import CONFIG_ENV, Config, default_path
from rediacc_core.errors import EXIT_NOT_FOUND, NotFoundError, StateError, ValidationError


def test_the_config_file_comes_from_the_environment_else_the_home_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "c.yaml"))
    assert default_path() == tmp_path / "c.yaml"
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_path() == tmp_path / ".config" / "rediacc" / "config.yaml"


def test_without_a_file_only_localhost_exists_with_root_slash(rdc_config: Path) -> None:
    (machine,) = Config.load().machines()

    assert machine.name == "localhost" and machine.root == Path("/")
    assert not rdc_config.exists()


def test_added_machines_are_saved_and_read_back(rdc_config: Path, tmp_path: Path) -> None:
    config = Config.load()
    config.add("lab-1", tmp_path)
    config.save()

    again = Config.load()
    assert [m.name for m in again.machines()] == ["localhost", "lab-1"]
    assert again.machine("lab-1").root == tmp_path
    assert yaml.safe_load(rdc_config.read_text()) == {"machines": {"lab-1": {"root": str(tmp_path)}}}
    # The file says where machines are: only its owner may change it.
    assert stat.S_IMODE(rdc_config.stat().st_mode) == 0o600


def test_a_relative_root_is_stored_absolute(
    rdc_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sim").mkdir()
    monkeypatch.chdir(tmp_path)

    assert Config.load().add("sim", Path("sim")).root == tmp_path / "sim"


@pytest.mark.parametrize("name", ["", "a b", "x@y", "name:tag", "-lead", "ä"])
def test_machine_names_that_would_break_repo_references_are_refused(
    rdc_config: Path, tmp_path: Path, name: str
) -> None:
    with pytest.raises(ValidationError, match="invalid machine name"):
        Config.load().add(name, tmp_path)


def test_adding_a_name_twice_or_localhost_is_refused(rdc_config: Path, tmp_path: Path) -> None:
    config = Config.load()
    config.add("m", tmp_path)

    for name in ("m", "localhost"):
        with pytest.raises(StateError, match="already exists") as caught:
            config.add(name, tmp_path)
        assert "rdc machine remove" in caught.value.todo


def test_a_root_that_is_not_a_directory_is_refused(rdc_config: Path, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="is not a directory") as caught:
        Config.load().add("m", tmp_path / "missing")
    assert "mkdir -p" in caught.value.todo


def test_an_unknown_machine_is_not_found_with_the_list_command_as_next_step(rdc_config: Path) -> None:
    with pytest.raises(NotFoundError) as caught:
        Config.load().machine("ghost")

    assert caught.value.exit_code == EXIT_NOT_FOUND
    assert "rdc machine list" in caught.value.todo


def test_remove_forgets_a_machine_but_never_localhost(rdc_config: Path, tmp_path: Path) -> None:
    config = Config.load()
    config.add("m", tmp_path)
    config.remove("m")
    assert not config.has("m")

    with pytest.raises(ValidationError, match="localhost always exists"):
        config.remove("localhost")
    with pytest.raises(NotFoundError):
        config.remove("m")


def test_settings_an_older_rdc_kept_here_are_kept_but_have_no_effect(rdc_config: Path) -> None:
    text = (
        "machines:\n"
        "  localhost: {settings: {legacy-visible-devices: translate}}\n"
        "  lab: {root: /srv/lab, settings: {legacy-visible-devices: translate}}\n"
    )
    rdc_config.write_text(text)

    config = Config.load()
    # Nothing recorded is lost: the CLI shows them and how to move them onto the machine.
    assert config.old_settings("lab") == {"legacy-visible-devices": "translate"}
    assert config.old_settings("localhost") == {"legacy-visible-devices": "translate"}
    assert config.machine("lab", present=False).root == Path("/srv/lab")
    config.save()
    assert yaml.safe_load(rdc_config.read_text()) == yaml.safe_load(text)

    assert config.forget_old_settings("lab") == {"legacy-visible-devices": "translate"}
    assert config.forget_old_settings("localhost") == {"legacy-visible-devices": "translate"}
    config.save()
    assert yaml.safe_load(rdc_config.read_text()) == {"machines": {"lab": {"root": "/srv/lab"}}}
    assert Config.load().old_settings("lab") == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("machines: [unclosed", "is not valid YAML"),
        ("- a list\n", "top level must be a mapping"),
        ("machinez: {}\n", "unknown top-level keys: machinez"),
        ("machines:\n  m: {root: relative/path}\n", "needs an absolute `root`"),
        ("machines:\n  m: {root: /x, rooot: /y}\n", "unknown keys: rooot"),
        ("machines:\n  m: {root: /x, settings: [a, b]}\n", "`settings` must be a mapping"),
        ("machines:\n  localhost: {root: /elsewhere}\n", "localhost's root is always /"),
    ],
)
def test_a_broken_config_file_is_an_error_naming_it_and_nothing_changes(
    rdc_config: Path, text: str, expected: str
) -> None:
    rdc_config.write_text(text)

    with pytest.raises(ValidationError) as caught:
        Config.load()

    assert expected in caught.value.what and str(rdc_config) in caught.value.what
    assert rdc_config.read_text() == text


def test_an_empty_file_is_an_empty_config(rdc_config: Path) -> None:
    rdc_config.write_text("")

    assert [m.name for m in Config.load().machines()] == ["localhost"]
