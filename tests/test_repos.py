"""Repos: an identity separate from the name, references `name[:tag][@machine]`, a file that is never lost."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from rediacc_core.config import Config
from rediacc_core.errors import (
    EXIT_AMBIGUOUS,
    EXIT_NOT_FOUND,
    EXIT_STATE,
    EXIT_VALIDATION,
    AmbiguousError,
    NotFoundError,
    StateError,
    ValidationError,
)
from rediacc_core.files import schema_errors
from rediacc_core.grants.records import delete_repo
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoRef, RepoStore, files_dir, make_state_dirs, repo_state_dir, resolve_ref
from rediacc_core.testing import FakeMachine


@pytest.fixture
def machine(fake_machine: FakeMachine) -> Machine:
    return fake_machine.machine


def test_a_new_repo_gets_a_random_identity_separate_from_its_name(machine: Machine) -> None:
    repo = RepoStore(machine).create("alpha")
    assert uuid.UUID(repo.id).version == 4
    assert (repo.name, repo.tag, repo.label, repo.ref) == ("alpha", None, "alpha", "alpha@fake")
    assert RepoStore(machine).get_by_label("alpha") == repo
    assert RepoStore(machine).by_id(repo.id) == repo


def test_the_repos_file_matches_its_shipped_schema(machine: Machine) -> None:
    RepoStore(machine).create("alpha", docker_host="unix:///run/other/docker.sock")
    RepoStore(machine).create("alpha", "v2")
    document = json.loads(machine.repos_path.read_text())
    assert schema_errors(document, "repos.schema.json") == []
    assert [(r["name"], r["tag"], r["dockerHost"]) for r in document["repos"]] == [
        ("alpha", None, "unix:///run/other/docker.sock"),
        ("alpha", "v2", None),
    ]


def test_a_name_already_taken_on_the_machine_is_refused(machine: Machine) -> None:
    RepoStore(machine).create("alpha")
    with pytest.raises(StateError, match="already exists") as caught:
        RepoStore(machine).create("alpha")
    assert caught.value.exit_code == EXIT_STATE


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "a@b", "a:b", "x" * 64])
def test_bad_names_are_refused_before_anything_is_written(machine: Machine, name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RepoStore(machine).create(name)
    assert caught.value.exit_code == EXIT_VALIDATION
    assert not machine.repos_path.exists()


def test_a_docker_host_must_be_a_unix_socket_url(machine: Machine) -> None:
    with pytest.raises(ValidationError, match="unix socket"):
        RepoStore(machine).create("alpha", docker_host="tcp://10.0.0.1:2375")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("alpha", RepoRef("alpha")),
        ("alpha:v2", RepoRef("alpha", "v2")),
        ("alpha@lab", RepoRef("alpha", None, "lab")),
        ("alpha:v2@lab", RepoRef("alpha", "v2", "lab")),
    ],
)
def test_references_are_name_tag_and_machine(text: str, expected: RepoRef) -> None:
    assert RepoRef.parse(text) == expected
    assert str(RepoRef.parse(text)) == text


@pytest.mark.parametrize("text", ["", "@lab", "alpha@", "alpha:@lab", "a@b@c", "a:b:c", "al pha"])
def test_malformed_references_are_validation_errors(text: str) -> None:
    with pytest.raises(ValidationError):
        RepoRef.parse(text)


def test_a_fork_is_a_new_identity_under_name_and_tag(machine: Machine) -> None:
    store = RepoStore(machine)
    origin = store.create("alpha", docker_host="unix:///run/x.sock")
    fork = store.fork(origin, "exp")
    assert fork.label == "alpha:exp" and fork.id != origin.id
    assert fork.docker_host is None  # a fork runs its own daemon, never the origin's
    assert [r.label for r in store.list()] == ["alpha", "alpha:exp"]


def test_deleting_and_re_creating_gives_a_new_identity(machine: Machine) -> None:
    store = RepoStore(machine)
    first = store.create("alpha")
    delete_repo(machine, first)
    assert store.list() == []
    with pytest.raises(NotFoundError):
        store.by_id(first.id)
    again = store.create("alpha")
    assert again.id != first.id


def test_deleting_a_repo_twice_is_not_found(machine: Machine) -> None:
    store = RepoStore(machine)
    repo = store.create("alpha")
    delete_repo(machine, repo)
    with pytest.raises(NotFoundError) as caught:
        delete_repo(machine, repo)
    assert caught.value.exit_code == EXIT_NOT_FOUND


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"schemaVersion": 1, "repos": [{"id": "x", "name": "a"}]}),
        json.dumps({"schemaVersion": 2, "repos": []}),
    ],
)
def test_a_corrupt_repos_file_is_an_error_naming_it_and_is_left_alone(machine: Machine, content: str) -> None:
    machine.repos_path.parent.mkdir(parents=True, exist_ok=True)
    machine.repos_path.write_text(content)
    with pytest.raises(ValidationError) as caught:
        RepoStore(machine).list()
    assert str(machine.repos_path) in caught.value.what
    with pytest.raises(ValidationError):
        RepoStore(machine).create("alpha")
    assert machine.repos_path.read_text() == content


def test_a_repos_file_naming_one_repo_twice_is_corrupt(machine: Machine) -> None:
    store = RepoStore(machine)
    store.create("alpha")
    document = json.loads(machine.repos_path.read_text())
    document["repos"].append(dict(document["repos"][0], id=str(uuid.uuid4())))
    machine.repos_path.write_text(json.dumps(document))
    with pytest.raises(ValidationError, match="more than once"):
        store.list()


# --- resolving references across configured machines ------------------------------------------------


@pytest.fixture
def two_machines(
    rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]
) -> tuple[Config, Machine, Machine]:
    config = Config.load()
    one = config.add("one", make_fake_machine("one").root)
    two = config.add("two", make_fake_machine("two").root)
    config.save()
    return Config.load(), one, two


def test_machine_may_be_left_out_when_the_name_is_unique(
    two_machines: tuple[Config, Machine, Machine],
) -> None:
    config, one, two = two_machines
    RepoStore(one).create("alpha")
    beta = RepoStore(two).create("beta")
    machine, repo = resolve_ref("beta", config)
    assert (machine.name, repo) == ("two", beta)


def test_a_name_on_several_machines_is_ambiguous_and_lists_the_candidates(
    two_machines: tuple[Config, Machine, Machine],
) -> None:
    config, one, two = two_machines
    RepoStore(one).create("alpha")
    RepoStore(two).create("alpha")
    with pytest.raises(AmbiguousError) as caught:
        resolve_ref("alpha", config)
    assert caught.value.exit_code == EXIT_AMBIGUOUS
    assert "alpha@one" in caught.value.what and "alpha@two" in caught.value.what
    assert resolve_ref("alpha@two", config)[0].name == "two"


def test_unknown_repos_and_machines_are_not_found(two_machines: tuple[Config, Machine, Machine]) -> None:
    config, one, _ = two_machines
    RepoStore(one).create("alpha")
    for ref in ("ghost", "ghost@one", "alpha@nowhere", "alpha:v9"):
        with pytest.raises(NotFoundError) as caught:
            resolve_ref(ref, config)
        assert caught.value.exit_code == EXIT_NOT_FOUND


def test_a_new_repo_has_its_state_directory_and_the_repos_directory_private_to_root(
    fake_machine: FakeMachine,
) -> None:
    repo = RepoStore(fake_machine.machine).create("alpha")
    state = repo_state_dir(fake_machine.machine, repo.id)
    assert files_dir(fake_machine.machine, repo.id).is_dir()
    assert [oct(p.stat().st_mode & 0o777) for p in (state.parent, state)] == ["0o700", "0o700"]


def test_modes_of_a_repo_made_before_are_fixed_and_fixing_again_changes_nothing(
    fake_machine: FakeMachine,
) -> None:
    state = repo_state_dir(fake_machine.machine, "r1")
    (state / "files").mkdir(parents=True)
    state.chmod(0o755)
    state.parent.chmod(0o711)
    assert make_state_dirs(fake_machine.machine, "r1") == state / "files"
    assert make_state_dirs(fake_machine.machine, "r1") == state / "files"
    assert [oct(p.stat().st_mode & 0o777) for p in (state.parent, state)] == ["0o700", "0o700"]
